"""Where a small torch.distributed.all_reduce on a shoal group spends its time: the same
4 KiB allreduce called through each layer between a training script and the core.

    mpirun --allow-run-as-root --oversubscribe -np 2 .venv/bin/python benchmarks/torch_overhead.py

Layers, outermost first:

- ``dist.all_reduce``: torch's Python function (argument checks, options, group lookup,
  coalescing state), then the layers below;
- ``ProcessGroup.allreduce + wait``: torch's C++ ProcessGroup, which dispatches the
  ``c10d::allreduce_`` operator to the backend registered for the tensor's device;
- ``shoal Backend.allreduce + wait``: Shoal's c10d backend called directly (its work runs on
  the caller's thread when nothing is queued);
- ``core.allreduce``: Shoal's core API on the numpy view of the same buffer.

The difference between two adjacent lines is what that layer costs. The same layers of a
gloo group are printed for comparison.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
import zlib

import numpy as np


def timed(fn, comm, calls: int) -> float:
    from mpi4py import MPI

    for _ in range(200):
        fn()
    comm.Barrier()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return comm.allreduce((time.perf_counter() - start) / calls, op=MPI.MAX)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bytes", type=int, default=4096)
    parser.add_argument("--calls", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    import torch
    import torch.distributed as dist
    from mpi4py import MPI
    from shoal.dataparallel import core

    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    base = 20000 + zlib.crc32(os.environ.get("OMPI_MCA_ess_base_jobid", "0").encode()) % 20000
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(base))
    core.init()
    import shoal.dataparallel.torch  # noqa: F401 - registers the shoal backend

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{base + 1}", rank=rank,
                            world_size=size)
    shoal_group = dist.new_group(backend="shoal")
    buf = np.zeros(args.bytes // 4, np.float32)
    tensor = torch.from_numpy(buf)
    opts = dist.AllreduceOptions()
    cpu = torch.device("cpu")
    layers = {}
    for name, group in (("shoal", shoal_group), ("gloo", dist.group.WORLD)):
        backend = group._get_backend(cpu)
        layers[f"{name}: dist.all_reduce"] = lambda g=group: dist.all_reduce(tensor, group=g)
        layers[f"{name}: ProcessGroup.allreduce + wait"] = lambda g=group: g.allreduce([tensor]).wait()
        layers[f"{name}: Backend.allreduce + wait"] = lambda b=backend: b.allreduce([tensor], opts).wait()
    layers["shoal: core.allreduce"] = lambda: core.allreduce(buf)
    calls = {name: args.calls if name.startswith("shoal") else max(50, args.calls // 200)
             for name in layers}
    times = {name: [] for name in layers}
    for _ in range(args.rounds):
        for name, fn in layers.items():
            times[name].append(timed(fn, comm, calls[name]))
    if rank == 0:
        print(f"allreduce of {args.bytes} bytes, {size} ranks; medians over {args.rounds} rounds")
        for name in layers:
            print(f"  {name:42s} {statistics.median(times[name]) * 1e6:9.2f} us")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
