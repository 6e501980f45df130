"""A DDP training step on Shoal's backend versus gloo, in one mpirun job.

The model is communication-heavy on purpose (a wide MLP, ~34M parameters, a batch of 8),
so the step time is mostly gradient allreduce. Each rank builds four replicas: torch's
DistributedDataParallel on the default process group (backend ``shoal``, with the defaults
Shoal gives DDP there: gradients as bucket views, the core's average as the hook), the same
with torch's own defaults (``SHOAL_TORCH_DDP_DEFAULTS=0``: gradient copies, a division pass),
torch's DDP on a gloo group over the same ranks, and Shoal's own DDP wrapper (the module
API's, on the core's fused allreduce). Steps alternate between them (the order rotates
every round, so none always runs first) and every round yields one ratio to gloo per Shoal
variant; the median of those ratios is the figure of merit (target for ``shoal``: at most
0.8).

    mpirun --allow-run-as-root --oversubscribe -np 2 .venv/bin/python benchmarks/ddp_step.py
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import shoal.dataparallel.torch  # noqa: F401 - registers the backend
import torch
import torch.distributed as dist
from shoal.dataparallel.torch.parallel.distributed import DistributedDataParallel as ShoalDDP
from torch.nn.parallel import DistributedDataParallel as DDP


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--width", type=int, default=4096, help="hidden width of the MLP")
    parser.add_argument("--batch", type=int, default=8, help="per-rank batch size")
    parser.add_argument("--rounds", type=int, default=12, help="measured rounds")
    parser.add_argument("--warmup", type=int, default=2, help="unmeasured rounds")
    return parser.parse_args()


def set_rank_environment():
    """What shoal-rank sets, for a plain mpirun."""
    os.environ.setdefault("RANK", os.environ.get("OMPI_COMM_WORLD_RANK", "0"))
    os.environ.setdefault("WORLD_SIZE", os.environ.get("OMPI_COMM_WORLD_SIZE", "1"))
    os.environ.setdefault("LOCAL_RANK", os.environ.get("OMPI_COMM_WORLD_LOCAL_RANK", "0"))
    os.environ.setdefault("LOCAL_WORLD_SIZE", os.environ.get("OMPI_COMM_WORLD_LOCAL_SIZE", "1"))
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29533")


def wide_mlp(width: int) -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(width // 2, width),
        torch.nn.ReLU(),
        torch.nn.Linear(width, width),
        torch.nn.ReLU(),
        torch.nn.Linear(width, width // 2),
    )


def torch_defaults_ddp(model: torch.nn.Module) -> DDP:
    """torch's DDP on the default group as torch configures it, without Shoal's defaults."""
    os.environ["SHOAL_TORCH_DDP_DEFAULTS"] = "0"
    try:
        return DDP(model)
    finally:
        del os.environ["SHOAL_TORCH_DDP_DEFAULTS"]


def make_step(model: DDP, width: int, batch: int):
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-4)
    x, y = torch.randn(batch, width // 2), torch.randn(batch, width // 2)

    def step() -> float:
        dist.barrier()  # start together: time the step, not the previous rank's skew
        start = time.perf_counter()
        optimizer.zero_grad(set_to_none=False)
        torch.nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
        return time.perf_counter() - start

    return step


def main():
    args = parse_args()
    set_rank_environment()
    torch.set_num_threads(1)  # ranks share the cores; compute must not crowd out the comms
    dist.init_process_group(backend="shoal")
    gloo = dist.new_group(backend="gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    steps = {
        "shoal": make_step(DDP(wide_mlp(args.width)), args.width, args.batch),
        "shoal-as-torch": make_step(
            torch_defaults_ddp(wide_mlp(args.width)), args.width, args.batch
        ),
        "gloo": make_step(DDP(wide_mlp(args.width), process_group=gloo), args.width, args.batch),
        "shoal-wrapper": make_step(ShoalDDP(wide_mlp(args.width)), args.width, args.batch),
    }
    params = sum(p.numel() for p in wide_mlp(args.width).parameters())
    times = {name: [] for name in steps}
    ratios = {name: [] for name in steps if name != "gloo"}
    for round_index in range(args.warmup + args.rounds):
        names = list(steps)
        order = names[round_index % len(names):] + names[: round_index % len(names)]
        measured = {name: steps[name]() for name in order}
        if round_index >= args.warmup:
            for name, seconds in measured.items():
                times[name].append(seconds)
            for name in ratios:
                ratios[name].append(measured[name] / measured["gloo"])
    if rank == 0:
        print(f"DDP step, wide MLP: {params / 1e6:.1f}M parameters "
              f"({params * 4 / 2**20:.0f} MiB of fp32 gradients), batch {args.batch}, "
              f"{world} ranks, {args.rounds} rounds")
        for name in steps:
            print(f"  {name:>14}: median step {statistics.median(times[name]) * 1e3:8.1f} ms")
        for name in ratios:
            print(f"  median ratio {name}/gloo: {statistics.median(ratios[name]):.3f} "
                  "(target <= 0.8)")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
