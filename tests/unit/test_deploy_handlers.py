"""The user's inference module and the PyTorch toolkit's default handlers."""

from __future__ import annotations

import io
import json
import textwrap

import numpy as np
import pytest
from shoal.deploy.modelserver import handlers
from shoal.deploy.modelserver.handlers import Context, Handlers


def write_module(tmp_path, source: str, name="inference.py"):
    code = tmp_path / "code"
    code.mkdir(exist_ok=True)
    (code / name).write_text(textwrap.dedent(source))
    return handlers.load_module(code, name)


def test_an_absent_program_means_every_default(tmp_path):
    assert handlers.load_module(tmp_path / "code", "train.py") is None
    h = Handlers(None)
    assert h.user == set()


def test_user_hooks_run_in_order_with_or_without_the_context(tmp_path):
    module = write_module(tmp_path, """
        import json
        def model_fn(model_dir, context):
            return {"dir": model_dir, "ctx": context.system_properties["model_dir"]}
        def input_fn(body, content_type):
            return json.loads(body)["x"]
        def predict_fn(data, model, context):
            return [v * 2 for v in data] + [context.get_request_header(0, "X-Tag")]
        def output_fn(prediction, accept):
            return json.dumps(prediction), "application/vnd.test"
        """)
    h = Handlers(module)
    h.load("/m", Context("/m", system_properties={"model_dir": "/m"}))
    assert h.model == {"dir": "/m", "ctx": "/m"}
    body, kind = h.transform(b'{"x": [1, 2]}', "application/json", "application/json",
                             Context("/m", {"x-tag": "t1"}))
    assert json.loads(body) == [2, 4, "t1"] and kind == "application/vnd.test"


def test_transform_fn_alone_or_an_error_naming_the_mix(tmp_path):
    module = write_module(tmp_path, """
        def model_fn(model_dir):
            return 3
        def transform_fn(model, body, content_type, accept):
            return body * model
        """)
    h = Handlers(module)
    h.load("/m")
    assert h.transform(b"ab", "application/octet-stream", "application/json") == (
        b"ababab", "application/json")
    mixed = write_module(tmp_path, """
        def transform_fn(model, body, content_type, accept):
            return body
        def input_fn(body, content_type):
            return body
        """, name="mixed.py")
    with pytest.raises(ValueError, match="transform_fn cannot be used with input_fn"):
        Handlers(mixed)


def test_a_hook_with_the_wrong_arity_is_refused(tmp_path):
    module = write_module(tmp_path, """
        def predict_fn(data):
            return data
        """)
    with pytest.raises(TypeError, match="predict_fn takes 1 arguments: it must take 2"):
        Handlers(module)


def test_the_module_imports_its_neighbours(tmp_path):
    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "helper_mod_for_test.py").write_text("FACTOR = 7\n")
    module = write_module(tmp_path, """
        import helper_mod_for_test
        def model_fn(model_dir):
            return helper_mod_for_test.FACTOR
        """, name="serve_neighbour.py")
    h = Handlers(module)
    h.load("/m")
    assert h.model == 7


torch = pytest.importorskip("torch", reason="the default handlers need PyTorch")


def scripted_model(tmp_path, name="model.pt"):
    net = torch.nn.Linear(2, 1)
    with torch.no_grad():
        net.weight.copy_(torch.tensor([[1.0, 10.0]]))
        net.bias.zero_()
    torch.jit.save(torch.jit.script(net), str(tmp_path / name))


def test_the_default_handlers_serve_a_torchscript_model(tmp_path):
    scripted_model(tmp_path)
    h = Handlers(None, device="cpu")
    h.load(str(tmp_path))
    body, kind = h.transform(b"[[1, 2], [3, 4]]", "application/json", "application/json")
    assert kind == "application/json" and json.loads(body) == [[21.0], [43.0]]
    body, kind = h.transform(b"1,2\n", "text/csv", "text/csv")
    assert body == b"21.0\n" and kind == "text/csv"
    stream = io.BytesIO()
    np.save(stream, np.array([[1, 2]], dtype=np.float32))
    body, kind = h.transform(stream.getvalue(), "application/x-npy",
                             "application/x-npy, application/json")
    out = np.load(io.BytesIO(body))
    assert kind == "application/x-npy" and out.dtype == np.float64 and out.tolist() == [[21.0]]


def test_a_float64_array_reaches_the_model_as_float64_as_in_the_toolkit(tmp_path):
    scripted_model(tmp_path)
    h = Handlers(None, device="cpu")
    h.load(str(tmp_path))
    stream = io.BytesIO()
    np.save(stream, np.array([[1.0, 2.0]]))  # float64, as np.array([[1., 2.]]) is
    with pytest.raises(RuntimeError, match="Double|dtype|float"):
        h.transform(stream.getvalue(), "application/x-npy", "application/json")


def test_the_default_model_fn_finds_one_pt_file_or_says_what_it_needs(tmp_path):
    scripted_model(tmp_path, "weights.pth")
    h = Handlers(None, device="cpu")
    h.load(str(tmp_path))
    assert h.model is not None
    scripted_model(tmp_path, "other.pt")
    with pytest.raises(ValueError, match="found 2"):
        Handlers(None, device="cpu").load(str(tmp_path))
    plain = tmp_path / "plain"
    plain.mkdir()
    torch.save({"w": torch.zeros(1)}, str(plain / "model.pt"))
    with pytest.raises(handlers.ModelLoadError, match="not a TorchScript model"):
        Handlers(None, device="cpu").load(str(plain))
