"""Point-to-point benchmark: Shoal's transfers (core API and torch's send/recv on a shoal
group) against gloo and Open MPI (mpi4py), ping-pong between two ranks.

Latency is half a round trip; bandwidth is bytes / one-way time. All libraries run in the
same job, in an order that rotates every round. With 4 ranks as 2 simulated hosts x 2
(SHOAL_HOST per rank), rank 0 (host 0) and rank 2 (host 1) exchange over Shoal's
host-to-host connections; the other ranks wait.

    mpirun --allow-run-as-root --oversubscribe -np 2 .venv/bin/python benchmarks/p2p.py
    mpirun --allow-run-as-root --oversubscribe -np 4 bash -c \\
      'SHOAL_HOST=h$((OMPI_COMM_WORLD_RANK/2)) exec .venv/bin/python benchmarks/p2p.py'
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
import zlib

import numpy as np

SIZES = [4, 1 << 10, 16 << 10, 64 << 10, 1 << 20, 16 << 20, 64 << 20]
MEASURE_SECONDS = 0.05


def parse_size(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    text = text.strip().upper().removesuffix("IB").removesuffix("B")
    return int(float(text[:-1]) * units[text[-1]]) if text and text[-1] in units else int(text)


def human(nbytes: int) -> str:
    for unit, scale in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale:
            return f"{nbytes / scale:g} {unit}"
    return f"{nbytes} B"


class Pair:
    """The libraries, and which two ranks talk (the others sit out)."""

    def __init__(self, comm):
        import shoal.dataparallel.torch  # noqa: F401 - registers the shoal backend
        import torch
        import torch.distributed as dist
        from shoal.dataparallel import core

        rank, size = comm.Get_rank(), comm.Get_size()
        base = 20000 + zlib.crc32(os.environ.get("OMPI_MCA_ess_base_jobid", "0").encode()) % 20000
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(base))
        self.topology = core.init()
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{base + 1}", rank=rank,
                                world_size=size)
        self.shoal_group = dist.new_group(backend="shoal")
        self.core, self.torch, self.dist, self.mpi = core, torch, dist, comm
        self.peer = {0: size // 2, size // 2: 0}.get(rank)  # across hosts when there are two

    def runners(self, send: np.ndarray, recv: np.ndarray):
        peer, first = self.peer, self.mpi.Get_rank() == 0
        core, dist = self.core, self.dist
        ts, tr = self.torch.from_numpy(send), self.torch.from_numpy(recv)
        group = self.shoal_group

        def ping(send_fn, recv_fn):
            if first:
                send_fn(), recv_fn()
            else:
                recv_fn(), send_fn()

        return {
            "shoal": lambda: ping(lambda: core.send(send, peer), lambda: core.recv(recv, peer)),
            "torch": lambda: ping(lambda: dist.send(ts, peer, group=group),
                                  lambda: dist.recv(tr, peer, group=group)),
            "gloo": lambda: ping(lambda: dist.send(ts, peer), lambda: dist.recv(tr, peer)),
            "mpi": lambda: ping(lambda: self.mpi.Send(send, peer), lambda: self.mpi.Recv(recv, peer)),
        }


def timed(fn, comm, iters: int, active: bool) -> float:
    comm.Barrier()
    start = time.perf_counter()
    if active:
        for _ in range(iters):
            fn()
    elapsed = (time.perf_counter() - start) / iters / 2  # one way
    return comm.allreduce(elapsed if active else 0.0, op=_max())


def _max():
    from mpi4py import MPI

    return MPI.MAX


def measure(pair: Pair, nbytes: int, rounds: int) -> dict:
    comm, active = pair.mpi, pair.peer is not None
    send = np.arange(nbytes, dtype=np.uint8)
    recv = np.zeros(nbytes, dtype=np.uint8)
    runs = pair.runners(send, recv)
    names = list(runs)
    iters = {}
    for name in names:
        recv[:] = 0
        if active:
            runs[name]()
            assert np.array_equal(recv, send), f"{name}: wrong bytes"
        per = timed(runs[name], comm, 3, active)
        iters[name] = int(comm.bcast(min(20000, max(3, MEASURE_SECONDS / max(per * 2, 1e-7))), root=0))
    times = {n: [] for n in names}
    for r in range(rounds):
        for name in names[r % len(names):] + names[: r % len(names)]:
            times[name].append(timed(runs[name], comm, iters[name], active))
    row = {"bytes": nbytes}
    for name in names:
        row[name] = statistics.median(times[name])
    for peer in ("gloo", "mpi"):
        for mine in ("shoal", "torch"):
            row[f"{mine}_vs_{peer}"] = statistics.median(
                [p / s for s, p in zip(times[mine], times[peer])])
    return row


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default=",".join(str(s) for s in SIZES))
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    from mpi4py import MPI

    pair = Pair(MPI.COMM_WORLD)
    rows = [measure(pair, parse_size(s), args.rounds) for s in args.sizes.split(",")]
    if MPI.COMM_WORLD.Get_rank() == 0:
        t = pair.topology
        where = "across hosts" if t.num_hosts > 1 else "inside a host"
        print(f"point-to-point ping-pong {where}: {t.size} ranks on {t.num_hosts} host(s), "
              f"{os.cpu_count()} cores; one-way times, medians over rounds")
        head = (f"{'size':>9} | {'shoal us':>9} {'GB/s':>6} | {'torch us':>9} | {'gloo us':>9} "
                f"{'GB/s':>6} | {'mpi us':>9} {'GB/s':>6} | {'x gloo':>7} {'x mpi':>6} | "
                f"{'torch x gloo':>12} {'torch x mpi':>11}")
        print(head)
        print("-" * len(head))
        for r in rows:
            bw = lambda t, r=r: r["bytes"] / t / 1e9  # noqa: E731
            print(f"{human(r['bytes']):>9} | {r['shoal'] * 1e6:9.1f} {bw(r['shoal']):6.2f} | "
                  f"{r['torch'] * 1e6:9.1f} | {r['gloo'] * 1e6:9.1f} {bw(r['gloo']):6.2f} | "
                  f"{r['mpi'] * 1e6:9.1f} {bw(r['mpi']):6.2f} | {r['shoal_vs_gloo']:7.1f} "
                  f"{r['shoal_vs_mpi']:6.2f} | {r['torch_vs_gloo']:12.1f} {r['torch_vs_mpi']:11.2f}")
        print("shoal: core.send/recv; torch: torch.distributed.send/recv on a shoal group; "
              "'x peer': median paired ratio peer time / Shoal time")
    pair.dist.destroy_process_group()
    pair.core.shutdown()


if __name__ == "__main__":
    main()
