"""The version matrix: entries, the communication toolchain, image names."""

import pytest
from shoal.containers import matrix


def test_toolchain_defaults_and_per_entry_overrides():
    pt = matrix.find("pytorch", "1.13.1")
    assert pt.toolchain() == {"openmpi": "4.1.1", "efa": "1.19.0", "aws_ofi_nccl": "1.4.0-aws"}
    tf = matrix.find("tensorflow", "2.11")
    assert tf.toolchain()["efa"] == "1.17.2" and tf.toolchain()["openmpi"] == "4.1.1"


def test_entries_without_toolchain_keys_still_load():
    spec = matrix.ImageSpec(framework="pytorch", framework_version="1.13.1", py_version="py39",
                            cuda="11.7", cuda_tag="cu117", gpu_base="b", cpu_base="c",
                            python="3.9", nccl="2.14.3")
    assert spec.toolchain()["aws_ofi_nccl"] == "1.4.0-aws"


def test_every_entry_names_a_cuda11_devel_base_and_a_matching_cuda_tag():
    for spec in matrix.specs():
        assert spec.cuda.startswith("11.")
        assert spec.cuda_tag == "cu" + spec.cuda.replace(".", "")
        assert spec.gpu_base.startswith(f"nvidia/cuda:{spec.cuda}.")
        assert spec.py_version == "py" + spec.python.replace(".", "")


def test_image_uri_and_find():
    spec = matrix.find("pytorch", "1.12")
    assert matrix.image_uri(spec, "gpu", "123456789012", "us-east-1") == (
        "123456789012.dkr.ecr.us-east-1.amazonaws.com/shoal-pytorch-training:1.12.1-gpu-py38")
    assert matrix.find("pytorch", "1.13.1", "py38") is None
    with pytest.raises(ValueError, match="'processor' must be in"):
        spec.tag("tpu")


@pytest.mark.parametrize("version, expected", [
    ("2.10.1", (2, 10, 1)),
    ("1.12", (1, 12)),
    ("2.0.0rc1", (2, 0, 0)),
    ("1.13.x", (1, 13)),
    ("v2", ()),
])
def test_release_orders_versions_by_their_numbers(version, expected):
    assert matrix.release(version) == expected


def test_release_orders_a_two_digit_minor_after_a_one_digit_one():
    assert matrix.release("2.10.0") > matrix.release("2.9.3")
    assert max(["2.9.3", "2.10.0", "2.2.0"], key=matrix.release) == "2.10.0"
