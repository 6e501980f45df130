"""CUDA tensors on Shoal's host-staged backend against gloo's (gloo stages through host
memory too), in one run, ranks spawned by torch (a GPU machine has no mpirun):

    .venv/bin/python benchmarks/gpu_allreduce.py [--ranks 2] [--rounds 20]

Prints per size the median `all_reduce` time on a shoal group and on a gloo group over the
same CUDA tensors, the ratio (target >= 3x at 1 MiB and 64 MiB), and, for the overlap target,
the two stages alone: the host copies (device to pinned host and back) and the CPU reduction
of the same bytes (Shoal's backend on host tensors); Shoal's time over the longer of the two
should stay <= 1.3. Then a DDP step of a model of --params parameters (target: shoal's step
<= 0.8x gloo's). Ranks share the GPUs round-robin (two ranks on one GPU is fine for both
host-staged backends). `--device cpu` runs the same on CPU tensors (a smoke run anywhere).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

SIZES = {"1M": 1 << 20, "64M": 64 << 20}


def timed(fn, rounds: int, sync) -> float:
    """Median seconds of fn() over `rounds`, after two warm-up calls."""
    for _ in range(2):
        fn()
    sync()
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def group_times(dist, torch, device, rounds, sync):
    out = {}
    for name, nbytes in SIZES.items():
        tensor = torch.ones(nbytes // 4, device=device)
        out[name] = timed(lambda t=tensor: dist.all_reduce(t), rounds, sync)
    return out


def stage_times(dist, torch, device, rounds, sync):
    """The host copies alone, and the CPU reduction alone, per size (shoal group)."""
    out = {}
    for name, nbytes in SIZES.items():
        on_device = torch.ones(nbytes // 4, device=device)
        host = torch.empty(nbytes // 4, pin_memory=device.type == "cuda")

        def copies(d=on_device, h=host):
            h.copy_(d, non_blocking=True)
            d.copy_(h, non_blocking=True)

        cpu = torch.ones(nbytes // 4)
        out[name] = (timed(copies, rounds, sync), timed(lambda c=cpu: dist.all_reduce(c), rounds,
                                                        sync))
    return out


def ddp_step_time(dist, torch, device, params, rounds, sync):
    width = int((params / 2) ** 0.5)  # two square layers
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.ReLU(),
                                torch.nn.Linear(width, width)).to(device)
    ids = [device.index] if device.type == "cuda" else None
    ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=ids)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.01)
    x = torch.randn(8, width, device=device)

    def step():
        optimizer.zero_grad()
        ddp(x).sum().backward()
        optimizer.step()

    return timed(step, rounds, sync)


def rank_main(rank, args, ports, results):
    import shoal.dataparallel.torch  # noqa: F401 - registers the backend
    import torch
    import torch.distributed as dist

    if args.device == "cuda":
        torch.cuda.set_device(rank % torch.cuda.device_count())
        device, sync = torch.device("cuda", torch.cuda.current_device()), torch.cuda.synchronize
    else:
        device, sync = torch.device("cpu"), (lambda: None)
    row = {}
    for backend, port in zip(("shoal", "gloo"), ports):
        dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                world_size=args.ranks)
        row[backend] = group_times(dist, torch, device, args.rounds, sync)
        if backend == "shoal":
            row["stages"] = stage_times(dist, torch, device, args.rounds, sync)
        row[f"{backend}-ddp"] = ddp_step_time(dist, torch, device, args.params, args.rounds, sync)
        dist.destroy_process_group()
    results.put((rank, row))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--params", type=float, default=100e6)
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    args = parser.parse_args()
    import torch
    import torch.multiprocessing as mp
    from shoal.launcher.ports import free_port

    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("no CUDA device here (torch.cuda.is_available() is False); "
                         "--device cpu runs the same on CPU tensors")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    ctx = mp.get_context("spawn")
    results = ctx.SimpleQueue()
    ports = (free_port(), free_port())
    mp.start_processes(rank_main, args=(args, ports, results), nprocs=args.ranks,
                       start_method="spawn", join=True)
    row = dict(results.get() for _ in range(args.ranks))[0]  # rank 0's view
    device = torch.cuda.get_device_name(0) if args.device == "cuda" else "CPU"
    print(f"{args.ranks} ranks on {device}, {args.rounds} rounds, medians")
    print("| size | shoal | gloo | x gloo | host copies | CPU reduction | shoal / longer stage |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name in SIZES:
        ours, theirs = row["shoal"][name], row["gloo"][name]
        copies, reduction = row["stages"][name]
        print(f"| {name}iB | {ours * 1e3:.2f} ms | {theirs * 1e3:.2f} ms | {theirs / ours:.1f} | "
              f"{copies * 1e3:.2f} ms | {reduction * 1e3:.2f} ms | "
              f"{ours / max(copies, reduction):.2f} |")
    ours, theirs = row["shoal-ddp"], row["gloo-ddp"]
    print(f"DDP step ({args.params / 1e6:.0f}M parameters): shoal {ours * 1e3:.1f} ms, "
          f"gloo {theirs * 1e3:.1f} ms, shoal / gloo {ours / theirs:.2f}")


if __name__ == "__main__":
    main()
