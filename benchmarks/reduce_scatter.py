"""Reduce-scatter and allgather benchmark: Shoal (core API and torch's
reduce_scatter_tensor / all_gather_into_tensor on a shoal group) against gloo and Open MPI
(Reduce_scatter_block, Allgather), in one job, in an order that rotates every round.

busbw follows nccl-tests: algbw = whole buffer / time, busbw = algbw * (n-1)/n.

    mpirun --allow-run-as-root --oversubscribe -np 2 .venv/bin/python benchmarks/reduce_scatter.py
    mpirun --allow-run-as-root --oversubscribe -np 4 bash -c \\
      'SHOAL_HOST=h$((OMPI_COMM_WORLD_RANK/2)) exec .venv/bin/python benchmarks/reduce_scatter.py'
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
import zlib

import numpy as np

SIZES = [1 << 20, 4 << 20, 16 << 20, 64 << 20]
MEASURE_SECONDS = 0.05


def parse_size(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    text = text.strip().upper().removesuffix("IB").removesuffix("B")
    return int(float(text[:-1]) * units[text[-1]]) if text and text[-1] in units else int(text)


def timed(fn, comm, iters: int) -> float:
    from mpi4py import MPI

    comm.Barrier()
    start = time.perf_counter()
    for _ in range(iters):
        fn()
    return comm.allreduce((time.perf_counter() - start) / iters, op=MPI.MAX)


def setup(comm):
    import shoal.dataparallel.torch  # noqa: F401 - registers the shoal backend
    import torch.distributed as dist
    from shoal.dataparallel import core

    rank, size = comm.Get_rank(), comm.Get_size()
    base = 20000 + zlib.crc32(os.environ.get("OMPI_MCA_ess_base_jobid", "0").encode()) % 20000
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(base))
    topology = core.init()
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{base + 1}", rank=rank,
                            world_size=size)
    return topology, core, dist, dist.new_group(backend="shoal")


def runners(core, dist, group, comm, whole: np.ndarray, block: np.ndarray):
    import torch
    from mpi4py import MPI

    tw, tb = torch.from_numpy(whole), torch.from_numpy(block)
    rs = {
        "shoal": lambda: core._binding().reduce_scatter(core._target(None), whole, block, 0, 0),
        "torch": lambda: dist.reduce_scatter_tensor(tb, tw, group=group),
        "gloo": lambda: dist.reduce_scatter_tensor(tb, tw),
        "mpi": lambda: comm.Reduce_scatter_block(whole, block, op=MPI.SUM),
    }
    ag = {
        "shoal": lambda: core._binding().allgather(core._target(None), block, whole),
        "torch": lambda: dist.all_gather_into_tensor(tw, tb, group=group),
        "gloo": lambda: dist.all_gather_into_tensor(tw, tb),
        "mpi": lambda: comm.Allgather(block, whole),
    }
    return {"reduce_scatter": rs, "allgather": ag}


def measure(libs, comm, nbytes: int, rounds: int) -> dict:
    size = comm.Get_size()
    whole = np.zeros(nbytes // 4, dtype=np.float32)
    block = np.zeros(nbytes // 4 // size, dtype=np.float32)
    out = {}
    for coll, runs in runners(*libs, comm, whole, block).items():
        names = list(runs)
        for name in names:  # gloo's reduce_scatter_tensor may be missing: dropped then
            try:
                runs[name]()
            except (RuntimeError, NotImplementedError) as error:
                if comm.Get_rank() == 0:
                    print(f"{coll} on {name}: {str(error).splitlines()[0]}")
                runs[name] = None
        names = [n for n in names if runs[n] is not None]
        iters = {n: int(comm.bcast(max(3, min(2000, MEASURE_SECONDS / timed(runs[n], comm, 2))),
                                   root=0)) for n in names}
        times = {n: [] for n in names}
        for r in range(rounds):
            for n in names[r % len(names):] + names[: r % len(names)]:
                times[n].append(timed(runs[n], comm, iters[n]))
        row = {n: statistics.median(times[n]) for n in names}
        for peer in ("gloo", "mpi"):
            for mine in ("shoal", "torch"):
                if peer in times:
                    row[f"{mine}/{peer}"] = statistics.median(
                        [p / s for s, p in zip(times[mine], times[peer])])
        out[coll] = row
    return out


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default=",".join(str(s) for s in SIZES))
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    topology, core, dist, group = setup(comm)
    rows = [(parse_size(s), measure((core, dist, group), comm, parse_size(s), args.rounds))
            for s in args.sizes.split(",")]
    if comm.Get_rank() == 0:
        n = comm.Get_size()
        print(f"reduce_scatter / allgather float32, {n} ranks on {topology.num_hosts} host(s), "
              f"{os.cpu_count()} cores; busbw GB/s (algbw * (n-1)/n), medians over rounds")
        for coll in ("reduce_scatter", "allgather"):
            head = (f"{coll:>15} {'size':>8} | {'shoal':>6} {'torch':>6} {'gloo':>6} {'mpi':>6} | "
                    f"{'x gloo':>7} {'x mpi':>6} | {'torch x gloo':>12} {'torch x mpi':>11}")
            print(head)
            print("-" * len(head))
            for nbytes, out in rows:
                r = out[coll]
                bus = lambda name, r=r, nbytes=nbytes: (  # noqa: E731
                    nbytes / r[name] / 1e9 * (n - 1) / n if name in r else float("nan"))
                get = lambda key, r=r: r.get(key, float("nan"))  # noqa: E731
                print(f"{'':>15} {nbytes >> 20:>5} MiB | {bus('shoal'):6.2f} {bus('torch'):6.2f} "
                      f"{bus('gloo'):6.2f} {bus('mpi'):6.2f} | {get('shoal/gloo'):7.1f} "
                      f"{get('shoal/mpi'):6.2f} | {get('torch/gloo'):12.1f} {get('torch/mpi'):11.2f}")
    dist.destroy_process_group()
    core.shutdown()


if __name__ == "__main__":
    main()
