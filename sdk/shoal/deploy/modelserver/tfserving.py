"""TensorFlow models, served as SageMaker's TensorFlow Serving container serves them.

- Models: every ``saved_model.pb`` under the model directory whose folder is all digits is a
  version of the model named after the folder above it (``model/1/saved_model.pb`` is model
  ``model``, version 1); the default model is ``SAGEMAKER_TFS_DEFAULT_MODEL_NAME``, else the
  first found. The newest version of each answers unless ``tfs-model-version`` asks for one.
- Requests: ``application/json`` (a body with ``instances``, ``inputs`` or ``examples`` as
  is; any other JSON wrapped as ``{"instances": ...}``, bracketed once unless it starts with
  ``[[``), ``application/jsonlines`` (one instance a line) and ``text/csv`` (one instance a
  row); any other type answers 415 ``{"error": "Unsupported Media Type: <type>"}``. The
  ``X-Amzn-SageMaker-Custom-Attributes`` keys ``tfs-model-name``, ``tfs-model-version`` and
  ``tfs-method`` choose the model, version and method (``predict`` only: classify and
  regress answer 400).
- Predictions: TensorFlow Serving's REST semantics on the ``serving_default`` signature: the
  row format (``instances`` -> ``{"predictions": ...}``) and the columnar one (``inputs`` ->
  ``{"outputs": ...}``).
- ``code/inference.py`` may define ``input_handler(data, context)`` and
  ``output_handler(response, context)`` (``data`` the request stream, ``response`` with
  ``status_code``, ``content``, ``text`` and ``json()``; the output handler returns
  ``(body, content_type)``), or ``handler(data, context)`` alone, which calls the model
  through ``context.rest_uri`` (this server's TensorFlow Serving REST route). A handler's
  exception answers 500 ``{"error": "<message>"}``.
"""

from __future__ import annotations

import collections
import io
import json
import os
from pathlib import Path

from .handlers import InferenceError

JSON_TYPES = ("application/json", "application/jsonlines", "application/jsons")
CSV = "text/csv"

Context = collections.namedtuple("Context", [
    "model_name", "model_version", "method", "rest_uri", "grpc_port", "channel",
    "custom_attributes", "request_content_type", "accept_header", "content_length"])


class TFSError(InferenceError):
    """An error answered as TensorFlow Serving's container answers: ``{"error": ...}``."""

    def __init__(self, status_code: int, message: str):
        super().__init__(status_code, json.dumps({"error": message}))


def find_models(model_dir: Path) -> dict[str, dict[int, Path]]:
    """{model name: {version: SavedModel folder}}."""
    found: dict[str, dict[int, Path]] = {}
    for pb in sorted(Path(model_dir).rglob("saved_model.pb")):
        version_dir = pb.parent
        if not version_dir.name.isdigit():
            continue
        name = version_dir.parent.name if version_dir.parent != Path(model_dir) else \
            Path(model_dir).name
        found.setdefault(name, {})[int(version_dir.name)] = version_dir
    if not found:
        raise ValueError(f"no SavedModel bundles found! (looked for <name>/<version>/"
                         f"saved_model.pb under {model_dir})")
    return found


class Response:
    """What an ``output_handler`` receives: the model's answer, as ``requests`` gives it."""

    def __init__(self, status_code: int, content: bytes):
        self.status_code, self.content = status_code, content

    @property
    def text(self) -> str:
        return self.content.decode("utf-8")

    def json(self):
        return json.loads(self.content)


def attributes(header: str | None) -> dict[str, str]:
    """``tfs-model-name=a,tfs-method=predict`` -> dict."""
    out = {}
    for part in (header or "").split(","):
        key, sep, value = part.strip().partition("=")
        if sep:
            out[key.strip()] = value.strip()
    return out


def to_request(body: bytes, content_type: str) -> dict:
    """The TensorFlow Serving REST request for a SageMaker request body."""
    kind = (content_type or "application/json").split(";")[0].strip().lower()
    if kind != CSV and kind not in JSON_TYPES:
        raise TFSError(415, f"Unsupported Media Type: {content_type}")
    try:
        text = body.decode("utf-8")
        if kind == CSV:
            return {"instances": [[float(v) for v in line.split(",")]
                                  for line in text.splitlines() if line.strip()]}
    except ValueError as error:
        raise TFSError(400, f"the body is not UTF-8 {kind}: {error}") from None
    if kind != "application/json":
        return {"instances": [json.loads(line) for line in text.splitlines() if line.strip()]}
    try:
        data = json.loads(text)
    except ValueError as error:
        raise TFSError(400, f"the body is not JSON: {error}") from None
    if isinstance(data, dict) and {"instances", "inputs", "examples"} & set(data):
        return data
    if not text.lstrip().startswith("[["):
        data = [data]
    return {"instances": data}


class TensorFlowModels:
    """The SavedModels of one model directory, loaded, and TensorFlow Serving's predict."""

    def __init__(self, model_dir: str):
        self.model_dir = Path(model_dir)
        self.models = find_models(self.model_dir)
        default = os.environ.get("SAGEMAKER_TFS_DEFAULT_MODEL_NAME")
        self.default = default if default in self.models else next(iter(self.models))
        self.loaded: dict[tuple[str, int], object] = {}
        for name, versions in self.models.items():
            self.load(name, max(versions))

    def load(self, name: str, version: int | None = None):
        import tensorflow as tf

        if name not in self.models:
            raise TFSError(404, f"Servable not found for request: Latest({name})")
        version = max(self.models[name]) if version is None else int(version)
        if version not in self.models[name]:
            raise TFSError(404, f"Servable not found for request: Specific({name}, {version})")
        key = (name, version)
        if key not in self.loaded:
            self.loaded[key] = tf.saved_model.load(str(self.models[name][version]))
        return self.loaded[key]

    def predict(self, request: dict, name: str | None = None,
                version: int | None = None) -> dict:
        import tensorflow as tf

        signature = self.load(name or self.default, version).signatures["serving_default"]
        specs = signature.structured_input_signature[1]
        if "examples" in request:
            raise TFSError(400, "classify and regress (tf.Example inputs) are not served")
        columnar = "inputs" in request
        data = request["inputs"] if columnar else request.get("instances")
        if data is None:
            raise TFSError(400, "the request has no 'instances' or 'inputs'")
        if columnar:
            feeds = data if isinstance(data, dict) else {next(iter(specs)): data}
        elif isinstance(data, list) and data and isinstance(data[0], dict):
            feeds = {key: [row[key] for row in data] for key in data[0]}
        else:
            feeds = {next(iter(specs)): data}
        try:
            tensors = {key: tf.constant(value, dtype=specs[key].dtype)
                       for key, value in feeds.items()}
            outputs = signature(**tensors)
        except (KeyError, TypeError, ValueError, tf.errors.InvalidArgumentError) as error:
            raise TFSError(400, str(error).strip()) from None
        values = {key: tensor.numpy().tolist() for key, tensor in outputs.items()}
        if columnar:
            return {"outputs": next(iter(values.values())) if len(values) == 1 else values}
        if len(values) == 1:
            return {"predictions": next(iter(values.values()))}
        rows = len(next(iter(values.values())))
        return {"predictions": [{k: v[i] for k, v in values.items()} for i in range(rows)]}


class TensorFlowHandlers:
    """One request through ``inference.py``'s handlers, or the default JSON/CSV path."""

    def __init__(self, module, model_dir: str, rest_port: int | None = None):
        self.models = TensorFlowModels(model_dir)
        self.rest_port = rest_port
        self.handler = getattr(module, "handler", None) if module else None
        self.input_handler = getattr(module, "input_handler", None) if module else None
        self.output_handler = getattr(module, "output_handler", None) if module else None
        if module is not None and not self.handler and (
                bool(self.input_handler) != bool(self.output_handler)):
            raise NotImplementedError("inference.py must define handler, or both "
                                      "input_handler and output_handler")

    def context(self, headers: dict[str, str]) -> Context:
        lower = {k.lower(): v for k, v in headers.items()}
        custom = attributes(lower.get("x-amzn-sagemaker-custom-attributes"))
        name = custom.get("tfs-model-name", self.models.default)
        version = custom.get("tfs-model-version")
        method = custom.get("tfs-method", "predict")
        where = f"/v1/models/{name}" + (f"/versions/{version}" if version else "")
        return Context(name, version, method,
                       f"http://127.0.0.1:{self.rest_port}{where}:{method}", None, None,
                       lower.get("x-amzn-sagemaker-custom-attributes"),
                       lower.get("content-type") or "application/json",
                       lower.get("accept") or "application/json",
                       int(lower.get("content-length") or 0))

    def rest(self, name: str, version: int | None, method: str, body: bytes) -> bytes:
        """TensorFlow Serving's own REST predict (what ``context.rest_uri`` reaches)."""
        if method != "predict":
            raise TFSError(400, f"tfs-method {method} is not served (predict only)")
        try:
            request = json.loads(body)
        except ValueError as error:
            raise TFSError(400, f"the body is not JSON: {error}") from None
        return json.dumps(self.models.predict(request, name, version)).encode()

    def transform(self, body: bytes, headers: dict[str, str]) -> tuple[bytes, str]:
        context = self.context(headers)
        version = int(context.model_version) if context.model_version else None
        if self.handler is not None:
            return _encoded(self.handler(io.BytesIO(body), context))
        if self.input_handler is not None:
            request = self.input_handler(io.BytesIO(body), context)
            request = request.encode() if isinstance(request, str) else request
            try:
                response = Response(200, self.rest(context.model_name, version,
                                                   context.method, request))
            except TFSError as error:
                response = Response(error.status_code, error.message.encode())
            return _encoded(self.output_handler(response, context))
        request = to_request(body, context.request_content_type)
        if context.method != "predict":
            raise TFSError(400, f"tfs-method {context.method} is not served (predict only)")
        answer = self.models.predict(request, context.model_name, version)
        return json.dumps(answer).encode(), "application/json"


def _encoded(result) -> tuple[bytes, str]:
    body, content_type = result
    return (body.encode("utf-8") if isinstance(body, str) else bytes(body)), content_type
