"""shoal.TensorFlow: model_dir, metrics default, debugger with parameter servers."""

import boto3
import pytest
import shoal
from moto import mock_aws

ROLE = "arn:aws:iam::123456789012:role/R"
BASE = {"entry_point": "train.py", "role": ROLE, "instance_count": 2,
        "instance_type": "ml.p4d.24xlarge", "framework_version": "2.11.0", "py_version": "py39"}


@pytest.fixture
def build(monkeypatch, tmp_path):
    (tmp_path / "train.py").write_text("")
    monkeypatch.chdir(tmp_path)
    with mock_aws():
        def make(**changes):
            session = shoal.Session(boto_session=boto3.Session(region_name="us-west-2"))
            est = shoal.TensorFlow(sagemaker_session=session, **{**BASE, **changes})
            return est.build_request(job_name="job")
        yield make


def test_model_dir_defaults_under_the_output_path(build):
    assert build()["HyperParameters"]["model_dir"] == \
        '"s3://sagemaker-us-west-2-123456789012/job/model"'
    assert build(output_path="s3://out/runs/")["HyperParameters"]["model_dir"] == \
        '"s3://out/runs/job/model"'


def test_model_dir_under_mpi_is_local(build):
    hps = build(distribution={"mpi": {"enabled": True}})["HyperParameters"]
    assert hps["model_dir"] == '"/opt/ml/model"'
    assert hps["sagemaker_mpi_enabled"] == "true"


def test_model_dir_given_or_disabled(build):
    assert build(model_dir="s3://m/d")["HyperParameters"]["model_dir"] == '"s3://m/d"'
    assert "model_dir" not in build(model_dir=False)["HyperParameters"]


def test_parameter_server_turns_the_debugger_off(build):
    request = build(instance_type="ml.c5.xlarge",
                    distribution={"parameter_server": {"enabled": True}})
    assert "DebugHookConfig" not in request
    assert request["HyperParameters"]["sagemaker_parameter_server_enabled"] == "true"


def test_metrics_on_from_1_15(build):
    assert build()["AlgorithmSpecification"]["EnableSageMakerMetricsTimeSeries"] is True
