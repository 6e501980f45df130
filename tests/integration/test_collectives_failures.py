"""Failures of the collective core: a rank killed in the middle of allreduces,
and a rank that never arrives. The others must fail with a clear error (op
name, ranks) within the timeout, and no process may hang. Across simulated
hosts every survivor names the killed rank, also the ranks that only saw a
survivor on the other host leave because of it.

Ranks are plain processes with torchrun-style variables (RANK, WORLD_SIZE,
MASTER_ADDR, MASTER_PORT), so the test controls which one dies and when; one
case runs under the real mpirun. This file is also the worker.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
import uuid

import numpy as np
import pytest
from shoal.launcher.ports import free_port

HERE = os.path.abspath(__file__)
MPIRUN = shutil.which("mpirun")

pytestmark = [pytest.mark.runtime]


def worker(mode: str) -> None:
    from shoal.dataparallel import core
    from shoal.errors import CollectiveError

    comm = core.init()
    data = np.ones(1 << 20, dtype=np.float32)
    try:
        if mode.startswith("group"):  # members loop on a group of ranks 1..3
            return group_worker(core, comm, data, mode)
        if mode == "recv":  # rank 0 waits for a message rank 1 never sends
            print("ready", flush=True)
            if comm.rank == 0:
                core.recv(data, 1)
            time.sleep(120)
        core.allreduce(data)
        print("ready", flush=True)
        if mode == "stall" and comm.rank == comm.size - 1:
            time.sleep(120)
        if mode == "nap" and comm.rank in (1, 2):
            time.sleep(120)
        if mode == "suicide" and comm.rank == 1:
            for _ in range(5):
                core.allreduce(data)
            os.kill(os.getpid(), signal.SIGKILL)
        while True:
            data[:] = 1
            core.allreduce(data)
    except CollectiveError as exc:
        print(f"{type(exc).__name__}: {exc} ranks={exc.ranks}", file=sys.stderr, flush=True)
        sys.exit(3)


def group_worker(core, comm, data, mode) -> None:
    """The members (``group:<ranks>``) reduce in a loop on their group; the others only
    take part in creating it."""
    from shoal.errors import CollectiveError

    group = core.new_group([int(r) for r in mode.split(":")[1].split(",")])
    print("ready", flush=True)
    if group is None:
        time.sleep(60)
        return
    try:
        while True:
            data[:] = 1
            core.allreduce(data, group=group)
    except CollectiveError as exc:
        print(f"{type(exc).__name__}: {exc} ranks={exc.ranks}", file=sys.stderr, flush=True)
        sys.exit(3)


def start_ranks(size, mode, timeout_s, hosts=None):
    base = {"SHOAL_JOB_ID": uuid.uuid4().hex[:12], "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(free_port()), "WORLD_SIZE": str(size),
            "SHOAL_COLLECTIVE_TIMEOUT": str(timeout_s)}
    procs = []
    for rank in range(size):
        env = {k: v for k, v in os.environ.items() if not k.startswith("OMPI_")}
        env.update(base, RANK=str(rank))
        if hosts:
            env["SHOAL_HOST"] = hosts[rank]
        procs.append(subprocess.Popen([sys.executable, HERE, "worker", mode], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    for p in procs:
        assert p.stdout.readline().strip() == "ready", p.stderr.read()
    return procs


def finish(procs, deadline_s):
    """Every survivor's (returncode, stderr); none may outlive the deadline."""
    end = time.monotonic() + deadline_s
    out = []
    try:
        for p in procs:
            p.wait(timeout=max(0.1, end - time.monotonic()))
            out.append((p.returncode, p.stderr.read()))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return out


def test_killed_local_rank_is_reported_by_the_others():
    procs = start_ranks(3, "loop", timeout_s=60)
    procs[1].send_signal(signal.SIGKILL)
    # Found by the liveness check, long before the 60 s timeout.
    results = finish([procs[0], procs[2]], deadline_s=20)
    for code, err in results:
        assert code == 3, err
        assert "PeerLostError" in err and "rank 1" in err, err
    procs[1].wait()


@pytest.mark.parametrize("victim", [2, 0, 3])
def test_killed_rank_is_named_on_every_host(victim):
    # Hosts h0 = ranks 0, 1 and h1 = ranks 2, 3. The ranks that fail because
    # of the victim (a survivor leaves, its peer on the other host sees that
    # connection drop) must still name the victim, not each other.
    procs = start_ranks(4, "loop", timeout_s=60, hosts=["h0", "h0", "h1", "h1"])
    procs[victim].send_signal(signal.SIGKILL)
    survivors = [r for r in range(4) if r != victim]
    results = finish([procs[r] for r in survivors], deadline_s=20)
    for rank, (code, err) in zip(survivors, results):
        assert code == 3, (rank, err)
        assert "PeerLostError" in err, (rank, err)
        assert f"ranks=[{victim}]" in err, (rank, err)
    procs[victim].wait()


# Ranks 1, 2, 3 span both hosts unevenly (each rank is a host of its own in the group);
# 3, 0, 2, 1 holds both hosts' ranks, reordered.
@pytest.mark.parametrize("members, victim", [("1,2,3", 2), ("1,2,3", 1), ("3,0,2,1", 0),
                                             ("3,0,2,1", 3)])
def test_rank_killed_inside_a_group_is_named_by_every_member(members, victim):
    procs = start_ranks(4, f"group:{members}", timeout_s=60, hosts=["h0", "h0", "h1", "h1"])
    try:
        time.sleep(0.3)
        procs[victim].send_signal(signal.SIGKILL)
        survivors = [int(r) for r in members.split(",") if int(r) != victim]
        results = finish([procs[r] for r in survivors], deadline_s=20)
        for rank, (code, err) in zip(survivors, results):
            assert code == 3, (rank, err)
            assert "PeerLostError" in err and f"ranks=[{victim}]" in err, (rank, err)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()


@pytest.mark.parametrize("hosts", [None, ["h0", "h1"]], ids=["one-host", "two-hosts"])
def test_a_receive_from_a_killed_rank_fails_naming_it(hosts):
    procs = start_ranks(2, "recv", timeout_s=60, hosts=hosts)
    try:
        time.sleep(0.3)
        procs[1].send_signal(signal.SIGKILL)
        [(code, err)] = finish([procs[0]], deadline_s=10)
        assert code == 3, err
        assert "PeerLostError" in err and "ranks=[1]" in err, err
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()


def test_rank_killed_while_the_other_host_waits_in_shared_memory():
    # Ranks 1 and 2 sit outside any collective; rank 0 waits in shared memory
    # for rank 1 (no TCP call), rank 3 for rank 2. Rank 2 dies: rank 3 sees it
    # locally, rank 0 only through its control connection to rank 2.
    procs = start_ranks(4, "nap", timeout_s=60, hosts=["h0", "h0", "h1", "h1"])
    try:
        time.sleep(0.5)  # ranks 0 and 3 are inside their allreduce by now
        procs[2].send_signal(signal.SIGKILL)
        start = time.monotonic()
        results = finish([procs[0], procs[3]], deadline_s=10)
        elapsed = time.monotonic() - start
        for rank, (code, err) in zip((0, 3), results):
            assert code == 3, (rank, err)
            assert "PeerLostError" in err and "ranks=[2]" in err, (rank, err)
        assert elapsed < 5, f"detected only after {elapsed:.1f} s"
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()


def test_rank_that_never_arrives_times_out_everywhere():
    procs = start_ranks(3, "stall", timeout_s=3)
    start = time.monotonic()
    results = finish(procs[:2], deadline_s=30)
    elapsed = time.monotonic() - start
    for code, err in results:
        assert code == 3, err
        assert "CollectiveTimeoutError" in err, err
        assert "allreduce" in err and "[2]" in err, err
    assert elapsed >= 2.5, "failed before the timeout"
    procs[2].kill()
    procs[2].wait()


@pytest.mark.mpi
@pytest.mark.skipif(MPIRUN is None, reason="mpirun (Open MPI) is not installed")
def test_rank_killed_under_mpirun_ends_the_job():
    env = dict(os.environ, SHOAL_JOB_ID=uuid.uuid4().hex[:12], MASTER_PORT=str(free_port()),
               SHOAL_COLLECTIVE_TIMEOUT="30")
    argv = [MPIRUN, "--allow-run-as-root", "--oversubscribe", "-np", "3", "-x", "SHOAL_JOB_ID",
            "-x", "MASTER_PORT", "-x", "SHOAL_COLLECTIVE_TIMEOUT", sys.executable, HERE,
            "worker", "suicide"]
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    text = proc.stdout + proc.stderr
    assert "PeerLostError" in text or "signal 9" in text, text[-3000:]


if __name__ == "__main__" and sys.argv[1:2] == ["worker"]:
    worker(sys.argv[2])
