"""The model server's settings from the inference toolkit's environment."""

from __future__ import annotations

import pytest
from shoal.deploy.modelserver.main import ServerConfig, main


def test_the_toolkits_variables_set_the_server():
    config = ServerConfig.from_env({
        "SAGEMAKER_BASE_DIR": "/srv/ml", "SAGEMAKER_BIND_TO_PORT": "9090",
        "SAGEMAKER_MODEL_SERVER_WORKERS": "3", "SAGEMAKER_MODEL_SERVER_TIMEOUT": "5",
        "SAGEMAKER_MAX_PAYLOAD_IN_MB": "2", "SAGEMAKER_PROGRAM": "serve.py"})
    assert (config.model_dir, config.port, config.workers, config.timeout) == (
        "/srv/ml/model", 9090, 3, 5.0)
    assert config.max_payload == 2 * 1024 * 1024 and config.program == "serve.py"
    settings = config.worker_settings()
    assert (settings.model_dir, settings.timeout, settings.program) == ("/srv/ml/model", 5.0,
                                                                         "serve.py")


def test_defaults_are_the_containers():
    config = ServerConfig.from_env({}, model_dir=None)
    assert (config.model_dir, config.host, config.port, config.timeout) == (
        "/opt/ml/model", "0.0.0.0", 8080, 60.0)
    assert 1 <= config.workers <= 4 and config.program is None


@pytest.mark.parametrize("env, message", [
    ({"SAGEMAKER_MODEL_SERVER_WORKERS": "many"},
     "'SAGEMAKER_MODEL_SERVER_WORKERS' must be a number (got 'many')"),
    ({"SAGEMAKER_MODEL_SERVER_WORKERS": "0"}, "'workers' must be > 0 (got 0)"),
    ({"SAGEMAKER_BIND_TO_PORT": "70000"}, "'port' must be <= 65535"),
])
def test_a_bad_setting_says_what_was_wrong(env, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        ServerConfig.from_env(env)


def test_serve_exits_2_with_the_reason_before_binding(monkeypatch, capsys):
    monkeypatch.setenv("SAGEMAKER_MODEL_SERVER_TIMEOUT", "soon")
    assert main(["serve", "--model-dir", "/nowhere", "--port", "0"]) == 2
    assert "'SAGEMAKER_MODEL_SERVER_TIMEOUT' must be a number" in capsys.readouterr().err
