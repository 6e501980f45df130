"""``shoal serve``'s endpoints with the real clients: boto3 (calls, waiters, InvokeEndpoint
and its ModelError), the AWS CLI's waiters, a restart of the server, and SageMaker SDK v2's
whole notebook: fit with metric definitions, training_job_analytics, deploy, predict,
delete_endpoint, with S3 on a local S3 server."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
import textwrap
import time
from pathlib import Path

import boto3
import numpy as np
import pytest
from botocore.exceptions import ClientError

from tests.integration.test_deploy_local import model_dir
from tests.integration.test_server_clients import FAKE_KEYS, ROLE, Server, point_sdk_v2_at

pytestmark = [pytest.mark.slow, pytest.mark.torch]
torch = pytest.importorskip("torch", reason="the PyTorch model server needs PyTorch")
IMAGE = "763104351884.dkr.ecr.us-east-1.amazonaws.com/pytorch-inference:2.0.1-cpu-py310"


def model_archive(tmp_path: Path) -> str:
    folder = model_dir(tmp_path, "served")
    archive = tmp_path / "model.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        for item in folder.iterdir():
            tar.add(item, arcname=item.name)
    return archive.as_uri()


def test_boto3_and_the_cli_deploy_invoke_and_delete_and_endpoints_outlive_a_restart(tmp_path):
    root = tmp_path / "jobs"
    server = Server(root)
    sm, runtime = server.client("sagemaker"), server.client("sagemaker-runtime")
    aws = shutil.which("aws") or str(Path(sys.executable).parent / "aws")
    try:
        url = model_archive(tmp_path)
        arn = sm.create_model(ModelName="m1", ExecutionRoleArn=ROLE, PrimaryContainer={
            "Image": IMAGE, "ModelDataUrl": url,
            "Environment": {"SAGEMAKER_PROGRAM": "inference.py"}})["ModelArn"]
        assert arn == "arn:aws:sagemaker:us-east-1:000000000000:model/m1"
        with pytest.raises(ClientError, match='Cannot create already existing model ".*model/m1"'):
            sm.create_model(ModelName="m1", ExecutionRoleArn=ROLE,
                            PrimaryContainer={"Image": IMAGE, "ModelDataUrl": url})
        sm.create_endpoint_config(EndpointConfigName="c1", ProductionVariants=[{
            "VariantName": "AllTraffic", "ModelName": "m1", "InitialInstanceCount": 1,
            "InstanceType": "ml.m5.xlarge", "InitialVariantWeight": 1}])
        with pytest.raises(ClientError, match='Could not find endpoint configuration'):
            sm.create_endpoint(EndpointName="e1", EndpointConfigName="nope")
        sm.create_endpoint(EndpointName="e1", EndpointConfigName="c1")
        assert sm.describe_endpoint(EndpointName="e1")["EndpointStatus"] in ("Creating",
                                                                              "InService")
        sm.get_waiter("endpoint_in_service").wait(
            EndpointName="e1", WaiterConfig={"Delay": 1, "MaxAttempts": 120})
        env = {**os.environ, **FAKE_KEYS, "AWS_ENDPOINT_URL_SAGEMAKER": server.url,
               "AWS_CONFIG_FILE": "/dev/null"}
        started = time.monotonic()  # the CLI's waiter returns at its first poll
        subprocess.run([aws, "sagemaker", "wait", "endpoint-in-service", "--endpoint-name",
                        "e1"], env=env, check=True, timeout=120)
        assert time.monotonic() - started < 30

        out = runtime.invoke_endpoint(EndpointName="e1", Body=b"[[1, 2]]",
                                      ContentType="application/json", Accept="application/json")
        assert out["ContentType"] == "application/json"
        assert out["InvokedProductionVariant"] == "AllTraffic"
        assert json.loads(out["Body"].read())["y"] == [[21.0]]
        with pytest.raises(runtime.exceptions.ModelError) as failed:
            runtime.invoke_endpoint(EndpointName="e1", Body=b'"crash"',
                                    ContentType="application/json")
        error = failed.value.response
        assert error["ResponseMetadata"]["HTTPStatusCode"] == 424
        assert error["OriginalStatusCode"] == 500 and "no such input" in error["OriginalMessage"]
        assert "Received server error (500) from primary" in error["Error"]["Message"]
        with pytest.raises(ClientError, match="Endpoint nope of account 000000000000 not found"):
            runtime.invoke_endpoint(EndpointName="nope", Body=b"[]")
        with pytest.raises(ClientError, match="ValidationError"):
            runtime.invoke_endpoint(EndpointName="e1", Body=b"0" * (6 * 1024 * 1024 + 1))
        assert [e["EndpointName"] for e in sm.list_endpoints()["Endpoints"]] == ["e1"]
        logs = server.client("logs")
        group = "/aws/sagemaker/Endpoints/e1"
        streams = logs.describe_log_streams(logGroupName=group)["logStreams"]
        assert [s["logStreamName"] for s in streams] == ["AllTraffic/local"]
        messages = [e["message"] for e in logs.get_log_events(
            logGroupName=group, logStreamName="AllTraffic/local", startFromHead=True)["events"]]
        assert any("serving" in m and "1 worker(s)" in m for m in messages), messages
        assert any("no such input" in m for m in messages)  # the handler's traceback
        with pytest.raises(ClientError, match="ResourceNotFoundException"):
            logs.describe_log_streams(logGroupName="/aws/sagemaker/Endpoints/nope")

        server.stop()  # the endpoint is its own process: it keeps serving
        server = Server(root)
        sm, runtime = server.client("sagemaker"), server.client("sagemaker-runtime")
        assert sm.describe_endpoint(EndpointName="e1")["EndpointStatus"] == "InService"
        out = runtime.invoke_endpoint(EndpointName="e1", Body=b"[[0, 1]]",
                                      ContentType="application/json")
        assert json.loads(out["Body"].read())["y"] == [[10.0]]

        sm.delete_endpoint(EndpointName="e1")
        sm.get_waiter("endpoint_deleted").wait(EndpointName="e1",
                                               WaiterConfig={"Delay": 1, "MaxAttempts": 30})
        env["AWS_ENDPOINT_URL_SAGEMAKER"] = server.url
        subprocess.run([aws, "sagemaker", "wait", "endpoint-deleted", "--endpoint-name", "e1"],
                       env=env, check=True, timeout=120)
        sm.delete_endpoint_config(EndpointConfigName="c1")
        sm.delete_model(ModelName="m1")
        with pytest.raises(ClientError, match='Could not find model ".*model/m1"'):
            sm.describe_model(ModelName="m1")
    finally:
        server.stop()


def test_a_model_fn_that_fails_fails_the_endpoint_and_its_waiter(tmp_path):
    server = Server(tmp_path / "jobs")
    try:
        sm = server.client("sagemaker")
        sm.create_model(ModelName="bad", ExecutionRoleArn=ROLE, PrimaryContainer={
            "Image": IMAGE, "ModelDataUrl": model_archive(tmp_path),
            "Environment": {"SAGEMAKER_PROGRAM": "inference.py", "FAIL_MODEL_FN": "bitrot"}})
        sm.create_endpoint_config(EndpointConfigName="bad", ProductionVariants=[{
            "VariantName": "AllTraffic", "ModelName": "bad", "InitialInstanceCount": 1,
            "InstanceType": "ml.m5.xlarge"}])
        sm.create_endpoint(EndpointName="bad", EndpointConfigName="bad")
        with pytest.raises(Exception, match="Failed"):
            sm.get_waiter("endpoint_in_service").wait(
                EndpointName="bad", WaiterConfig={"Delay": 1, "MaxAttempts": 120})
        described = sm.describe_endpoint(EndpointName="bad")
        assert described["EndpointStatus"] == "Failed"
        assert "RuntimeError: weights are corrupt: bitrot" in described["FailureReason"]
        sm.delete_endpoint(EndpointName="bad")
    finally:
        server.stop()


TRAIN = '''
import os
import torch

def model_fn(model_dir):
    return torch.jit.load(os.path.join(model_dir, "model.pt"))

if __name__ == "__main__":
    for step, loss in enumerate((0.9, 0.5, 0.25)):
        print(f"step {step} loss={loss}", flush=True)
    net = torch.nn.Linear(2, 1)
    with torch.no_grad():
        net.weight.fill_(2.0)
        net.bias.zero_()
    torch.jit.save(torch.jit.script(net), os.path.join(os.environ["SM_MODEL_DIR"], "model.pt"))
'''


def test_sagemaker_sdk_v2_fit_analytics_deploy_predict_delete(tmp_path, local_s3, monkeypatch):
    sagemaker = pytest.importorskip("sagemaker")
    from sagemaker.pytorch import PyTorch

    code = tmp_path / "code"
    code.mkdir()
    (code / "train.py").write_text(textwrap.dedent(TRAIN))
    aws = {**FAKE_KEYS, "AWS_ENDPOINT_URL_S3": local_s3}
    server = Server(tmp_path / "jobs", env=aws)
    try:
        point_sdk_v2_at(monkeypatch, tmp_path, {
            **aws, **{f"AWS_ENDPOINT_URL_{name}": server.url for name in (
                "SAGEMAKER", "SAGEMAKER_RUNTIME", "CLOUDWATCH_LOGS", "CLOUDWATCH")}})
        # the SDK sleeps 30 s before each DescribeEndpoint poll
        real_sleep = time.sleep
        monkeypatch.setattr(sagemaker.session.time, "sleep", lambda s: real_sleep(min(s, 0.5)))
        session = sagemaker.Session(boto3.Session(region_name="us-east-1"),
                                    default_bucket="sagemaker-local-artifacts")
        estimator = PyTorch(entry_point="train.py", source_dir=str(code), role=ROLE,
                            instance_count=1, instance_type="ml.m5.xlarge",
                            framework_version="2.0.1", py_version="py310",
                            sagemaker_session=session, base_job_name="sdk-v2-deploy",
                            metric_definitions=[{"Name": "loss", "Regex": r"loss=(\S+)"}])
        estimator.fit(logs=False)
        frame = estimator.training_job_analytics.dataframe()
        assert list(frame["metric_name"].unique()) == ["loss"]
        assert frame["value"].iloc[-1] == pytest.approx((0.9 + 0.5 + 0.25) / 3)
        predictor = estimator.deploy(1, "ml.m5.xlarge")
        try:
            out = predictor.predict(np.array([[1.0, 2.0]], dtype=np.float32))
            assert isinstance(out, np.ndarray) and out.tolist() == [[6.0]]
        finally:
            predictor.delete_endpoint()
        with pytest.raises(ClientError, match="Could not find endpoint"):
            session.sagemaker_client.describe_endpoint(EndpointName=predictor.endpoint_name)
    finally:
        server.stop()
