"""One local endpoint's process: the platform's part, then the model server.

    python -m shoal.local.endpoint_runner ENDPOINT_DIR PORT

Fetches the model's ``ModelDataUrl`` (``file://`` or ``s3://``), extracts it into
``ENDPOINT_DIR/model`` with tarfile's ``data`` filter (as ``/opt/ml/model``), exports the
container's ``Environment`` and runs the model server on ``127.0.0.1:PORT`` as its child,
relaying each line it prints to the endpoint's log stream (``streams/<variant>.log``, what
CloudWatch Logs shows as ``/aws/sagemaker/Endpoints/<name>``) and to ``logs.txt``. The
server writes ``ready`` once every worker loaded the model; any failure lands in
``failure`` for ``DescribeEndpoint``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from . import log_streams, state, storage


def prepare(folder: Path) -> dict:
    """The model extracted; returns the container's environment."""
    container = json.loads((folder / "container.json").read_text())
    model_dir = folder / "model"
    model_dir.mkdir(exist_ok=True)
    url = container.get("ModelDataUrl")
    if url:
        with tempfile.TemporaryDirectory(dir=folder) as tmp:
            if storage.is_s3(url):
                storage.download(url, Path(tmp))
                archive = Path(tmp) / url.rsplit("/", 1)[-1]
            else:
                archive = storage.file_path(url)
            with tarfile.open(archive) as tar:
                tar.extractall(model_dir, filter="data")
    env = {str(k): str(v) for k, v in (container.get("Environment") or {}).items()}
    # the image says which container this is: TensorFlow Serving's, or the PyTorch toolkit's
    framework = "tensorflow" if "tensorflow" in container.get("Image", "") else "pytorch"
    return {"SHOAL_MODEL_SERVER_FRAMEWORK": framework, **env}


def main(argv: list[str]) -> int:
    folder, port = Path(argv[0]), argv[1]
    try:
        environment = prepare(folder)
    except Exception as error:  # the reason goes to DescribeEndpoint
        (folder / "failure").write_text(f"the model data could not be prepared: "
                                        f"{type(error).__name__}: {error}")
        print(f"endpoint: {error}", file=sys.stderr)
        return 1
    env = {**os.environ, **environment, "SAGEMAKER_BIND_TO_PORT": port}
    env.setdefault("SAGEMAKER_MODEL_SERVER_WORKERS", "1")  # each worker holds the model
    variant = state.read(folder / "endpoint.json").get("ShoalVariant", "AllTraffic")
    server = subprocess.Popen(
        [sys.executable, "-u", "-m", "shoal.deploy.modelserver", "serve", "--model-dir",
         str(folder / "model"), "--host", "127.0.0.1", "--port", port, "--failure-file",
         str(folder / "failure"), "--ready-file", str(folder / "ready")],
        env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    signal.signal(signal.SIGTERM, lambda *_: server.terminate())
    streams = log_streams.StreamWriter(folder)
    try:
        for raw in server.stdout:
            line = raw.decode("utf-8", "replace").rstrip("\n")
            streams.write(variant, line)
            print(line, flush=True)
    finally:
        streams.close()
    return server.wait()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
