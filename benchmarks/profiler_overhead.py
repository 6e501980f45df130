"""The profiler's cost on a training step: the same loop (a DataLoader, a DDP-wrapped MLP's
forward and backward with its bucket allreduces, an SGD step, one synchronous all_reduce of
the gradients' norm; on Shoal's backend unless ``--backend gloo``) run without profiling and
with what a local job turns on:

- ``steps``: the default (system monitor beside the process at 500 ms, steps from torch's
  hooks, and every collective: the backend's own records, DDP's buckets included);
- ``all``: framework profiling (forward, backward and data-loader spans as well).

Each variant is a fresh process (the hooks are process-wide); the variants alternate, round
after round, and the figure is the median over rounds of the paired ratio of step times
(variant / none), as an overhead in percent. The goal is <= 2 % at the defaults.

    .venv/bin/python benchmarks/profiler_overhead.py [--rounds 5] [--steps 200] [--backend shoal]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
BOOTSTRAP = HERE.parent / "runtime" / "profiler" / "bootstrap"


def worker(steps: int, width: int, backend: str) -> None:
    import shoal.dataparallel.torch  # noqa: F401 - registers the shoal backend
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    torch.manual_seed(0)
    dist.init_process_group(backend, init_method=f"file://{tempfile.mktemp()}", rank=0,
                            world_size=1)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Sequential(
        *[m for _ in range(4) for m in (torch.nn.Linear(width, width), torch.nn.ReLU())]))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    data = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(torch.randn(64 * 50, width), torch.randn(64 * 50, width)),
        batch_size=64)
    times = []
    while len(times) < steps:
        for x, y in data:
            start = time.perf_counter()
            loss = torch.nn.functional.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            norm = torch.stack([p.grad.norm() for p in model.parameters()]).sum().reshape(1)
            dist.all_reduce(norm)
            times.append(time.perf_counter() - start)
            if len(times) == steps:
                break
    warm = times[steps // 10:]
    print(json.dumps({"step_s": statistics.median(warm)}))
    dist.destroy_process_group()


def run(variant: str, steps: int, width: int, backend: str, tmp: Path) -> float:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SHOAL_PROFILER")}
    monitor = None
    if variant != "none":
        out = tmp / variant
        env.update(SHOAL_PROFILER_DIR=str(out), SHOAL_PROFILER_EVENTS=variant, SHOAL_HOST="algo-1",
                   PYTHONPATH=os.pathsep.join(p for p in (str(BOOTSTRAP), env.get("PYTHONPATH")) if p))
        monitor = subprocess.Popen([sys.executable, "-m", "shoal.profiler.system_monitor", "--out",
                                    str(out), "--node", "algo-1", "--interval-ms", "500"])
    try:
        done = subprocess.run([sys.executable, __file__, "--worker", "--steps", str(steps),
                               "--width", str(width), "--backend", backend], env=env, capture_output=True, text=True,
                              check=True)
    finally:
        if monitor is not None:
            monitor.terminate()
            monitor.wait()
    return json.loads(done.stdout.strip().splitlines()[-1])["step_s"]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--backend", default="shoal", choices=("shoal", "gloo"))
    parser.add_argument("--worker", action="store_true")
    args = parser.parse_args(argv)
    if args.worker:
        worker(args.steps, args.width, args.backend)
        return 0
    variants = ["none", "steps", "all"]
    times = {v: [] for v in variants}
    with tempfile.TemporaryDirectory(prefix="shoal-overhead-") as tmp:
        for r in range(args.rounds):
            for v in variants[r % 3:] + variants[:r % 3]:
                times[v].append(run(v, args.steps, args.width, args.backend, Path(tmp)))
    print(f"profiler overhead, {args.rounds} rounds of {args.steps} steps (MLP 4 x {args.width}, "
          f"batch 64, DDP and one all_reduce per step on {args.backend}), {os.cpu_count()} cores")
    print(f"{'variant':>8} | {'median step ms':>14} | {'overhead %':>10}")
    for v in variants:
        ratio = statistics.median(t / n for t, n in zip(times[v], times["none"]))
        print(f"{v:>8} | {statistics.median(times[v]) * 1e3:14.2f} | {100 * (ratio - 1):10.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
