"""Endpoint latency: InvokeEndpoint on a local endpoint against the model called in-process,
and against TorchServe serving the same TorchScript model when it is installed here.

    .venv/bin/python benchmarks/serve_predict.py [--requests 400] [--clients 1,8,32]
        [--workers 2] [--torchserve auto|off]

The model: a TorchScript MLP (64 -> 256 -> 256 -> 10) on a float32 batch of 8, sent as npy
(``PyTorchPredictor``'s format) and answered as npy. Rows:

- ``in-process model``: ``model(x)`` alone, the floor;
- ``in-process handlers``: the model server's handlers on the npy body (decode, model, encode),
  without HTTP;
- ``shoal endpoint``: ``LocalEndpoints.invoke_endpoint`` (what a local ``predict()`` calls:
  the endpoint's record, one HTTP POST to its model server), clients as threads;
- ``torchserve``: the same model and npy handling in TorchServe (``torchserve`` and
  ``torch-model-archiver`` installed, Java on PATH), same number of workers, HTTP POST to its
  inference API with a kept-alive connection per client.

Prints p50 and p99 latency (ms) and requests/s per row and client count, the shoal endpoint's
p99 minus the in-process model's at 1 client (goal: within 2 ms), and the deploy time from
CreateEndpoint to InService (goal: 3 s).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

INPUTS, HIDDEN, CLASSES, BATCH = 64, 256, 10, 8


def build_model(folder: Path) -> Path:
    import torch

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(INPUTS, HIDDEN), torch.nn.ReLU(),
                              torch.nn.Linear(HIDDEN, HIDDEN), torch.nn.ReLU(),
                              torch.nn.Linear(HIDDEN, CLASSES))
    path = folder / "model.pt"
    torch.jit.save(torch.jit.script(net.eval()), str(path))
    return path


def npy(array: np.ndarray) -> bytes:
    out = io.BytesIO()
    np.save(out, array)
    return out.getvalue()


def percentiles(samples: list[float]) -> tuple[float, float]:
    ordered = sorted(samples)
    return (statistics.median(ordered) * 1e3,
            ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))] * 1e3)


def run_clients(call, clients: int, requests: int) -> tuple[float, float, float]:
    """``requests`` calls spread over ``clients`` threads: p50 ms, p99 ms, requests/s."""
    latencies: list[float] = []
    lock = threading.Lock()
    per_client = max(1, requests // clients)
    start = threading.Barrier(clients + 1)

    def client():
        mine = []
        start.wait()
        for _ in range(per_client):
            began = time.perf_counter()
            call()
            mine.append(time.perf_counter() - began)
        with lock:
            latencies.extend(mine)

    threads = [threading.Thread(target=client) for _ in range(clients)]
    for t in threads:
        t.start()
    start.wait()
    began = time.perf_counter()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - began
    p50, p99 = percentiles(latencies)
    return p50, p99, len(latencies) / elapsed


def in_process_rows(model_dir: Path, body: bytes, requests: int) -> dict:
    import torch
    from shoal.deploy.modelserver.handlers import Handlers

    torch.set_num_threads(1)
    model = torch.jit.load(str(model_dir / "model.pt"))
    x = torch.from_numpy(np.load(io.BytesIO(body)))
    handlers = Handlers(None, device="cpu")
    handlers.load(str(model_dir))

    def direct():
        with torch.no_grad():
            model(x)

    rows = {}
    for name, call in (("in-process model", direct), ("in-process handlers", lambda: (
            handlers.transform(body, "application/x-npy", "application/x-npy")))):
        for _ in range(50):
            call()
        rows[name] = {1: run_clients(call, 1, requests)}
    return rows


def shoal_rows(model_dir: Path, body: bytes, clients: list[int], requests: int,
               workers: int, root: Path) -> tuple[dict, float]:
    from shoal.local.endpoints import LocalEndpoints

    archive = root / "model.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(model_dir / "model.pt", arcname="model.pt")
    sm = LocalEndpoints(root / "state")
    sm.create_model(ModelName="bench", PrimaryContainer={
        "Image": "shoal-pytorch-inference", "ModelDataUrl": archive.as_uri(),
        "Environment": {"SAGEMAKER_MODEL_SERVER_WORKERS": str(workers),
                        "OMP_NUM_THREADS": "1"}})
    sm.create_endpoint_config(EndpointConfigName="bench", ProductionVariants=[
        {"VariantName": "AllTraffic", "ModelName": "bench", "InitialInstanceCount": 1,
         "InstanceType": "local"}])
    began = time.perf_counter()
    sm.create_endpoint(EndpointName="bench", EndpointConfigName="bench")
    while sm.describe_endpoint(EndpointName="bench")["EndpointStatus"] == "Creating":
        time.sleep(0.02)
    deploy = time.perf_counter() - began
    try:
        assert sm.describe_endpoint(EndpointName="bench")["EndpointStatus"] == "InService"

        def call():
            out = sm.invoke_endpoint(EndpointName="bench", Body=body,
                                     ContentType="application/x-npy", Accept="application/x-npy")
            out["Body"].read()

        for _ in range(50):
            call()
        return {"shoal endpoint": {n: run_clients(call, n, requests) for n in clients}}, deploy
    finally:
        sm.delete_endpoint(EndpointName="bench")


TS_HANDLER = '''
import io
import numpy as np
import torch
from ts.torch_handler.base_handler import BaseHandler


class NpyHandler(BaseHandler):
    def preprocess(self, data):
        body = data[0].get("body") or data[0].get("data")
        return torch.from_numpy(np.load(io.BytesIO(bytes(body))))

    def postprocess(self, output):
        out = io.BytesIO()
        np.save(out, output.detach().numpy())
        return [out.getvalue()]
'''


def torchserve_available() -> str | None:
    """Why TorchServe cannot run here, or None."""
    if shutil.which("java") is None:
        return "no java on PATH"
    bindir = Path(sys.executable).parent
    if not (bindir / "torchserve").exists() or not (bindir / "torch-model-archiver").exists():
        return ("torchserve and torch-model-archiver are not installed "
                "(.venv/bin/pip install torchserve torch-model-archiver)")
    return None


def torchserve_rows(model_dir: Path, body: bytes, clients: list[int], requests: int,
                    workers: int, root: Path) -> dict:
    import http.client

    bindir = Path(sys.executable).parent
    store = root / "model-store"
    store.mkdir(parents=True)
    (root / "handler.py").write_text(TS_HANDLER)
    subprocess.run([str(bindir / "torch-model-archiver"), "--model-name", "bench",
                    "--version", "1.0", "--serialized-file", str(model_dir / "model.pt"),
                    "--handler", str(root / "handler.py"), "--export-path", str(store)],
                   check=True)
    port = free_port()
    config = root / "config.properties"
    config.write_text(f"inference_address=http://127.0.0.1:{port}\n"
                      f"management_address=http://127.0.0.1:{free_port()}\n"
                      f"metrics_address=http://127.0.0.1:{free_port()}\n"
                      f"default_workers_per_model={workers}\ndisable_token_authorization=true\n"
                      f"enable_envvars_config=true\n")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "LOG_LOCATION": str(root / "logs"),
           "METRICS_LOCATION": str(root / "logs")}
    subprocess.run([str(bindir / "torchserve"), "--start", "--ncs", "--model-store", str(store),
                    "--models", "bench=bench.mar", "--ts-config", str(config),
                    "--disable-token-auth"], check=True, env=env, cwd=root)
    try:
        deadline = time.monotonic() + 180
        while True:
            try:
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
                conn.request("GET", "/ping")
                if json.loads(conn.getresponse().read()).get("status") == "Healthy":
                    break
            except (OSError, ValueError):
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("TorchServe did not become healthy in 180 s")
            time.sleep(0.5)
        local = threading.local()

        def call():
            conn = getattr(local, "conn", None)
            if conn is None:
                conn = local.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
            conn.request("POST", "/predictions/bench", body=body,
                         headers={"Content-Type": "application/x-npy"})
            reply = conn.getresponse()
            reply.read()
            if reply.status != 200:
                raise RuntimeError(f"TorchServe answered {reply.status}")

        for _ in range(50):
            call()
        return {"torchserve": {n: run_clients(call, n, requests) for n in clients}}
    finally:
        subprocess.run([str(bindir / "torchserve"), "--stop"], env=env, cwd=root,
                       capture_output=True)


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--clients", default="1,8,32")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--torchserve", choices=("auto", "off"), default="auto")
    args = parser.parse_args()
    clients = [int(c) for c in args.clients.split(",")]
    with tempfile.TemporaryDirectory(prefix="shoal-serve-bench-") as tmp:
        root = Path(tmp)
        model_dir = root / "model"
        model_dir.mkdir()
        build_model(model_dir)
        body = npy(np.random.default_rng(0).standard_normal((BATCH, INPUTS), dtype=np.float32))
        rows = in_process_rows(model_dir, body, args.requests)
        served, deploy = shoal_rows(model_dir, body, clients, args.requests, args.workers, root)
        rows.update(served)
        why = "off" if args.torchserve == "off" else torchserve_available()
        if why is None:
            rows.update(torchserve_rows(model_dir, body, clients, args.requests, args.workers,
                                        root / "ts"))
    print(f"model: TorchScript MLP {INPUTS}-{HIDDEN}-{HIDDEN}-{CLASSES}, batch {BATCH} as npy; "
          f"{args.workers} server workers; {args.requests} requests per row\n")
    print("| path | clients | p50 ms | p99 ms | requests/s |")
    print("|---|---|---|---|---|")
    for name, by_clients in rows.items():
        for n, (p50, p99, rate) in by_clients.items():
            print(f"| {name} | {n} | {p50:.2f} | {p99:.2f} | {rate:.0f} |")
    floor = rows["in-process model"][1][1]
    mine = rows["shoal endpoint"][1][1]
    print(f"\nshoal endpoint p99 at 1 client minus the in-process model's: {mine - floor:.2f} ms "
          f"(goal <= 2 ms)")
    if "torchserve" in rows:
        for n in clients:
            print(f"{n} client(s): shoal/torchserve p99 {mine_p99(rows, n):.2f}, requests/s "
                  f"{rows['shoal endpoint'][n][2] / rows['torchserve'][n][2]:.2f}")
    else:
        print(f"torchserve: not measured ({why})")
    print(f"deploy (CreateEndpoint to InService): {deploy:.2f} s (goal <= 3 s)")
    return 0


def mine_p99(rows: dict, n: int) -> float:
    return rows["shoal endpoint"][n][1] / rows["torchserve"][n][1]


if __name__ == "__main__":
    sys.exit(main())
