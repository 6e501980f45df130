"""Allreduce benchmark: Shoal's collective core and its torch backend against gloo and Open MPI.

Run every rank under one mpirun; all three libraries run in the same job, on
the same buffers, in an order that rotates every round, so that machine load
affects them alike. Prints, per size: time, algbw and busbw (nccl-tests:
busbw = algbw * 2(n-1)/n) of each library, the time of a plain memcpy of the
same size run concurrently on every rank, and the medians of the per-round
ratios (Shoal busbw / peer busbw).

    mpirun --allow-run-as-root --oversubscribe -np 2 .venv/bin/python benchmarks/allreduce.py

Two simulated hosts x 2 ranks (Shoal groups ranks by SHOAL_HOST):

    mpirun --allow-run-as-root --oversubscribe -np 4 bash -c \\
      'SHOAL_HOST=h$((OMPI_COMM_WORLD_RANK/2)) exec .venv/bin/python benchmarks/allreduce.py'
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
import zlib

import numpy as np

SIZES = [4 << 10, 64 << 10, 1 << 20, 16 << 20, 64 << 20, 256 << 20]


def parse_size(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    text = text.strip().upper().removesuffix("IB").removesuffix("B")
    if text and text[-1] in units:
        return int(float(text[:-1]) * units[text[-1]])
    return int(text)


def human(nbytes: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale:
            return f"{nbytes / scale:g} {unit}"
    return f"{nbytes} B"


MEASURE_SECONDS = 0.02  # how long one library's measurement in a round lasts


def iterations(fn, comm) -> int:
    """Calls per measurement so that it lasts about MEASURE_SECONDS (steady state, not
    the first calls after another library ran), the same on every rank."""
    per_call = timed(fn, comm, 3)
    return int(min(5000, max(3, MEASURE_SECONDS / per_call)))


class Libraries:
    """The allreduce implementations, set up side by side in one job: Shoal's core API,
    torch.distributed on a shoal process group, gloo and Open MPI."""

    def __init__(self, comm):
        import torch
        import torch.distributed as dist
        from shoal.dataparallel import core

        self.mpi = comm
        rank, size = comm.Get_rank(), comm.Get_size()
        base = 20000 + zlib.crc32(os.environ.get("OMPI_MCA_ess_base_jobid", "0").encode()) % 20000
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(base))
        self.shoal = core
        self.topology = core.init()
        import shoal.dataparallel.torch  # noqa: F401 - registers the shoal backend

        # the job's master (algo-1 for hosts in namespaces of their own), else this machine
        dist.init_process_group(
            "gloo", init_method=f"tcp://{os.environ['MASTER_ADDR']}:{base + 1}", rank=rank,
            world_size=size)
        # A world-sized shoal group: it runs on the core's world communicator, as a
        # script's default group on backend "shoal" does.
        self.shoal_group = dist.new_group(backend="shoal")
        self.torch, self.dist = torch, dist

    def runners(self):
        from mpi4py import MPI

        def shoal(buf):
            self.shoal.allreduce(buf)

        tensors = {}

        def gloo(buf):
            t = tensors.get(id(buf))
            if t is None:
                t = tensors[id(buf)] = self.torch.from_numpy(buf)
            self.dist.all_reduce(t)

        def torch_shoal(buf):
            t = tensors.get(id(buf))
            if t is None:
                t = tensors[id(buf)] = self.torch.from_numpy(buf)
            self.dist.all_reduce(t, group=self.shoal_group)

        def openmpi(buf):
            self.mpi.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM)

        return {"shoal": shoal, "torch": torch_shoal, "gloo": gloo, "mpi": openmpi}


def check(run, comm, count: int) -> None:
    """One allreduce of known integers-as-floats: exact, so compared exactly."""
    rank, size = comm.Get_rank(), comm.Get_size()
    buf = (np.arange(count, dtype=np.float32) % 97) + rank
    run(buf)
    expected = size * (np.arange(count, dtype=np.float32) % 97) + size * (size - 1) / 2
    if not np.array_equal(buf, expected):
        raise SystemExit(f"wrong allreduce result on rank {rank}")


def timed(fn, comm, iters: int) -> float:
    """Seconds per call, the slowest rank's."""
    comm.Barrier()
    start = time.perf_counter()
    for _ in range(iters):
        fn()
    elapsed = (time.perf_counter() - start) / iters
    return comm.allreduce(elapsed, op=_max())


def _max():
    from mpi4py import MPI

    return MPI.MAX


def measure(libs: Libraries, nbytes: int, rounds: int) -> dict:
    comm = libs.mpi
    size = comm.Get_size()
    count = nbytes // 4
    runners = libs.runners()
    names = list(runners)
    buf = np.zeros(count, dtype=np.float32)  # zeros: repeated sums stay finite
    src = np.ones(count, dtype=np.float32)
    for name in names:
        check(runners[name], comm, count)
        runners[name](buf)  # warm-up: page faults, connections
    iters = {name: iterations(lambda n=name: runners[n](buf), comm) for name in names}
    copy_iters = iterations(lambda: np.copyto(buf, src), comm)
    buf[:] = 0
    times = {name: [] for name in names}
    memcpy = []
    for r in range(rounds):
        order = names[r % len(names):] + names[: r % len(names)]
        for name in order:
            times[name].append(timed(lambda n=name: runners[n](buf), comm, iters[name]))
        memcpy.append(timed(lambda: np.copyto(buf, src), comm, copy_iters))
        buf[:] = 0
    factor = 2 * (size - 1) / size
    result = {"bytes": nbytes, "memcpy": statistics.median(memcpy)}
    for name in names:
        t = statistics.median(times[name])
        result[name] = {"time": t, "algbw": nbytes / t / 1e9, "busbw": nbytes / t / 1e9 * factor}
    for peer in ("gloo", "mpi"):
        for mine in ("shoal", "torch"):
            ratios = [p / s for s, p in zip(times[mine], times[peer])]
            result[f"{mine}_vs_{peer}"] = statistics.median(ratios)
    # The torch path's cost over the core API's (1.0: none).
    result["torch_over_core"] = statistics.median(
        [t / s for s, t in zip(times["shoal"], times["torch"])]
    )
    return result


def print_table(rows: list[dict], libs: Libraries) -> None:
    topo = libs.topology
    print(
        f"allreduce float32 sum, {topo.size} ranks on {topo.num_hosts} host(s) "
        f"({topo.local_size} per host), {os.cpu_count()} cores; times are medians over rounds"
    )
    head = (
        f"{'size':>10} | {'shoal us':>9} {'busbw':>6} | {'torch us':>9} {'busbw':>6} "
        f"| {'gloo us':>9} {'busbw':>6} | {'mpi us':>9} {'busbw':>6} | {'memcpy us':>9} "
        f"| {'x gloo':>7} {'x mpi':>6} | {'torch x gloo':>12} {'torch x mpi':>11} {'torch/core':>10}"
    )
    print(head)
    print("-" * len(head))
    for row in rows:
        s, t, g, m = row["shoal"], row["torch"], row["gloo"], row["mpi"]
        print(
            f"{human(row['bytes']):>10} | {s['time'] * 1e6:9.1f} {s['busbw']:6.2f} "
            f"| {t['time'] * 1e6:9.1f} {t['busbw']:6.2f} "
            f"| {g['time'] * 1e6:9.1f} {g['busbw']:6.2f} | {m['time'] * 1e6:9.1f} {m['busbw']:6.2f} "
            f"| {row['memcpy'] * 1e6:9.1f} | {row['shoal_vs_gloo']:7.1f} {row['shoal_vs_mpi']:6.1f} "
            f"| {row['torch_vs_gloo']:12.1f} {row['torch_vs_mpi']:11.2f} {row['torch_over_core']:10.2f}"
        )
    print("bandwidths in GB/s; shoal: the core API; torch: torch.distributed.all_reduce on a shoal "
          "group; 'x peer': median over rounds of the paired ratio peer time / Shoal time; "
          "torch/core: torch path time / core API time")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default=",".join(str(s) for s in SIZES),
                        help="comma-separated sizes in bytes (suffixes K, M, G)")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    from mpi4py import MPI

    libs = Libraries(MPI.COMM_WORLD)
    rows = [measure(libs, parse_size(s), args.rounds) for s in args.sizes.split(",")]
    if MPI.COMM_WORLD.Get_rank() == 0:
        print_table(rows, libs)
    libs.dist.destroy_process_group()
    libs.shoal.shutdown()


if __name__ == "__main__":
    main()
