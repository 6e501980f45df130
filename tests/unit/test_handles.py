"""Job handles: parsing, printing, and the errors for malformed ones."""

import pytest
from shoal.errors import ConfigError
from shoal.handles import (
    JobHandle,
    local_handle,
    parse_handle,
    resolve_handle,
    sagemaker_handle,
)


@pytest.mark.parametrize(
    "text, expected",
    [
        ("local://my-job-1", JobHandle("local", "my-job-1")),
        ("sagemaker://us-west-2/train-2024", JobHandle("sagemaker", "train-2024", "us-west-2")),
        ("sagemaker://us-gov-west-1/a", JobHandle("sagemaker", "a", "us-gov-west-1")),
    ],
)
def test_parse_round_trips(text, expected):
    handle = parse_handle(text)
    assert handle == expected
    assert str(handle) == text


def test_bare_name_needs_a_default_region():
    with pytest.raises(ConfigError, match="local://job-a or sagemaker://<region>/job-a"):
        parse_handle("job-a")
    assert parse_handle("job-a", default_region="eu-west-1") == sagemaker_handle("eu-west-1", "job-a")


@pytest.mark.parametrize(
    "text, message",
    [
        ("s3://bucket/key", "unknown handle scheme 's3'"),
        ("sagemaker://us-west-2", "sagemaker://<region>/<job-name>"),
        ("sagemaker://us-west-2/", "sagemaker://<region>/<job-name>"),
        ("sagemaker://not_a_region/job", "'region' must be an AWS region"),
        ("local://-leading-hyphen", "'job_name' must be 1-63"),
        ("local://under_score", "'job_name' must be 1-63"),
        ("local://" + "a" * 64, "'job_name' must be 1-63"),
    ],
)
def test_malformed_handles_are_config_errors(text, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse_handle(text)


def test_local_handles_have_no_region():
    assert local_handle("x").is_local
    assert not sagemaker_handle("us-east-1", "x").is_local
    with pytest.raises(ConfigError, match="no region"):
        JobHandle("local", "x", "us-east-1")


def test_a_bare_name_resolves_to_the_local_job_of_that_name():
    assert resolve_handle("job-a", local_exists={"job-a"}.__contains__) == local_handle("job-a")
    assert resolve_handle("sagemaker://us-west-2/job-a", local_exists=lambda name: True) == \
        sagemaker_handle("us-west-2", "job-a")


@pytest.mark.parametrize("text", ["job-b", "us-west-2/job-a", "under_score"])
def test_a_bare_name_without_a_local_job_lists_the_forms(text):
    with pytest.raises(ConfigError) as caught:
        resolve_handle(text, local_exists={"job-a"}.__contains__)
    assert str(caught.value) == (
        f"no local job named {text!r}, and a SageMaker job needs its region: name a job as "
        "local://<job>, sagemaker://<region>/<job>, or the bare name of a local job")


def test_a_bare_name_is_looked_up_under_the_local_root(tmp_path, monkeypatch):
    monkeypatch.setenv("SHOAL_LOCAL_ROOT", str(tmp_path))
    (tmp_path / "here").mkdir()
    (tmp_path / "here" / "job.json").write_text("{}")
    assert resolve_handle("here") == local_handle("here")
    with pytest.raises(ConfigError, match="no local job named 'gone'"):
        resolve_handle("gone")


def test_slurm_handles_name_a_job_on_the_cluster_and_have_no_region():
    from shoal.handles import JobHandle, parse_handle, slurm_handle

    handle = parse_handle("slurm://my-job-1")
    assert handle == slurm_handle("my-job-1") and handle.is_slurm and not handle.is_local
    assert str(handle) == "slurm://my-job-1"
    with pytest.raises(ConfigError, match="a slurm:// handle has no region"):
        JobHandle("slurm", "my-job-1", "us-west-2")
