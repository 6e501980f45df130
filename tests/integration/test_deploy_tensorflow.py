"""TensorFlow models on local endpoints: SavedModels served with TensorFlow Serving's
container contract (request wrapping, content types, custom attributes, inference.py
handlers) and ``shoal.TensorFlowModel(...).deploy`` with its JSON predictor."""

from __future__ import annotations

import json
import tarfile
import textwrap
from pathlib import Path

import pytest
import shoal
from botocore.exceptions import ClientError
from shoal.local.endpoints import LocalEndpoints

pytestmark = [pytest.mark.slow, pytest.mark.tensorflow]
tf = pytest.importorskip("tensorflow", reason="serving a SavedModel needs TensorFlow")
IMAGE = "763104351884.dkr.ecr.us-east-1.amazonaws.com/tensorflow-inference:2.14-cpu"


def saved_model(folder: Path, scale: float) -> None:
    class Linear(tf.Module):
        def __init__(self):
            self.w = tf.Variable([[1.0], [10.0]])

        @tf.function(input_signature=[tf.TensorSpec([None, 2], tf.float32, name="x")])
        def serve(self, x):
            return {"y": tf.matmul(x, self.w) * scale}

    module = Linear()
    tf.saved_model.save(module, str(folder), signatures={"serving_default": module.serve})


def archive(tmp_path: Path, inference: str | None = None) -> str:
    root = tmp_path / "model-src"
    saved_model(root / "regressor" / "1", 1.0)
    saved_model(root / "regressor" / "2", 2.0)  # the newest answers by default
    if inference:
        (root / "code").mkdir()
        (root / "code" / "inference.py").write_text(textwrap.dedent(inference))
    out = tmp_path / "model.tar.gz"
    with tarfile.open(out, "w:gz") as tar:
        for item in root.iterdir():
            tar.add(item, arcname=item.name)
    return out.as_uri()


def endpoint(sm: LocalEndpoints, url: str, name: str) -> None:
    sm.create_model(ModelName=name, PrimaryContainer={"Image": IMAGE, "ModelDataUrl": url})
    sm.create_endpoint_config(EndpointConfigName=name, ProductionVariants=[
        {"VariantName": "AllTraffic", "ModelName": name, "InstanceType": "local",
         "InitialInstanceCount": 1}])
    sm.create_endpoint(EndpointName=name, EndpointConfigName=name)
    from shoal.deploy.model import wait_for_endpoint

    wait_for_endpoint(sm, name, 0.2, timeout=300)


def invoke(sm, name, body, content_type="application/json", **extra) -> dict:
    out = sm.invoke_endpoint(EndpointName=name, Body=body, ContentType=content_type, **extra)
    assert out["ContentType"] == "application/json"
    return json.loads(out["Body"].read())


def test_savedmodels_answer_as_tensorflow_serving_does(tmp_path):
    sm = LocalEndpoints(tmp_path / "root")
    endpoint(sm, archive(tmp_path), "tfs")
    try:
        assert invoke(sm, "tfs", b"[1, 2]") == {"predictions": [[42.0]]}  # bracketed once
        assert invoke(sm, "tfs", b"[[1, 2], [0, 1]]") == {"predictions": [[42.0], [20.0]]}
        assert invoke(sm, "tfs", b'{"instances": [{"x": [1, 0]}]}') == {"predictions": [[2.0]]}
        assert invoke(sm, "tfs", b'{"inputs": {"x": [[1, 0]]}}') == {"outputs": [[2.0]]}
        assert invoke(sm, "tfs", b"1,2\n0,1\n", "text/csv") == {"predictions": [[42.0], [20.0]]}
        assert invoke(sm, "tfs", b"[1, 2]\n[0, 1]\n", "application/jsonlines") == {
            "predictions": [[42.0], [20.0]]}
        assert invoke(sm, "tfs", b"[[1, 2]]", CustomAttributes="tfs-model-version=1") == {
            "predictions": [[21.0]]}
        with pytest.raises(ClientError) as failed:
            invoke(sm, "tfs", b"\x89PNG", "image/png")
        error = failed.value.response
        assert error["OriginalStatusCode"] == 415
        assert json.loads(error["OriginalMessage"]) == {"error": "Unsupported Media Type: image/png"}
        with pytest.raises(ClientError) as failed:
            invoke(sm, "tfs", b"[[1, 2]]", CustomAttributes="tfs-model-name=nope")
        assert failed.value.response["OriginalStatusCode"] == 404
    finally:
        sm.delete_endpoint(EndpointName="tfs")


HANDLERS = '''
import json

def input_handler(data, context):
    rows = json.loads(data.read().decode("utf-8"))["rows"]
    return json.dumps({"instances": rows})

def output_handler(response, context):
    if response.status_code != 200:
        raise ValueError(response.text)
    values = [p[0] for p in response.json()["predictions"]]
    return json.dumps({"values": values, "model": context.model_name}), "application/json"
'''

HANDLER = '''
import json
import urllib.request

def handler(data, context):
    body = json.dumps({"instances": json.loads(data.read())}).encode()
    request = urllib.request.Request(context.rest_uri, data=body, method="POST")
    with urllib.request.urlopen(request, timeout=30) as reply:
        predictions = json.loads(reply.read())["predictions"]
    return json.dumps({"sum": sum(p[0] for p in predictions)}), "application/json"
'''


@pytest.mark.parametrize("code, body, answer", [
    (HANDLERS, b'{"rows": [[1, 2], [1, 0]]}', {"values": [42.0, 2.0], "model": "regressor"}),
    (HANDLER, b"[[1, 2], [1, 0]]", {"sum": 44.0}),
], ids=["input-output-handlers", "handler-through-rest-uri"])
def test_inference_py_handlers_shape_requests_and_answers(tmp_path, code, body, answer):
    sm = LocalEndpoints(tmp_path / "root")
    endpoint(sm, archive(tmp_path, code), "tfs-code")
    try:
        assert invoke(sm, "tfs-code", body) == answer
        with pytest.raises(ClientError) as failed:
            invoke(sm, "tfs-code", b"not json")
        assert failed.value.response["OriginalStatusCode"] == 500
        assert "error" in json.loads(failed.value.response["OriginalMessage"])
    finally:
        sm.delete_endpoint(EndpointName="tfs-code")


def test_a_tensorflow_model_deploys_with_the_json_predictor(tmp_path, monkeypatch):
    monkeypatch.setenv("SHOAL_LOCAL_ROOT", str(tmp_path / "root"))
    model = shoal.TensorFlowModel(model_data=archive(tmp_path), framework_version="2.13.0",
                                  role="arn:aws:iam::111122223333:role/R")
    predictor = model.deploy(1, "local", endpoint_name="tf-ep")
    try:
        assert isinstance(predictor, shoal.TensorFlowPredictor)
        assert predictor.predict([[1.0, 2.0]]) == {"predictions": [[42.0]]}
        container = LocalEndpoints(tmp_path / "root").describe_model(
            ModelName=model.name)["PrimaryContainer"]
        assert container["Environment"] == {"SAGEMAKER_TFS_NGINX_LOGLEVEL": "info"}
        assert container["ModelDataUrl"] == model.model_data  # served as trained, no repack
    finally:
        predictor.delete_endpoint()
        predictor.delete_model()
