"""shoal.PyTorch: distribution hyperparameters, metrics default, debugger rules."""

import json

import boto3
import pytest
import shoal
from moto import mock_aws
from shoal.errors import DistributionError

ROLE = "arn:aws:iam::123456789012:role/R"
BASE = {"entry_point": "train.py", "role": ROLE, "instance_count": 2,
        "instance_type": "ml.p4d.24xlarge", "framework_version": "1.13.1", "py_version": "py39"}


@pytest.fixture
def build(monkeypatch, tmp_path):
    (tmp_path / "train.py").write_text("")
    monkeypatch.chdir(tmp_path)
    with mock_aws():
        def make(inputs=None, **changes):
            session = shoal.Session(boto_session=boto3.Session(region_name="us-west-2"))
            est = shoal.PyTorch(sagemaker_session=session, **{**BASE, **changes})
            return est.build_request(inputs, job_name="job")
        yield make


def test_data_parallel_hyperparameters_are_json_encoded(build):
    hps = build(distribution={"smdistributed": {"dataparallel": {
        "enabled": True, "custom_mpi_options": "-verbose -x NCCL_DEBUG=VERSION"}}})["HyperParameters"]
    assert hps["sagemaker_distributed_dataparallel_enabled"] == "true"
    assert json.loads(hps["sagemaker_distributed_dataparallel_custom_mpi_options"]) == \
        "-verbose -x NCCL_DEBUG=VERSION"
    assert json.loads(hps["sagemaker_instance_type"]) == "ml.p4d.24xlarge"


def test_without_source_dir_the_program_is_the_basename(build):
    hps = build()["HyperParameters"]
    assert json.loads(hps["sagemaker_program"]) == "train.py"
    assert json.loads(hps["sagemaker_region"]) == "us-west-2"
    assert hps["sagemaker_container_log_level"] == "20"


def test_metrics_on_from_1_3_unless_told(build):
    assert build()["AlgorithmSpecification"]["EnableSageMakerMetricsTimeSeries"] is True
    request = build(enable_sagemaker_metrics=False)
    assert request["AlgorithmSpecification"]["EnableSageMakerMetricsTimeSeries"] is False


def test_debugger_is_off_with_both_checkpoint_settings(build):
    assert "DebugHookConfig" in build(checkpoint_s3_uri="s3://c/k")
    assert "DebugHookConfig" not in build(checkpoint_s3_uri="s3://c/k",
                                          checkpoint_local_path="/opt/ml/checkpoints")


def test_a_bad_distribution_is_refused_at_construction(build):
    with pytest.raises(DistributionError):
        build(distribution={"smdistributed": {"dataparallel": {"enabled": "yes please"}}})
