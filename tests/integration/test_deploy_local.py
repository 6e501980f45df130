"""Serving on this machine: the model server's processes and Shoal's SDK deploy/predict.

The model server runs as the inference container runs it (``serve`` with the toolkit's
environment), here on a loopback port; the SDK's endpoints are local ones
(``instance_type="local"``): model extracted, server started detached, InvokeEndpoint over
HTTP, errors as the runtime's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
import shoal
import urllib3
from botocore.exceptions import ClientError
from shoal.errors import EndpointError
from shoal.launcher.ports import free_port
from shoal.local.endpoints import LocalEndpoints

pytestmark = [pytest.mark.slow, pytest.mark.torch]
torch = pytest.importorskip("torch", reason="the PyTorch model server needs PyTorch")

INFERENCE = '''
import json, os, time

class TeapotError(Exception):
    status_code = 418
    def __init__(self, message):
        super().__init__(message)
        self.message = message

def model_fn(model_dir):
    import torch
    if os.environ.get("PIDS_FILE"):
        with open(os.environ["PIDS_FILE"], "a") as f:
            f.write(f"{os.getpid()}\\n")
    if os.environ.get("FAIL_MODEL_FN"):
        raise RuntimeError("weights are corrupt: " + os.environ["FAIL_MODEL_FN"])
    return torch.jit.load(os.path.join(model_dir, "model.pt"))

def input_fn(body, content_type):
    import io, numpy as np, torch
    if content_type == "application/json":
        request = json.loads(body)
        if request == "teapot":
            raise TeapotError("short and stout")
        if request == "crash":
            raise ValueError("no such input")
        if request == "sleep":
            time.sleep(3)
        return torch.tensor(request, dtype=torch.float32)
    return torch.from_numpy(np.load(io.BytesIO(body)))

def output_fn(prediction, accept):
    import io, numpy as np
    if accept == "application/x-npy":
        out = io.BytesIO()
        np.save(out, prediction.detach().numpy())
        return out.getvalue(), accept
    return json.dumps({"y": prediction.tolist(), "pid": os.getpid()}), "application/json"
'''


def model_dir(tmp_path: Path, name: str = "model") -> Path:
    folder = tmp_path / name
    (folder / "code").mkdir(parents=True)
    net = torch.nn.Linear(2, 1)
    with torch.no_grad():
        net.weight.copy_(torch.tensor([[1.0, 10.0]]))
        net.bias.zero_()
    torch.jit.save(torch.jit.script(net), str(folder / "model.pt"))
    (folder / "code" / "inference.py").write_text(INFERENCE)
    return folder


class ModelServer:
    def __init__(self, folder: Path, tmp_path: Path, **env):
        self.port = free_port()
        self.ready, self.failure = tmp_path / "ready", tmp_path / "failure"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "shoal.deploy.modelserver", "serve", "--model-dir",
             str(folder), "--host", "127.0.0.1", "--port", str(self.port), "--ready-file",
             str(self.ready), "--failure-file", str(self.failure)],
            env={**os.environ, "SAGEMAKER_PROGRAM": "inference.py", **env},
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.http = urllib3.PoolManager()

    def wait(self, timeout=120) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.ready.exists():
                return True
            if self.proc.poll() is not None:
                return False
            time.sleep(0.1)
        raise AssertionError("the model server neither started nor failed")

    def post(self, body, content_type="application/json", **headers):
        return self.http.request("POST", f"http://127.0.0.1:{self.port}/invocations",
                                 body=body, headers={"Content-Type": content_type, **headers},
                                 timeout=30, retries=False)

    def close(self) -> str:
        if self.proc.poll() is None:
            self.proc.terminate()
        out, _ = self.proc.communicate(timeout=30)
        return out


def test_the_model_server_loads_a_model_per_worker_and_answers_as_the_toolkit(tmp_path):
    pids = tmp_path / "pids"
    server = ModelServer(model_dir(tmp_path), tmp_path, SAGEMAKER_MODEL_SERVER_WORKERS="2",
                         SAGEMAKER_MODEL_SERVER_TIMEOUT="1", SAGEMAKER_MAX_PAYLOAD_IN_MB="1",
                         PIDS_FILE=str(pids))
    try:
        assert server.wait(), server.close()
        assert len(set(pids.read_text().split())) == 2  # model_fn ran in each worker
        ping = server.http.request("GET", f"http://127.0.0.1:{server.port}/ping")
        assert ping.status == 200 and json.loads(ping.data) == {"status": "Healthy"}
        ok = server.post(b"[[1, 2], [3, 4]]", Accept="application/json")
        assert ok.status == 200 and ok.headers["Content-Type"] == "application/json"
        assert json.loads(ok.data)["y"] == [[21.0], [43.0]]
        teapot = server.post(b'"teapot"')
        assert teapot.status == 418 and teapot.data == b"short and stout"
        crash = server.post(b'"crash"')
        assert crash.status == 500 and b"no such input" in crash.data
        assert b"Traceback" in crash.data
        big = server.post(b"[" + b"1," * (600 * 1024) + b"1]")
        assert big.status == 413
        slow = server.post(b'"sleep"')
        assert slow.status == 500 and b"did not answer within 1 s" in slow.data
        deadline = time.monotonic() + 60  # that worker is replaced; the server keeps serving
        while len(set(pids.read_text().split())) < 3 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert len(set(pids.read_text().split())) == 3
        assert server.post(b"[[0, 1]]").status == 200
    finally:
        server.close()
    assert server.proc.returncode == 0


def test_a_failing_model_fn_ends_the_server_with_its_reason(tmp_path):
    server = ModelServer(model_dir(tmp_path), tmp_path, FAIL_MODEL_FN="crc mismatch",
                         SAGEMAKER_MODEL_SERVER_WORKERS="1")
    assert not server.wait()
    out = server.close()
    assert server.proc.returncode == 1
    assert "RuntimeError: weights are corrupt: crc mismatch" in server.failure.read_text()
    assert "the model failed to load" in out


def packed_model(tmp_path: Path) -> str:
    folder = model_dir(tmp_path, "trained-model")
    archive = tmp_path / "trained" / "job" / "output" / "model.tar.gz"
    archive.parent.mkdir(parents=True)
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(folder / "model.pt", arcname="model.pt")
    return archive.as_uri()


def test_a_pytorch_model_deploys_locally_and_predicts_numpy(tmp_path, monkeypatch):
    monkeypatch.setenv("SHOAL_LOCAL_ROOT", str(tmp_path / "root"))
    code = model_dir(tmp_path) / "code"
    model = shoal.PyTorchModel(model_data=packed_model(tmp_path), entry_point="inference.py",
                               source_dir=str(code), role="arn:aws:iam::111122223333:role/R",
                               framework_version="1.13.1", py_version="py39")
    predictor = model.deploy(1, "local", endpoint_name="local-ep")
    sm = LocalEndpoints(tmp_path / "root")
    try:
        assert isinstance(predictor, shoal.PyTorchPredictor)
        described = sm.describe_endpoint(EndpointName="local-ep")
        assert described["EndpointStatus"] == "InService"
        assert described["ProductionVariants"][0]["VariantName"] == "AllTraffic"
        container = sm.describe_model(ModelName=model.name)["PrimaryContainer"]
        assert container["Environment"]["SAGEMAKER_PROGRAM"] == "inference.py"
        assert container["Image"].startswith("shoal-pytorch-inference:1.13.1-cpu-py39")
        out = predictor.predict(np.array([[1, 2]], dtype=np.float32))
        assert isinstance(out, np.ndarray) and out.tolist() == [[21.0]]
        with pytest.raises(ClientError) as failed:
            sm.invoke_endpoint(EndpointName="local-ep", Body=b'"teapot"',
                               ContentType="application/json")
        error = failed.value.response
        assert error["Error"]["Code"] == "ModelError" and error["OriginalStatusCode"] == 418
        assert error["OriginalMessage"] == "short and stout"
        assert 'Received client error (418) from primary with message "short and stout"' in \
            error["Error"]["Message"]
        assert error["LogStreamArn"].endswith("/aws/sagemaker/Endpoints/local-ep:log-stream:"
                                              "AllTraffic/local")
        check_the_cli(tmp_path)
    finally:
        predictor.delete_endpoint()
        predictor.delete_model()
    with pytest.raises(ClientError, match='Could not find endpoint ".*endpoint/local-ep"'):
        sm.describe_endpoint(EndpointName="local-ep")
    with pytest.raises(ClientError, match="Endpoint local-ep of account 000000000000 not found"):
        sm.invoke_endpoint(EndpointName="local-ep", Body=b"[]")
    assert sm.list_models()["Models"] == []


def check_the_cli(tmp_path):
    """``shoal endpoints`` and ``shoal invoke`` on the endpoint the test deployed."""
    from click.testing import CliRunner
    from shoal.cli import cli, main

    listed = CliRunner().invoke(cli, ["endpoints"])
    assert listed.exit_code == 0 and listed.output.splitlines()[1].split()[:2] == [
        "local-ep", "InService"]
    body = tmp_path / "body.json"
    body.write_text("[[2, 0]]")
    out = tmp_path / "answer.json"
    assert main(["invoke", "local-ep", "--body", str(body), "--out", str(out)]) == 0
    assert json.loads(out.read_text())["y"] == [[2.0]]
    body.write_text('"teapot"')
    assert main(["invoke", "local-ep", "--body", str(body)]) == 1  # InvocationError


def test_a_model_that_cannot_load_fails_the_deploy_with_the_reason(tmp_path, monkeypatch):
    monkeypatch.setenv("SHOAL_LOCAL_ROOT", str(tmp_path / "root"))
    code = model_dir(tmp_path) / "code"
    model = shoal.PyTorchModel(model_data=packed_model(tmp_path), entry_point="inference.py",
                               source_dir=str(code), framework_version="1.13.1",
                               py_version="py39", env={"FAIL_MODEL_FN": "truncated"})
    with pytest.raises(EndpointError, match="weights are corrupt: truncated") as failed:
        model.deploy(1, "local", endpoint_name="broken-ep")
    assert failed.value.status == "Failed"
    sm = LocalEndpoints(tmp_path / "root")
    assert sm.list_endpoints(StatusEquals="Failed")["Endpoints"][0]["EndpointName"] == "broken-ep"
    sm.delete_endpoint(EndpointName="broken-ep")


TRAIN = '''
import argparse, os
import torch

def model_fn(model_dir):
    return torch.jit.load(os.path.join(model_dir, "model.pt"))

if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--scale", type=float, default=1.0)
    args = parser.parse_args()
    net = torch.nn.Linear(2, 1)
    with torch.no_grad():
        net.weight.fill_(args.scale)
        net.bias.zero_()
    print(f"loss={0.5 / args.scale}", flush=True)
    torch.jit.save(torch.jit.script(net), os.path.join(os.environ["SM_MODEL_DIR"], "model.pt"))
'''


def test_fit_then_deploy_serves_the_trained_model_with_the_training_script(tmp_path,
                                                                           monkeypatch):
    monkeypatch.setenv("SHOAL_LOCAL_ROOT", str(tmp_path / "root"))
    source = tmp_path / "src"
    source.mkdir()
    (source / "train.py").write_text(textwrap.dedent(TRAIN))
    estimator = shoal.PyTorch(
        entry_point="train.py", source_dir=str(source), role="arn:aws:iam::111122223333:role/R",
        instance_type="local", instance_count=1, framework_version="1.13.1", py_version="py39",
        hyperparameters={"scale": 3}, output_path=(tmp_path / "out").as_uri(),
        disable_profiler=True, metric_definitions=[{"Name": "loss", "Regex": "loss=(\\S+)"}])
    estimator.fit(job_name="deploy-fit")
    predictor = estimator.deploy(1, "local")
    try:
        from shoal import naming

        base = naming.base_name_from_image(estimator.training_image_uri())
        assert base.endswith("pytorch-training")  # v2: named from the image, not the job
        assert predictor.endpoint_name.startswith(base + "-")
        out = predictor.predict(np.array([[1.0, 2.0]], dtype=np.float32))
        assert out.tolist() == [[9.0]]
        trained = Path(estimator.model_data[len("file://"):])
        assert [m.name for m in tarfile.open(trained)] == ["model.pt"]  # never rewritten
    finally:
        predictor.delete_endpoint()
