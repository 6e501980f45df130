"""Training image URIs: image_uri wins, else Shoal's image from the matrix."""

import pytest
from shoal.errors import ImageError
from shoal.image_uris import local_image_name, processor_for, training_image_uri


@pytest.mark.parametrize("instance_type, processor", [
    ("ml.p4d.24xlarge", "gpu"), ("ml.p3.2xlarge", "gpu"), ("ml.g5.xlarge", "gpu"),
    ("ml.g4dn.12xlarge", "gpu"), ("ml.c5.xlarge", "cpu"), ("ml.m5.large", "cpu"),
    ("ml.trn1.32xlarge", "cpu"), ("local", "cpu"), ("local_gpu", "gpu"), (None, "cpu"),
])
def test_processor_for(instance_type, processor):
    assert processor_for(instance_type) == processor


def test_shoal_image_in_the_users_account_and_region():
    uri = training_image_uri("tensorflow", "2.11", "py39", "ml.p3.16xlarge",
                             account="123456789012", region="cn-north-1")
    assert uri == ("123456789012.dkr.ecr.cn-north-1.amazonaws.com.cn/"
                   "shoal-tensorflow-training:2.11.0-gpu-py39")


def test_image_uri_wins_without_asking_for_the_account():
    def account():
        raise AssertionError("account looked up")

    assert training_image_uri("pytorch", "9.9", None, "ml.c5.xlarge", image_uri="my:img",
                              account=account, region="us-west-2") == "my:img"


def test_local_mode_uses_the_local_tag():
    assert training_image_uri("pytorch", "1.12.1", None, "local_gpu", account=None,
                              region="us-east-1") == "shoal-pytorch-training:1.12.1-gpu-py38"
    assert local_image_name("tensorflow", "2.10", None, "local") == \
        "shoal-tensorflow-training:2.10.1-cpu-py39"


def test_unknown_version_lists_the_supported_ones():
    with pytest.raises(ImageError, match=r"no Shoal image for tensorflow 1\.15; supported: "
                                         r"2\.4\.1 \(py37\), 2\.4\.3 \(py37\), .* "
                                         r"2\.14\.1 \(py310\) \(or pass image_uri=\)"):
        training_image_uri("tensorflow", "1.15", None, "ml.c5.xlarge", account="1",
                           region="us-west-2")
    with pytest.raises(ImageError, match="image_uri is required"):
        training_image_uri(None, None, None, "ml.c5.xlarge", account="1", region="us-west-2")


def test_the_readmes_version_table_is_the_matrixs():
    """The README's table is generated from the matrix and the version rules, never edited."""
    from pathlib import Path

    from shoal.image_uris import version_table

    readme = (Path(__file__).parents[2] / "README.md").read_text()
    start, end = "<!-- version-table -->\n", "<!-- /version-table -->"
    assert start in readme and end in readme
    table = readme.split(start, 1)[1].split(end, 1)[0]
    assert table == version_table(), "regenerate with: python -c 'from shoal.image_uris import " \
        "version_table; print(version_table(), end=\"\")'"


def test_the_version_table_has_a_row_per_matrix_entry_with_its_rules():
    from shoal.containers import matrix
    from shoal.image_uris import version_table

    rows = version_table().splitlines()[2:]
    assert len(rows) == len(matrix.specs())
    assert "| pytorch | 1.13.1 | py39 | 11.7 (cu117) | 2.14.3 | yes | yes |" in rows
    assert all(row.endswith("| yes | no |") for row in rows if row.startswith("| pytorch | 1.12"))
