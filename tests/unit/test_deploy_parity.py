"""Deploy parity with SageMaker Python SDK v2: the same PyTorch model deployed with ``sagemaker``
2.x and with Shoal (the import lines aside), both under moto: CreateModel,
CreateEndpointConfig and CreateEndpoint must be equal, and the repacked archives hold the
same files."""

from __future__ import annotations

import io
import tarfile
import warnings

import boto3
import pytest
from moto import mock_aws

sagemaker = pytest.importorskip("sagemaker")

import shoal  # noqa: E402

from tests.unit.test_parity import offline_sdk_v2  # noqa: E402

ROLE = "arn:aws:iam::123456789012:role/SageMakerRole"
IMAGE = "763104351884.dkr.ecr.us-west-2.amazonaws.com/pytorch-inference:2.0.1-cpu-py310"
CALLS = ("create_model", "create_endpoint_config", "create_endpoint")


@pytest.fixture
def aws(monkeypatch, tmp_path):
    offline_sdk_v2(monkeypatch)
    code = tmp_path / "code"
    code.mkdir()
    (code / "inference.py").write_text("def model_fn(model_dir):\n    return None\n")
    (code / "requirements.txt").write_text("numpy\n")
    with mock_aws():
        s3 = boto3.client("s3", region_name="us-west-2")
        s3.create_bucket(Bucket="out-bucket",
                         CreateBucketConfiguration={"LocationConstraint": "us-west-2"})
        model = io.BytesIO()
        with tarfile.open(fileobj=model, mode="w:gz") as tar:
            info = tarfile.TarInfo("model.pt")
            info.size = 7
            tar.addfile(info, io.BytesIO(b"weights"))
        s3.put_object(Bucket="out-bucket", Key="job/output/model.tar.gz", Body=model.getvalue())
        yield code


def capture(client) -> list[tuple[str, dict]]:
    seen = []
    for name in CALLS:
        setattr(client, name, lambda _n=name, **request: seen.append((_n, request)) or {})
    return seen


def repacked(key: str) -> list[str]:
    body = boto3.client("s3", region_name="us-west-2").get_object(
        Bucket="sagemaker-us-west-2-123456789012", Key=key)["Body"].read()
    with tarfile.open(fileobj=io.BytesIO(body)) as tar:
        return sorted(m.name.lstrip("./") for m in tar if m.isfile())


def test_a_pytorch_models_deploy_requests_equal_v2s(aws):
    from sagemaker.pytorch import PyTorchModel

    args = dict(model_data="s3://out-bucket/job/output/model.tar.gz", role=ROLE,
                entry_point="inference.py", source_dir=str(aws), image_uri=IMAGE,
                framework_version="2.0.1", py_version="py310", name="parity-model",
                model_server_workers=2, env={"EXTRA": "1"})
    v2_session = sagemaker.session.Session(boto3.Session(region_name="us-west-2"))
    v2_calls = capture(v2_session.sagemaker_client)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        PyTorchModel(sagemaker_session=v2_session, **args).deploy(
            1, "ml.m5.xlarge", endpoint_name="parity-ep", wait=False)
    v2_archive = repacked("parity-model/model.tar.gz")
    boto3.client("s3", region_name="us-west-2").delete_object(
        Bucket="sagemaker-us-west-2-123456789012", Key="parity-model/model.tar.gz")

    session = shoal.Session(boto3.Session(region_name="us-west-2"))
    calls = capture(session.sagemaker_client)
    shoal.PyTorchModel(sagemaker_session=session, **args).deploy(
        1, "ml.m5.xlarge", endpoint_name="parity-ep", wait=False)
    assert [name for name, _ in calls] == list(CALLS)
    assert calls == v2_calls
    assert repacked("parity-model/model.tar.gz") == v2_archive == [
        "code/inference.py", "code/requirements.txt", "model.pt"]
