"""Groups in the collective core under the real mpirun: communicators over any subset of
ranks (inside a host, across hosts, uneven, singleton, overlapping, reordered), each
checked bit for bit against the numpy model of the core's reduction order; calls on
different groups interleaved in a different order on every rank; and 200 groups created
and destroyed without leaking a shared-memory segment, a thread or a file descriptor.

This file is also the worker: ``python test_collectives_groups.py worker``.
"""

from __future__ import annotations

import math
import os
import sys
import threading

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from counts import fd_count, settle, steady, task_count  # noqa: E402
from test_collectives import (  # noqa: E402
    DTYPES,
    MPI_MARKS,
    OPS,
    expected,
    finish_worker,
    make_input,
    run_mpi,
)

HERE = os.path.abspath(__file__)
SIZES = [1, 17, 4097, 70001, 600_001]


def real_host(rank: int) -> str:
    return os.environ.get(f"EXPECTED_HOST_{rank}", "h")


def virtual_hosts(members: list[int]) -> list[list[int]]:
    """The group's hosts as the core cuts them: group ranks by machine, each machine's
    ranks in pieces of the greatest common size."""
    machines: dict[str, list[int]] = {}
    for group_rank, world_rank in enumerate(members):
        machines.setdefault(real_host(world_rank), []).append(group_rank)
    size = 0
    for ranks in machines.values():
        size = math.gcd(size, len(ranks))
    return [ranks[i : i + size] for ranks in machines.values() for i in range(0, len(ranks), size)]


def shapes(size: int) -> list[list[int]]:
    """Every kind of group on ``size`` ranks: world, each singleton, pairs (inside and
    across hosts), reordered, uneven and overlapping memberships. 16 on 4 ranks."""
    found = [list(range(size)), list(reversed(range(size)))]
    found += [[r] for r in range(size)]
    found += [[a, b] for a in range(size) for b in range(a + 1, size)]
    if size >= 3:
        found += [[0, 1, 2], [size - 1, 0, 1]]
    return found[:16]


def check_group(core, group, members, rank) -> int:
    me = members.index(rank)
    hosts = virtual_hosts(members)
    topo = group.topology
    assert (topo.rank, topo.size, topo.global_rank) == (me, len(members), rank), topo
    assert topo.num_hosts == len(hosts) and topo.local_size == len(hosts[0]), (topo, hosts)
    cases = 0
    for dtype in DTYPES:
        for op in OPS:
            for n in SIZES if dtype == "float32" else SIZES[:3]:
                seed = (len(members), *members, DTYPES.index(dtype), OPS.index(op), n)
                inputs = [make_input(np.random.default_rng((*seed, r)), dtype, op, n)
                          for r in range(len(members))]
                mine = inputs[me].copy()
                core.allreduce(mine, op=op, group=group)
                want = expected(inputs, dtype, op, hosts)
                assert mine.tobytes() == want.tobytes(), f"{members} {dtype} {op} n={n}"
                cases += 1
    for root in range(len(members)):
        for n in (3, 300_001):
            data = np.random.default_rng((5, root, n)).standard_normal(n)
            mine = data.copy() if me == root else np.zeros(n)
            core.broadcast(mine, root=root, group=group)
            assert mine.tobytes() == data.tobytes(), f"{members} broadcast root {root}"
            totals = [np.arange(9, dtype=np.int64) * (r + 1) for r in range(len(members))]
            mine = totals[me].copy()
            core.reduce(mine, root=root, group=group)
            assert (mine == (sum(totals) if me == root else totals[me])).all()
            cases += 2
    for n in (1, 70_001):
        gathered = core.allgather(np.full(n, rank, dtype=np.int32), group=group)
        assert [int(row[0]) for row in gathered] == members and (gathered[:, -1] == members).all()
        cases += 1
    cases += check_exchanges(core, group, members, rank, hosts)
    handles = [core.allreduce_async(np.full(5, float(rank)), group=group) for _ in range(6)]
    for h in handles:
        assert (h.wait() == float(sum(members))).all()
    core.barrier(group=group)
    return cases + 1


def check_exchanges(core, group, members, rank, hosts) -> int:
    """Reduce-scatter and reduce (the core's fold order: local ranks, then hosts),
    all-to-all with uneven splits, gather and scatter from every root."""
    me, size = members.index(rank), len(members)
    cases = 0
    for dtype in DTYPES:
        for op in OPS:
            for n in (1, 5000, 70_001):
                seed = (size, *members, 77, DTYPES.index(dtype), OPS.index(op), n)
                inputs = [make_input(np.random.default_rng((*seed, r)), dtype, op, n * size)
                          for r in range(size)]
                out = core.reduce_scatter(inputs[me].copy(), op=op, group=group)
                want = expected(inputs, dtype, op, hosts)[me * n : (me + 1) * n]
                assert out.tobytes() == want.tobytes(), f"{members} rs {dtype} {op} n={n}"
                root = n % size
                mine = inputs[me].copy()
                core.reduce(mine, op=op, root=root, group=group)
                want = expected(inputs, dtype, op, hosts) if me == root else inputs[me]
                assert mine.tobytes() == want.tobytes(), f"{members} reduce {dtype} {op} n={n}"
                cases += 2
    for n in (0, 3, 40_000):  # rows rank a sends rank b: n + a + 2b (some zero when n == 0)
        rows = lambda a, b, n=n: n + a + 2 * b if n else (a + b) % 2  # noqa: E731
        sends = [rows(me, b) for b in range(size)]
        data = np.concatenate([np.full((rows(me, b), 3), 100 * me + b, dtype=np.int32)
                               for b in range(size)])
        got = core.alltoall(data, sends, [rows(a, me) for a in range(size)], group=group)
        want = np.concatenate([np.full((rows(a, me), 3), 100 * a + me, dtype=np.int32)
                               for a in range(size)])
        assert np.array_equal(got, want), f"{members} alltoall n={n}"
        cases += 1
    for root in range(size):
        for n in (1, 100_000):
            block = np.arange(n, dtype=np.float64) + 1000 * me
            gathered = core.gather(block, root=root, group=group)
            if me == root:
                assert np.array_equal(gathered, [np.arange(n) + 1000 * r for r in range(size)])
            whole = np.stack([np.arange(n) * (r + 1.0) for r in range(size)]) if me == root else None
            out = core.scatter(whole, np.empty(n), root=root, group=group)
            assert np.array_equal(out, np.arange(n) * (me + 1.0)), f"{members} scatter"
            cases += 2
    return cases


def check_interleaving(core, rank, size) -> None:
    """Two disjoint groups used in a different order on different ranks (each group's own
    order is the same on its members), and from two threads at once."""
    if size < 4:
        return
    a = core.new_group([0, 1])
    b = core.new_group([2, 3])
    c = core.new_group([1, 2])
    both = [g for g in (a, b) if g is not None]
    mine = both[0]
    cross = c
    values = [np.full(1000, float(rank)) for _ in range(2)]
    # Ranks 1 and 2 are in two groups each: rank 1 uses c first, rank 2 uses it last.
    order = [cross, mine] if rank == 1 else [mine, cross]
    for g, v in zip([g for g in order if g is not None], values):
        core.allreduce(v, group=g)
    results = []

    def run(group, value):
        for _ in range(50):
            value[:] = rank
            core.allreduce(value, group=group)
        results.append(float(value[0]))

    used = [g for g in (mine, cross) if g is not None]
    threads = [threading.Thread(target=run, args=(g, np.zeros(64))) for g in used]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results) == sorted(float(sum(g.ranks)) for g in used)
    for g in (a, b, c):
        if g is not None:
            g.destroy()


def shoal_segments() -> set[str]:
    return {name for name in os.listdir("/dev/shm") if name.startswith("shoal-")}


def check_churn(core, rank, size) -> None:
    """200 groups created and destroyed: no segment, descriptor or thread is left."""
    core.barrier()
    # The baseline once it holds still: a transfer thread of an earlier check lingers a
    # moment after its last transfer (its thread and descriptors then go).
    fds = steady(fd_count)
    native_threads = steady(task_count)
    threads = threading.active_count()
    for i in range(200):
        members = [(i + k) % size for k in range(1 + i % size)]
        group = core.new_group(members)
        if group is not None:
            value = np.ones(4)
            core.allreduce(value, group=group)
            assert (value == len(members)).all()
            group.destroy()
    core.barrier()
    now_fds = settle(fd_count, fds)
    now = settle(task_count, native_threads)
    # Until every rank has counted: a rank that exits closes its links, and their other
    # ends go with them.
    core.barrier()
    assert now_fds == fds, f"{now_fds - fds} file descriptors more than before"
    assert threading.active_count() == threads
    assert now == native_threads, f"{now - native_threads} native threads more than before"
    assert not shoal_segments(), shoal_segments()


def worker() -> None:
    from shoal.dataparallel import core

    comm = core.init()
    rank, size = comm.rank, comm.size
    cases = 0
    groups = [(members, core.new_group(members)) for members in shapes(size)]
    assert len(groups) == min(16, len(groups))
    for members, group in groups:
        assert (group is None) == (rank not in members)
    mine = [(m, g) for m, g in groups if g is not None]
    for members, group in mine:
        cases += check_group(core, group, members, rank)
    for _, group in mine:
        group.destroy()
    check_interleaving(core, rank, size)
    check_churn(core, rank, size)
    finish_worker(core, rank, cases)


pytestmark = MPI_MARKS


def run_groups(ranks, extra_env=None, **kwargs):
    run_mpi(ranks, extra_env, script=HERE, **kwargs)


@pytest.mark.parametrize("ranks", [2, 3, 4])
def test_groups_on_one_host(ranks):
    run_groups(ranks)


def test_groups_across_two_simulated_hosts():
    run_groups(4, per_rank_host=lambda r: f"h{r // 2}")


def test_groups_without_reading_peers():
    # Reduce-scatter and reduce fall back to an allreduce, transfers go in fragments.
    run_groups(3, extra_env={"SHOAL_SINGLE_COPY_BYTES": "0"})


if __name__ == "__main__" and sys.argv[1:] == ["worker"]:
    worker()
