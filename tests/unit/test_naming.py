"""Job names, image base names and S3 locations, as v2 derives them."""

import re

from shoal import naming


def test_timestamp_is_utc_with_milliseconds():
    assert naming.timestamp(0.25) == "1970-01-01-00-00-00-250"
    assert naming.timestamp(1700000000.5) == "2023-11-14-22-13-20-500"


def test_name_from_base_fits_63_characters():
    assert naming.name_from_base("job", moment=0) == "job-1970-01-01-00-00-00-000"
    long = naming.name_from_base("x" * 80, moment=0)
    assert len(long) == 63 and long == "x" * 39 + "-1970-01-01-00-00-00-000"
    assert re.fullmatch(r"b-\d{4}(-\d{2}){5}-\d{3}", naming.name_from_base("b"))


def test_base_from_name_undoes_name_from_base():
    assert naming.base_from_name(naming.name_from_base("my-job", moment=5)) == "my-job"
    assert naming.base_from_name("plain") == "plain"


def test_base_name_from_image():
    uri = "1.dkr.ecr.us-west-2.amazonaws.com/shoal-pytorch-training:1.13.1-gpu-py39"
    assert naming.base_name_from_image(uri) == "shoal-pytorch-training"
    assert naming.base_name_from_image("algo") == "algo"
    assert naming.base_name_from_image("localhost:5000/team/algo:2") == "algo"


def test_s3_join_keeps_the_scheme_and_single_slashes():
    assert naming.s3_join("s3://b/", "job", "model") == "s3://b/job/model"
    assert naming.s3_join("s3://b", None, "", end_slash=True) == "s3://b/"
    assert naming.s3_join("s3://b/p/", "/j/", "source") == "s3://b/p/j/source"


def test_source_archive_uri_as_v2():
    assert naming.source_archive_uri("j", code_location=None, output_path="s3://out/pre/fix") == \
        "s3://out/j/source/sourcedir.tar.gz"
    assert naming.source_archive_uri("j", code_location="s3://code/a/b/", output_path="s3://o") \
        == "s3://code/a/b/j/source/sourcedir.tar.gz"
    assert naming.source_archive_uri("j", code_location="s3://code", output_path="s3://o") == \
        "s3://code/j/source/sourcedir.tar.gz"


def test_default_bucket_name():
    assert naming.default_bucket_name("eu-west-1", "123") == "sagemaker-eu-west-1-123"
