"""The user's inference module and one request through its handlers.

The module is ``SAGEMAKER_PROGRAM`` (``inference.py`` when unset) in the model's ``code/``
directory, imported with that directory first on ``sys.path``; when the file is absent every
handler is a default. It may define:

- ``model_fn(model_dir)``: run once per worker, before ``/ping`` answers;
- ``input_fn(input_data, content_type)``, ``predict_fn(data, model)``,
  ``output_fn(prediction, accept)``, or instead of those three
  ``transform_fn(model, input_data, content_type, accept)``;

each with an optional trailing ``context`` argument. The defaults are the PyTorch inference
toolkit's: TorchScript ``model.pt`` (or the one ``*.pt``/``*.pth`` file), json and csv as
float32 tensors, npy with its dtype kept, ``model(data)`` in eval mode without gradients, the
output as the first type of the accept list the codecs know.
"""

from __future__ import annotations

import importlib.util
import inspect
import os
import sys
from pathlib import Path
from typing import Any, Callable

import attrs

from . import codecs

HOOKS = {"model_fn": 1, "input_fn": 2, "predict_fn": 2, "output_fn": 2, "transform_fn": 4}
DEFAULT_PROGRAM = "inference.py"


class InferenceError(Exception):
    """An error that answers ``status_code`` with ``message`` (the toolkit's
    ``BaseInferenceToolkitError``: any exception with an integer ``status_code`` counts)."""

    def __init__(self, status_code: int, message: str, phrase: str | None = None):
        super().__init__(message)
        self.status_code, self.message, self.phrase = status_code, message, phrase or message


class ModelLoadError(InferenceError):
    def __init__(self, message: str):
        super().__init__(500, message)


@attrs.define
class Context:
    """What a handler's ``context`` argument carries (the model server's request context)."""

    model_dir: str
    request_headers: dict = attrs.field(factory=dict)
    system_properties: dict = attrs.field(factory=dict)

    def get_request_header(self, idx: int, key: str) -> str | None:
        return {k.lower(): v for k, v in self.request_headers.items()}.get(key.lower())


def load_module(code_dir: Path, program: str | None):
    """The user's module, or None when its file is absent (defaults for everything)."""
    name = (program or DEFAULT_PROGRAM).removesuffix(".py")
    path = Path(code_dir) / f"{name}.py"
    if not path.is_file():
        return None
    if str(code_dir) not in sys.path:
        sys.path.insert(0, str(code_dir))  # its own imports resolve beside it, as in the toolkit
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _with_context(fn: Callable, name: str, args: int) -> Callable:
    """``fn`` called with ``context`` appended when it takes one more argument."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return lambda *a, context=None: fn(*a)
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    varargs = any(p.kind == p.VAR_POSITIONAL for p in params)
    if varargs or len(positional) == args + 1:
        return lambda *a, context=None: fn(*a, context)
    if len(positional) == args:
        return lambda *a, context=None: fn(*a)
    raise TypeError(f"{name} takes {len(positional)} arguments: it must take {args} "
                    f"(or {args + 1} with the context)")


class Handlers:
    """The resolved handlers of one model: the user's where defined, else the defaults."""

    def __init__(self, module=None, device: str | None = None):
        self.device = device
        user = {name: getattr(module, name) for name in HOOKS
                if module is not None and callable(getattr(module, name, None))}
        if "transform_fn" in user:
            mixed = sorted(set(user) & {"input_fn", "predict_fn", "output_fn"})
            if mixed:
                raise ValueError(f"transform_fn cannot be used with {', '.join(mixed)}: define "
                                 f"either transform_fn or input_fn/predict_fn/output_fn")
        defaults = {"model_fn": self.default_model_fn, "input_fn": self.default_input_fn,
                    "predict_fn": self.default_predict_fn, "output_fn": self.default_output_fn}
        self.user = set(user)
        self.hooks = {name: _with_context(fn, name, HOOKS[name])
                      for name, fn in {**defaults, **user}.items()}
        self.model: Any = None

    def load(self, model_dir: str, context: Context | None = None) -> None:
        self.model = self.hooks["model_fn"](model_dir, context=context)

    def transform(self, body: bytes, content_type: str, accept: str,
                  context: Context | None = None) -> tuple[bytes, str]:
        """One request: (response body, its content type)."""
        data = body.decode("utf-8") if codecs.media_type(content_type) in codecs.TEXT_TYPES \
            else body
        if "transform_fn" in self.hooks:
            result = self.hooks["transform_fn"](self.model, data, content_type, accept,
                                                context=context)
        else:
            inputs = self.hooks["input_fn"](data, content_type, context=context)
            prediction = self.hooks["predict_fn"](inputs, self.model, context=context)
            result = self.hooks["output_fn"](prediction, accept, context=context)
        out_type = accept
        if isinstance(result, tuple):
            result, out_type = result
        if isinstance(result, str):
            result = result.encode("utf-8")
        return bytes(result), out_type

    # -- the PyTorch toolkit's defaults ------------------------------------------------
    def _device(self):
        import torch

        return torch.device(self.device or ("cuda" if torch.cuda.is_available() else "cpu"))

    def default_model_fn(self, model_dir: str):
        import torch

        path = Path(model_dir) / "model.pt"
        if not path.is_file():
            found = sorted(p for p in Path(model_dir).iterdir() if p.suffix in (".pt", ".pth"))
            if len(found) != 1:
                raise ValueError(f"the default model_fn loads model.pt, or the one .pt or .pth "
                                 f"file in {model_dir} (found {len(found)}): save the model "
                                 f"with TorchScript as model.pt, or define model_fn")
            path = found[0]
        try:
            return torch.jit.load(str(path), map_location=self._device())
        except RuntimeError as error:
            raise ModelLoadError(f"{path.name} is not a TorchScript model ({error}); save it "
                                 f"with torch.jit.save, or define model_fn") from error

    def default_input_fn(self, data, content_type: str):
        import torch

        array = codecs.decode(data, content_type)
        if codecs.media_type(content_type) == codecs.NPY:
            tensor = torch.from_numpy(array)  # the dtype the client sent
        else:
            tensor = torch.FloatTensor(array)
        return tensor.to(self._device())

    def default_predict_fn(self, data, model):
        import torch

        model.eval()
        with torch.no_grad():
            return model(data.to(self._device()) if hasattr(data, "to") else data)

    def default_output_fn(self, prediction, accept: str):
        if hasattr(prediction, "cpu"):
            prediction = prediction.detach().cpu().numpy().tolist()
        for kind in (accept or codecs.JSON).split(","):
            if codecs.encodable(kind):
                return codecs.encode(prediction, kind), codecs.media_type(kind)
        raise codecs.UnsupportedFormatError(accept)


def default_accept() -> str:
    return os.environ.get("SAGEMAKER_DEFAULT_INVOCATIONS_ACCEPT") or codecs.JSON
