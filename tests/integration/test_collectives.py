"""Collective core under the real mpirun: every dtype, op and size, checked bit
for bit against a numpy model of the core's fixed reduction order, on 1-4 ranks
of one host and on 2 simulated hosts x 2 ranks.

Each configuration is one mpirun job running all cases (this file is also the
worker: ``python test_collectives.py worker``).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import uuid

import numpy as np
import pytest
from shoal.launcher.ports import free_port

MPIRUN = shutil.which("mpirun")
HERE = os.path.abspath(__file__)

DTYPES = ["float32", "float64", "float16", "bfloat16", "int32", "int64"]
OPS = ["sum", "average", "min", "max", "product"]
SIZES = [1, 2, 3, 17, 1000, 4097, 65537, 300001]
BIG = 50_000_000


# ---------------------------------------------------------------- numpy model
def storage_dtype(name):
    if name == "bfloat16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


def accumulator(name):
    return {"float16": np.float32, "bfloat16": np.float32}.get(name, storage_dtype(name).type)


def fold(arrays, op, acc_t):
    acc = arrays[0].astype(acc_t)
    for a in arrays[1:]:
        v = a.astype(acc_t)
        if op in ("sum", "average"):
            acc = acc + v
        elif op == "min":
            acc = np.where(v < acc, v, acc)
        elif op == "max":
            acc = np.where(v > acc, v, acc)
        else:
            acc = acc * v
    return acc


def expected(inputs, dtype, op, hosts):
    """The core's result: local-rank order inside a host, host order across."""
    acc_t, store = accumulator(dtype), storage_dtype(dtype)
    with np.errstate(over="ignore"):
        if len(hosts) == 1:
            acc = fold(inputs, op, acc_t)
        else:
            partials = [fold([inputs[r] for r in ranks], op, acc_t).astype(store) for ranks in hosts]
            acc = fold(partials, op, acc_t)
        if op == "average":
            n = len(inputs)
            if np.issubdtype(acc.dtype, np.integer):
                acc = np.where(acc < 0, -((-acc) // n), acc // n)  # C++ truncation
            else:
                acc = acc / acc.dtype.type(n)
        return acc.astype(store)


def make_input(rng, dtype, op, n):
    if dtype.startswith("int"):
        low, high = (-3, 4) if op == "product" else (-1000, 1000)
        return rng.integers(low, high, n).astype(dtype)
    values = rng.standard_normal(n).astype(np.float32)
    if op == "product":
        values = 1.0 + 0.1 * values  # keeps products of a few ranks finite
    return values.astype(storage_dtype(dtype))


# ---------------------------------------------------------------- the worker
def host_groups(size):
    hosts = {}
    for r in range(size):
        hosts.setdefault(os.environ.get(f"EXPECTED_HOST_{r}", "h"), []).append(r)
    return list(hosts.values())


def digest_all(core, array):
    """Every rank's digest of its result: identical bits on all ranks."""
    d = np.frombuffer(hashlib.sha256(array.tobytes()).digest(), dtype=np.uint8).copy()
    return core.allgather(d)


def worker() -> None:
    from shoal.dataparallel import core

    comm = core.init()
    assert core.init() is not None  # idempotent
    rank, size = comm.rank, comm.size
    hosts = host_groups(size)
    assert comm.num_hosts == len(hosts), (comm, hosts)
    assert comm.local_size == len(hosts[comm.host_index])
    assert hosts[comm.host_index][comm.local_rank] == rank
    if os.environ.get("CHECK_SLOTS_IDLE") == "1":
        cases = check_slots_idle(core, rank, size) + check_reduce_keeps_nothing(core, rank, size)
        finish_worker(core, rank, cases)
        return
    if os.environ.get("CHECK_REDUCE_HEAP") == "1":
        finish_worker(core, rank, check_reduce_keeps_nothing(core, rank, size))
        return
    cases = 0
    for dtype in DTYPES:
        for op in OPS:
            for n in SIZES:
                seed = (DTYPES.index(dtype), OPS.index(op), n)
                inputs = [make_input(np.random.default_rng((*seed, r)), dtype, op, n) for r in range(size)]
                mine = inputs[rank].copy()
                core.allreduce(mine, op=op)
                want = expected(inputs, dtype, op, hosts)
                assert mine.tobytes() == want.tobytes(), f"{dtype} {op} n={n}: {mine[:4]} != {want[:4]}"
                cases += 1
            digests = digest_all(core, mine)
            assert (digests == digests[0]).all(), f"{dtype} {op}: ranks differ"
    cases += check_async_and_fusion(core, rank, size, hosts)
    cases += check_other_collectives(core, rank, size)
    if os.environ.get("CHECK_BIG") == "1":
        cases += check_big(core, rank, size)
    core.barrier()
    core.shutdown()
    print(f"rank {rank}: {cases} cases ok", flush=True)


def check_async_and_fusion(core, rank, size, hosts) -> int:
    specs = [("float32", "sum", 5), ("float32", "sum", 100000), ("float32", "sum", 7),
             ("float64", "max", 33), ("float32", "sum", 1), ("int64", "sum", 999),
             ("float16", "average", 4001), ("float16", "average", 12)] * 3
    arrays, wants, handles = [], [], []
    for i, (dtype, op, n) in enumerate(specs):
        inputs = [make_input(np.random.default_rng((99, i, r)), dtype, op, n) for r in range(size)]
        arrays.append(inputs[rank].copy())
        wants.append(expected(inputs, dtype, op, hosts))
        handles.append(core.allreduce_async(arrays[-1], op=op))
    # Waiting out of order still completes everything (the wait flushes).
    for h in reversed(handles):
        h.wait()
    for a, w, (dtype, op, n) in zip(arrays, wants, specs):
        assert a.tobytes() == w.tobytes(), f"async {dtype} {op} n={n}"
    return len(specs)


def check_other_collectives(core, rank, size) -> int:
    cases = 0
    # One element, one chunk, many chunks, several 4 MiB blocks (odd sizes);
    # an allreduce between broadcasts checks that the counters stay in step.
    for root in range(size):
        for n in (1, 1001, 150_001, 1_300_001):
            data = np.random.default_rng((7, root, n)).standard_normal(n).astype(np.float64)
            mine = data.copy() if rank == root else np.full(n, -1.0)
            core.broadcast(mine, root=root)
            assert mine.tobytes() == data.tobytes(), f"broadcast root={root} n={n}"
            token = np.ones(3, dtype=np.int32)
            core.allreduce(token)
            assert (token == size).all()
            cases += 1
    # Up to several chunks per column, odd sizes (columns straddle blocks).
    for n in (1, 3, 70001, 300_007):
        mine = np.arange(n, dtype=np.int32) * (rank + 1)
        gathered = core.allgather(mine)
        assert gathered.shape == (size, n)
        for r in range(size):
            assert (gathered[r] == np.arange(n, dtype=np.int32) * (r + 1)).all()
        cases += 1
    # In place: this rank's row of ``out`` is its input.
    for n in (1, 300_007):
        out = np.zeros((size, n), dtype=np.float32)
        out[rank] = np.arange(n, dtype=np.float32) + rank
        assert core.allgather(out[rank], out=out) is out
        with pytest.raises(core.ValidationError, match="'out' must be"):
            core.allgather(out[rank], out=np.zeros((size + 1, n), dtype=np.float32))
        for r in range(size):
            assert (out[r] == np.arange(n, dtype=np.float32) + r).all(), f"in place n={n}"
        cases += 1
    # One chunk, and several (the blocks of other hosts sent from the buffer itself).
    for root in range(size):
        for n in (513, 300_007):
            inputs = [np.arange(n, dtype=np.int64) + r for r in range(size)]
            mine = inputs[rank].copy()
            core.reduce(mine, op="sum", root=root)
            want = sum(inputs) if rank == root else inputs[rank]
            assert (mine == want).all(), f"reduce root={root} n={n}"
            cases += 1
    for _ in range(20):
        core.barrier()
    return cases + 1


def check_big(core, rank, size) -> int:
    """50 M elements (many chunks), small integers in float32: exact sums."""
    base = (np.arange(BIG, dtype=np.int32) % 1001).astype(np.float32)
    mine = base * np.float32(rank + 1)
    core.allreduce(mine)
    assert np.array_equal(mine, base * np.float32(size * (size + 1) // 2)), "50M allreduce"
    digests = digest_all(core, mine)
    assert (digests == digests[0]).all()
    return 1


def check_slots_idle(core, rank, size) -> int:
    """Large allreduces of a group with one rank per host go host to host from the
    caller's buffer: the segment's slots (64 x 256 KiB) are never cycled, so they stay
    unresident however many run."""
    base = (np.arange(2 << 20, dtype=np.int32) % 1001).astype(np.float32)  # 8 MiB
    for step in range(12):
        mine = base * np.float32(rank + step)
        core.allreduce(mine)
        want = base * np.float32(size * step + size * (size - 1) // 2)
        assert np.array_equal(mine, want), f"8 MiB allreduce {step}"
    resident = segment_resident()
    assert resident < (1 << 20), f"{resident} bytes of the segment resident"
    return 12


def check_reduce_keeps_nothing(core, rank, size) -> int:
    """A reduce stages the partials bound for other hosts for that call only: twelve of
    8 MiB, every rank the root in turn, leave the heap's bytes in use where one small
    reduce left them (a staging buffer kept for the next call would hold a block per
    host, 8 MiB in all here, between steps)."""
    base = (np.arange(2 << 20, dtype=np.int32) % 1001).astype(np.float32)  # 8 MiB
    mine, want = np.empty_like(base), np.empty_like(base)
    core.reduce(np.ones(513, dtype=np.float32), root=0)  # the core's fixed buffers
    before = heap_in_use()
    for step in range(12):
        np.multiply(base, np.float32(rank + step), out=mine)
        core.reduce(mine, root=step % size)
        if rank == step % size:
            np.multiply(base, np.float32(size * step + size * (size - 1) // 2), out=want)
            assert np.array_equal(mine, want), f"8 MiB reduce {step}"
    grown = heap_in_use() - before
    assert grown < (1 << 20), f"{grown} bytes of the heap kept after the reduces"
    return 12


def heap_in_use() -> int:
    """Bytes this process has allocated and not freed (glibc's ``mallinfo2``: in the heaps
    and in blocks mapped on their own)."""
    import ctypes

    class MallInfo2(ctypes.Structure):
        _fields_ = [(name, ctypes.c_size_t) for name in (
            "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks",
            "uordblks", "fordblks", "keepcost")]

    mallinfo2 = ctypes.CDLL(None).mallinfo2
    mallinfo2.restype = MallInfo2
    info = mallinfo2()
    return info.hblkhd + info.uordblks


def segment_resident() -> int:
    """Resident bytes of this process's mappings of the core's host segments."""
    total, inside = 0, False
    with open("/proc/self/smaps", encoding="ascii", errors="replace") as smaps:
        for line in smaps:
            head = line.split()
            if head and "-" in head[0] and ":" not in head[0]:
                inside = "/dev/shm/shoal-" in line
            elif inside and head[0] == "Rss:":
                total += int(head[1]) * 1024
    return total


# ---------------------------------------------------------------- the tests
def run_mpi(np_, extra_env=None, per_rank_host=None, timeout=300, script=HERE):
    env = dict(os.environ)
    env.update({"SHOAL_JOB_ID": uuid.uuid4().hex[:12], "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(free_port()), "SHOAL_COLLECTIVE_TIMEOUT": "60"})
    env.update(extra_env or {})
    names = ["SHOAL_JOB_ID", "MASTER_ADDR", "MASTER_PORT", "SHOAL_COLLECTIVE_TIMEOUT", *(extra_env or {})]
    argv = [MPIRUN, "--allow-run-as-root", "--oversubscribe", "-np", str(np_)]
    for n in names:
        argv += ["-x", n]
    if per_rank_host:
        # Simulated hosts: SHOAL_HOST per rank, as the launcher's per-rank wrapper sets it.
        for r in range(np_):
            env[f"EXPECTED_HOST_{r}"] = per_rank_host(r)
            argv += ["-x", f"EXPECTED_HOST_{r}"]
        script = f'SHOAL_HOST=h$((OMPI_COMM_WORLD_RANK/{np_ // 2})) exec "{sys.executable}" "{script}" worker'
        argv += ["bash", "-c", script]
    else:
        argv += [sys.executable, script, "worker"]
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    assert proc.stdout.count("cases ok") == np_, proc.stdout
    return proc


# Shared by the other core test files (groups, point-to-point).
MPI_MARKS = [
    pytest.mark.mpi,
    pytest.mark.runtime,
    pytest.mark.skipif(MPIRUN is None, reason="mpirun (Open MPI) is not installed"),
]
pytestmark = MPI_MARKS


def finish_worker(core, rank: int, cases: int) -> None:
    """A worker's last steps: every rank done, the core shut down, the line run_mpi counts."""
    core.barrier()
    core.shutdown()
    print(f"rank {rank}: {cases} cases ok", flush=True)


@pytest.mark.parametrize("ranks", [1, 2, 3, 4])
def test_one_host(ranks):
    extra = {"CHECK_BIG": "1"} if ranks in (2, 4) else {}
    if ranks == 3:
        # Every size through the single-copy path (peers' buffers read directly).
        extra["SHOAL_SINGLE_COPY_BYTES"] = "1"
    run_mpi(ranks, extra)


def test_small_chunks_and_no_fusion():
    # Tiny shared-memory slots and no single copy: every size spans many
    # chunks of the pipelined shared-memory path; fusion disabled.
    run_mpi(3, {"SHOAL_SHM_CHUNK_BYTES": "4096", "SHOAL_SMALL_BYTES": "0",
                "SHOAL_FUSION_THRESHOLD_BYTES": "0", "SHOAL_SINGLE_COPY_BYTES": "0"})


def test_two_ranks_through_shared_slots():
    # Two local ranks without single copy: one handshake per chunk, many chunks.
    run_mpi(2, {"SHOAL_SINGLE_COPY_BYTES": "0", "SHOAL_SHM_CHUNK_BYTES": "65536",
                "CHECK_BIG": "1"})


@pytest.mark.slow
def test_two_simulated_hosts():
    run_mpi(4, {"CHECK_BIG": "1"}, per_rank_host=lambda r: f"h{r // 2}")


@pytest.mark.parametrize("ranks", [2, 3])
def test_one_rank_per_host(ranks):
    # Every host alone in the group: large allreduces go host to host straight from the
    # caller's buffer (all 50 M elements, and twelve of 8 MiB that leave the slots idle).
    run_mpi(ranks, {"CHECK_BIG": "1"}, per_rank_host=lambda r: f"h{r}")
    run_mpi(ranks, {"CHECK_SLOTS_IDLE": "1"}, per_rank_host=lambda r: f"h{r}")


def test_a_reduce_keeps_no_staging_between_calls():
    # Two hosts of two ranks: each rank's partials of the other host's blocks, and that
    # host's partials of its own, are staged for the call only (one rank per host:
    # test_one_rank_per_host).
    run_mpi(4, {"CHECK_REDUCE_HEAP": "1"}, per_rank_host=lambda r: f"h{r // 2}")


def test_two_simulated_hosts_small_chunks():
    run_mpi(4, {"SHOAL_SHM_CHUNK_BYTES": "8192"}, per_rank_host=lambda r: f"h{r // 2}")


def test_two_simulated_hosts_reading_peers_directly():
    # Every size through the single-copy path, whose reduced pieces cross hosts
    # in batches (small pieces: many batches per slice).
    run_mpi(4, {"SHOAL_SINGLE_COPY_BYTES": "1", "SHOAL_SHM_CHUNK_BYTES": "8192"},
            per_rank_host=lambda r: f"h{r // 2}")


if __name__ == "__main__" and sys.argv[1:] == ["worker"]:
    worker()
