"""Pipeline benchmark: Shoal's SMP runtime against torch.distributed.pipelining (Schedule1F1B
on gloo) for the same model, split and microbatches, measured in the same jobs.

    .venv/bin/python benchmarks/pipeline.py [--steps 8] [--width 384]

For each configuration (pipeline p = 2 and 4, microbatches m = 4 and 8) one mpirun job
runs, per round, a step of each: smp (``interleaved``, manual contiguous partition) and
torch's 1F1B schedule. It prints:

- the idle fraction of each pipeline stage in an smp step, from the ranks' timelines
  (``SHOAL_MP_TIMELINE``), beside the bubble of the schedule, (p-1)/(m+p-1);
- the step times of both and the ratio torch / smp (> 1: smp is faster);
- the memory: the share of the parameters each rank holds, and the most microbatches'
  activations a rank held at once under ``interleaved`` and under ``simple`` (m = 8).

The model is a stack of identical wide blocks, so a stage's compute dwarfs its transfers.
On a machine with fewer cores than ranks the stages share cores, and a stage waiting for a
core counts as idle: the bubble is then larger than the schedule's.
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
import zlib

HERE = os.path.abspath(__file__)
MPIRUN = ["mpirun", "--allow-run-as-root", "--oversubscribe"]


def blocks(width: int, depth: int):
    import torch
    from torch import nn

    torch.manual_seed(0)
    return nn.Sequential(*[nn.Sequential(nn.Linear(width, width), nn.Tanh())
                           for _ in range(depth)])


def smp_step(smp, width, depth, batch):
    import torch
    import torch.nn.functional as F

    net = blocks(width, depth)
    pp = smp.pp_size()
    for i, block in enumerate(net):
        smp.set_partition(block, i * pp // depth)
    model = smp.DistributedModel(net)
    optimizer = smp.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=1e-3))
    x, y = torch.randn(batch, width), torch.randn(batch, width)

    @smp.step
    def train(model, x, y):
        loss = F.mse_loss(model(x), y)
        model.backward(loss)
        return loss

    def step():
        optimizer.zero_grad()
        train(model, x, y)
        optimizer.step()

    return step, model


def torch_1f1b_step(group, rank, size, width, depth, batch, microbatches):
    import torch
    import torch.distributed.pipelining as pipelining

    net = blocks(width, depth)
    per = depth // size
    stage_module = torch.nn.Sequential(*list(net)[rank * per:(rank + 1) * per])
    stage = pipelining.PipelineStage(stage_module, rank, size, torch.device("cpu"), group=group)
    schedule = pipelining.Schedule1F1B(stage, n_microbatches=microbatches,
                                       loss_fn=lambda o, t: ((o - t) ** 2).mean())
    optimizer = torch.optim.SGD(stage_module.parameters(), lr=1e-3)
    x, y = torch.randn(batch, width), torch.randn(batch, width)

    def step():
        optimizer.zero_grad()
        if rank == 0:
            schedule.step(x)
        elif rank == size - 1:
            schedule.step(target=y)
        else:
            schedule.step()
        optimizer.step()

    return step


def worker(args) -> None:
    import smdistributed.modelparallel.torch as smp
    import torch
    import torch.distributed as dist
    from mpi4py import MPI

    torch.set_num_threads(1)
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    smp.init({"partitions": size, "microbatches": args.microbatches, "pipeline": args.pipeline,
              "active_microbatches": args.microbatches if args.pipeline == "simple"
              else min(size + 2, args.microbatches),
              "auto_partition": False, "default_partition": 0})
    port = 20000 + zlib.crc32(os.environ.get("OMPI_MCA_ess_base_jobid", "0").encode()) % 20000
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port + 3}", rank=rank,
                            world_size=size)
    ours, model = smp_step(smp, args.width, args.depth, args.batch)
    theirs = None
    if args.compare:
        theirs = torch_1f1b_step(dist.group.WORLD, rank, size, args.width, args.depth,
                                 args.batch, args.microbatches)
    ours()  # warm-up (and partition)
    if theirs:
        theirs()
    times = {"smp": [], "torch": []}
    for _ in range(args.steps):
        for name, step in (("smp", ours), ("torch", theirs)):
            if step is None:
                continue
            comm.Barrier()
            start = time.perf_counter()
            step()
            times[name].append(comm.allreduce(time.perf_counter() - start, op=MPI.MAX))
    held = sum(p.numel() for p in model.local_parameters())
    total = sum(p.numel() for p in blocks(args.width, args.depth).parameters())
    engine = smp.state.engine
    in_flight = engine.scheduler.peak_alive if smp.pp_rank() == 0 else engine.peak_kept
    report = {"rank": rank, "held": held / total, "in_flight": in_flight,
              "smp": statistics.median(times["smp"]),
              "torch": statistics.median(times["torch"]) if times["torch"] else None}
    reports = comm.gather(report, root=0)
    if rank == 0:
        print("RESULT " + json.dumps(reports), flush=True)
    dist.destroy_process_group()


def run_job(p, m, pipeline, args, compare=True) -> tuple[list[dict], list[float]]:
    with tempfile.TemporaryDirectory(prefix="shoal-pipeline-") as folder:
        env = dict(os.environ, SHOAL_MP_TIMELINE=folder)
        argv = [*MPIRUN, "-np", str(p), "-x", "SHOAL_MP_TIMELINE", sys.executable, HERE,
                "worker", "--microbatches", str(m), "--pipeline", pipeline,
                "--steps", str(args.steps), "--width", str(args.width),
                "--depth", str(args.depth), "--batch", str(args.batch)]
        if compare:
            argv.append("--compare")
        done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=1200)
        if done.returncode != 0:
            raise SystemExit(done.stdout[-3000:] + done.stderr[-3000:])
        line = next(x for x in done.stdout.splitlines() if x.startswith("RESULT "))
        reports = json.loads(line[len("RESULT "):])
        from shoal.modelparallel.torch.timeline import idle_fraction

        idle = []
        for rank in range(p):
            with open(os.path.join(folder, f"timeline-rank{rank}.json")) as handle:
                fractions = idle_fraction(json.load(handle)["traceEvents"])
            idle.append(statistics.mean(fractions[1:]))  # the first step partitions
        return reports, idle


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", nargs="?", default="driver")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--width", type=int, default=384)
    parser.add_argument("--depth", type=int, default=8)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--microbatches", type=int, default=4)
    parser.add_argument("--pipeline", default="interleaved")
    parser.add_argument("--compare", action="store_true")
    parser.add_argument("--pipelines", default="2,4")
    args = parser.parse_args(argv)
    if args.mode == "worker":
        worker(args)
        return
    print(f"pipeline step, MLP {args.depth} x {args.width} (tanh), batch {args.batch}, "
          f"{os.cpu_count()} cores, torch threads 1; medians over {args.steps} steps")
    print(f"{'p':>2} {'m':>2} | {'bubble':>6} | {'idle per stage':>24} | {'smp ms':>7} | "
          f"{'1F1B ms':>7} | {'1F1B/smp':>8} | {'params held':>11}")
    for p in (int(v) for v in args.pipelines.split(",")):
        for m in (4, 8):
            reports, idle = run_job(p, m, "interleaved", args)
            bubble = (p - 1) / (m + p - 1)
            smp_ms, torch_ms = reports[0]["smp"] * 1e3, reports[0]["torch"] * 1e3
            held = " ".join(f"{r['held']:.2f}" for r in reports)
            print(f"{p:>2} {m:>2} | {bubble:6.3f} | {' '.join(f'{f:.3f}' for f in idle):>24} | "
                  f"{smp_ms:7.1f} | {torch_ms:7.1f} | {torch_ms / smp_ms:8.2f} | {held:>11}")
    print("activations held at once (microbatches), pipeline 2, m = 8:")
    for pipeline in ("interleaved", "simple"):
        reports, _ = run_job(2, 8, pipeline, args, compare=False)
        print(f"  {pipeline:>11}: " + ", ".join(f"rank {r['rank']} {r['in_flight']}"
                                               for r in reports))


if __name__ == "__main__":
    main()
