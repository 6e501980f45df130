"""Training-step benchmark: torch FSDP (``fully_shard``) and a 1F1B pipeline on a shoal
group against the same on a gloo group, in one job, alternating every round.

    mpirun --allow-run-as-root --oversubscribe -np 2 .venv/bin/python benchmarks/framework_step.py

Prints per framework the median step time on each backend and the ratio shoal / gloo (the
target: <= 0.8). The pipeline's default model is narrow and cut in many microbatches, so
that its step depends on the stage-to-stage transfers (a wide model's pipeline step is
compute: both backends then take the same time).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
import zlib


def mlp(width: int, depth: int):
    import torch
    import torch.nn as nn

    torch.manual_seed(0)
    layers = []
    for _ in range(depth):
        layers += [nn.Linear(width, width), nn.ReLU()]
    return nn.Sequential(*layers)


def fsdp_step(group, width, depth, batch):
    import torch
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import fully_shard

    model = mlp(width, depth)
    mesh = DeviceMesh.from_group(group, "cpu")
    for layer in model:
        if hasattr(layer, "weight"):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(batch, width)

    def step():
        model(x).square().mean().backward()
        opt.step()
        opt.zero_grad()

    return step


def pipeline_step(group, rank, width, depth, batch, microbatches):
    import torch
    import torch.distributed.pipelining as pp

    layers = list(mlp(width, depth))
    half = len(layers) // 2
    chunk = torch.nn.Sequential(*(layers[:half] if rank == 0 else layers[half:]))
    stage = pp.PipelineStage(chunk, rank, 2, torch.device("cpu"), group=group)
    sched = pp.Schedule1F1B(stage, n_microbatches=microbatches,
                            loss_fn=lambda o, t: ((o - t) ** 2).mean())
    opt = torch.optim.SGD(chunk.parameters(), lr=1e-3)
    x, y = torch.randn(batch, width), torch.randn(batch, width)

    def step():
        sched.step(x) if rank == 0 else sched.step(target=y)
        opt.step()
        opt.zero_grad()

    return step


def timed(step, comm, iters):
    from mpi4py import MPI

    comm.Barrier()
    start = time.perf_counter()
    for _ in range(iters):
        step()
    return comm.allreduce((time.perf_counter() - start) / iters, op=MPI.MAX)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--iters", type=int, default=5)
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--depth", type=int, default=8)
    parser.add_argument("--batch", type=int, default=32)
    # The pipeline: a narrow model cut in many microbatches, so that its step is
    # dominated by the activations and gradients crossing the stages.
    parser.add_argument("--pipe-width", type=int, default=256)
    parser.add_argument("--pipe-depth", type=int, default=4)
    parser.add_argument("--pipe-batch", type=int, default=64)
    parser.add_argument("--microbatches", type=int, default=16)
    args = parser.parse_args(argv)
    import shoal.dataparallel.torch  # noqa: F401 - registers the shoal backend
    import torch
    import torch.distributed as dist
    from mpi4py import MPI

    torch.set_num_threads(1)
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    base = 20000 + zlib.crc32(os.environ.get("OMPI_MCA_ess_base_jobid", "0").encode()) % 20000
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{base + 1}", rank=rank,
                            world_size=size)
    groups = {"shoal": dist.new_group(backend="shoal"), "gloo": dist.new_group(backend="gloo")}
    w, d, b = args.width, args.depth, args.batch
    steps = {
        ("FSDP fully_shard", name): fsdp_step(g, w, d, b) for name, g in groups.items()
    }
    if size == 2:
        shape = (args.pipe_width, args.pipe_depth, args.pipe_batch, args.microbatches)
        steps.update({("1F1B pipeline", name): pipeline_step(g, rank, *shape)
                      for name, g in groups.items()})
    for step in steps.values():
        step()  # warm-up
    times = {key: [] for key in steps}
    keys = list(steps)
    for r in range(args.rounds):
        for key in keys[r % len(keys):] + keys[: r % len(keys)]:
            times[key].append(timed(steps[key], comm, args.iters))
    if rank == 0:
        print(f"training step, {size} ranks, {os.cpu_count()} cores, torch threads 1; medians over "
              f"{args.rounds} rounds of {args.iters} steps; FSDP: MLP {d} x {w}, batch {b}; "
              f"1F1B: MLP {args.pipe_depth} x {args.pipe_width}, batch {args.pipe_batch} in "
              f"{args.microbatches} microbatches")
        print(f"{'framework':>18} | {'shoal ms':>9} | {'gloo ms':>9} | {'shoal/gloo':>10}")
        for framework in dict.fromkeys(k[0] for k in keys):
            s, g = times[(framework, "shoal")], times[(framework, "gloo")]
            ratio = statistics.median([a / c for a, c in zip(s, g)])
            print(f"{framework:>18} | {statistics.median(s) * 1e3:9.1f} | "
                  f"{statistics.median(g) * 1e3:9.1f} | {ratio:10.2f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
