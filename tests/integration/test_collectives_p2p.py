"""Point-to-point transfers of the collective core under the real mpirun: sends and receives
of every size class (inline in one slot, fragments, read in place from the sender, and over
the host-to-host connections), tag matching out of issue order, receives from any source,
rings of simultaneous transfers, inside groups, receives withdrawn before a message came,
and a peer that dies.

This file is also the worker: ``python test_collectives_p2p.py worker``.
"""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_collectives import MPI_MARKS, finish_worker, run_mpi  # noqa: E402

HERE = os.path.abspath(__file__)
# Empty, tiny, one slot exactly, just over (fragments or address), many fragments, large.
SIZES = [0, 1, 4096, 16384, 16385, 100_003, 3_000_017]


def payload(src: int, dst: int, n: int, salt: int = 0) -> np.ndarray:
    return np.random.default_rng((src, dst, n, salt)).integers(0, 256, n, dtype=np.uint8)


def check_pairs(core, rank, size, group=None) -> int:
    """Every ordered pair, every size: rank a sends to b while b sends to a (both posted
    before either waits, so neither can complete by itself)."""
    cases = 0
    for n in SIZES:
        for peer in range(size):
            if peer == rank:
                continue
            out = payload(rank, peer, n)
            into = np.zeros(n, dtype=np.uint8)
            handles = [core.isend(out, peer, tag=n % 7, group=group),
                       core.irecv(into, peer, tag=n % 7, group=group)]
            for h in handles:
                h.wait()
            assert np.array_equal(into, payload(peer, rank, n)), (rank, peer, n)
            assert handles[1].source == peer
            cases += 1
    return cases


def check_ring(core, rank, size) -> int:
    """All ranks send to the next and receive from the previous at once, five rounds."""
    nxt, prev = (rank + 1) % size, (rank - 1) % size
    for salt in range(5):
        n = 200_000 + salt
        into = np.zeros(n, dtype=np.uint8)
        recv = core.irecv(into, prev, tag=salt)
        send = core.isend(payload(rank, nxt, n, salt), nxt, tag=salt)
        send.wait()
        recv.wait()
        assert np.array_equal(into, payload(prev, rank, n, salt))
    return 5


def check_tags_and_any_source(core, rank, size) -> int:
    """Rank 0 receives tag 2 before tag 1 from every peer (the tag-1 messages wait
    unexpected, inline and large alike), then one message from any source per peer."""
    if rank != 0:
        # Large sends complete once received (as on gloo): post them all, then wait.
        sends = [core.isend(payload(rank, 0, n, tag), 0, tag=tag)
                 for tag, n in ((1, 10), (2, 20), (1, 50_000), (2, 60_000))]
        sends.append(core.isend(np.full(8, rank, dtype=np.uint8), 0, tag=9))
        for h in sends:
            h.wait()
        return 1
    for peer in range(1, size):
        for tag, n in ((2, 20), (2, 60_000), (1, 10), (1, 50_000)):
            into = np.zeros(n, dtype=np.uint8)
            assert core.recv(into, peer, tag=tag) == peer
            assert np.array_equal(into, payload(peer, 0, n, tag)), (peer, tag, n)
    seen = set()
    for _ in range(1, size):
        into = np.zeros(8, dtype=np.uint8)
        source = core.recv(into, None, tag=9)
        assert (into == source).all()
        seen.add(source)
    assert seen == set(range(1, size))
    return 1


def check_group(core, rank, size) -> int:
    """Group ranks, not world ranks: the reversed world."""
    group = core.new_group(list(reversed(range(size))))
    me = size - 1 - rank
    cases = check_pairs(core, me, size, group=group)
    group.destroy()
    return cases


def check_cancel(core, rank, size) -> int:
    """A receive withdrawn before any message matched it fails with ReceiveCancelledError
    and takes no later message (the next receive of that tag does); a completed receive
    and a send cannot be withdrawn."""
    from shoal.errors import ReceiveCancelledError

    nxt, prev = (rank + 1) % size, (rank - 1) % size
    stale = np.zeros(64, dtype=np.uint8)
    withdrawn = core.irecv(stale, None, tag=31)
    assert withdrawn.cancel() is True
    try:
        withdrawn.wait()
        raise AssertionError("a cancelled receive completed")
    except ReceiveCancelledError as e:
        assert "cancelled" in str(e)
    assert withdrawn.cancel() is False
    core.barrier()  # every rank has withdrawn its receive before any message leaves
    send = core.isend(payload(rank, nxt, 64, 31), nxt, tag=31)
    into = np.zeros(64, dtype=np.uint8)
    received = core.irecv(into, None, tag=31)
    received.wait()
    send.wait()
    assert received.source == prev and np.array_equal(into, payload(prev, rank, 64, 31))
    assert not stale.any()
    assert received.cancel() is False and send.cancel() is False
    return 1


def worker() -> None:
    from shoal.dataparallel import core

    comm = core.init()
    rank, size = comm.rank, comm.size
    cases = check_pairs(core, rank, size)
    cases += check_ring(core, rank, size)
    cases += check_tags_and_any_source(core, rank, size)
    cases += check_group(core, rank, size)
    cases += check_cancel(core, rank, size)
    finish_worker(core, rank, cases)


pytestmark = MPI_MARKS


@pytest.mark.parametrize("ranks", [2, 3, 4])
def test_point_to_point_on_one_host(ranks):
    run_mpi(ranks, script=HERE)


def test_point_to_point_in_fragments_without_reading_peers():
    run_mpi(3, {"SHOAL_SINGLE_COPY_BYTES": "0"}, script=HERE)


def test_point_to_point_across_two_simulated_hosts():
    run_mpi(4, per_rank_host=lambda r: f"h{r // 2}", script=HERE)


if __name__ == "__main__" and sys.argv[1:] == ["worker"]:
    worker()
