"""The master's status channel and the wait for workers."""

import socket
import threading

import pytest
from shoal.errors import LaunchError
from shoal.launcher import cluster
from shoal.launcher.ports import free_port


def test_workers_report_ready_and_receive_the_outcome():
    server = cluster.StatusServer(free_port(), bind="127.0.0.1")
    results = {}

    def worker(name):
        results[name] = cluster.wait_for_outcome("127.0.0.1", server.port, 10, 0.05, me=name)

    threads = [threading.Thread(target=worker, args=(h,)) for h in ("algo-2", "algo-3")]
    for t in threads:
        t.start()
    server.wait_for_workers(["algo-2", "algo-3"], timeout=10)
    server.publish(cluster.JobStatus(1, "Rank 1 on host algo-1 exited with code 1."))
    for t in threads:
        t.join(10)
    server.close(["algo-2", "algo-3"], linger=5)
    assert results == {h: cluster.JobStatus(1, "Rank 1 on host algo-1 exited with code 1.")
                       for h in ("algo-2", "algo-3")}  # fmt: skip


def test_missing_worker_times_out():
    server = cluster.StatusServer(free_port(), bind="127.0.0.1")
    try:
        with pytest.raises(LaunchError, match=r"workers \['algo-2'\] did not report ready"):
            server.wait_for_workers(["algo-2"], timeout=0.3)
    finally:
        server.close()


def test_unreachable_master_fails_the_worker():
    status = cluster.wait_for_outcome("127.0.0.1", free_port(), connect_timeout=0.3, interval=0.1)
    assert status.exit_code == 1 and "could not reach the master" in status.message


def test_master_dying_before_the_outcome_fails_the_worker():
    # A master that accepts the worker and then goes away without an answer.
    listener = socket.create_server(("127.0.0.1", 0))

    def die():
        conn, _ = listener.accept()
        conn.recv(256)
        conn.close()

    threading.Thread(target=die, daemon=True).start()
    status = cluster.wait_for_outcome("127.0.0.1", listener.getsockname()[1], 10, 0.05, me="w")
    listener.close()
    assert status.exit_code == 1 and "lost contact with the master" in status.message


def test_wait_for_ports():
    cluster.wait_for_ports([], 22, timeout=0.1)
    with pytest.raises(LaunchError, match="did not open port"):
        cluster.wait_for_ports(["127.0.0.1"], free_port(), timeout=0.3, interval=0.1)


def test_a_worker_that_could_not_start_fails_the_wait_at_once():
    server = cluster.StatusServer(free_port(), bind="127.0.0.1")
    got = {}
    t = threading.Thread(target=lambda: got.update(s=cluster.wait_for_outcome(
        "127.0.0.1", server.port, 10, 0.05, me="algo-2", failed="pip install failed")))
    t.start()
    with pytest.raises(LaunchError, match="host algo-2 could not start: pip install failed"):
        server.wait_for_workers(["algo-2", "algo-3"], timeout=10)
    server.publish(cluster.JobStatus(2, "host algo-2 could not start"))
    t.join(10)
    server.close(["algo-2"], linger=5)
    assert got["s"] == cluster.JobStatus(2, "host algo-2 could not start")


def test_backoff_doubles_from_a_short_first_delay_up_to_the_cap():
    delays = cluster.backoff(0.02, 1.0)
    assert [next(delays) for _ in range(8)] == [0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.0, 1.0]


def test_waits_retry_with_backoff_not_fixed_seconds(monkeypatch):
    slept = []
    monkeypatch.setattr(cluster.time, "sleep", slept.append)
    answers = iter([False, False, False, True])
    monkeypatch.setattr(cluster, "can_connect", lambda host, port: next(answers))
    cluster.wait_for_ports(["algo-2"], 22, timeout=60)
    assert slept == [0.02, 0.04, 0.08]
    slept.clear()
    worker_end, master_end = socket.socketpair()
    master_end.sendall(cluster.JobStatus(0).to_line())

    def connect(*args, **kwargs):
        if len(slept) < 4:
            raise ConnectionRefusedError()
        return worker_end

    monkeypatch.setattr(cluster.socket, "create_connection", connect)
    with master_end:
        assert cluster.wait_for_outcome("127.0.0.1", 1, 60, me="algo-2").exit_code == 0
    assert slept == [0.02, 0.04, 0.08, 0.16]
