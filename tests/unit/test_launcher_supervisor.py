"""Output tagging, failure detection, and ending whole process trees."""

import os
import signal
import subprocess
import sys
import threading
import time

import psutil
from shoal.launcher.supervisor import Supervisor, exit_status


def make(hosts=("algo-1", "algo-2"), ppn=2, argv=("true",)):
    return Supervisor(list(argv), dict(os.environ), os.getcwd(), hosts=hosts, ranks_per_host=ppn)


def test_tags_name_the_host_and_pieces_are_joined():
    sup = make()
    assert sup.handle_line("[1,3]<stdout>:rank[1,3]<stdout>: 3 done") == (
        "[1,mpirank:3,algo-2]<stdout>:rank 3 done")
    assert sup.handle_line("[1,0]<stderr>:oops") == "[1,mpirank:0,algo-1]<stderr>:oops"
    assert sup.handle_line("plain line") == "plain line"


def test_marker_is_the_root_cause_even_after_mpirun_messages():
    sup = make()
    sup.handle_line("[1,1]<stderr>:ValueError: boom")
    sup.handle_line('[1,1]<stderr>:SHOAL_RANK_FAILED {"rank": 1, "host": "algo-1", '
                    '"exit_code": 1, "signal": null}')  # fmt: skip
    sup.handle_line("MPI_ABORT was invoked on rank 3 in communicator MPI_COMM_WORLD")
    failure = sup._failure
    assert (failure.rank, failure.host, failure.exit_code) == (1, "algo-1", 1)


def test_mpirun_messages_as_fallback():
    sup = make()
    sup.handle_line("mpirun noticed that process rank 2 with PID 0 on node algo-2 exited on "
                    "signal 9 (Killed).")  # fmt: skip
    assert (sup._failure.rank, sup._failure.host, sup._failure.signal) == (2, "algo-2", "SIGKILL")
    sup = make()
    sup.handle_line("  Process name: [[25250,1],3]")
    sup.handle_line("  Exit code:    7")
    assert (sup._failure.rank, sup._failure.host, sup._failure.exit_code) == (3, "algo-2", 7)
    sup = make()
    sup.handle_line("MPI_ABORT was invoked on rank 1 in communicator MPI_COMM_WORLD")
    assert (sup._failure.rank, sup._failure.host) == (1, "algo-1")


def test_run_collects_exit_code_and_tail():
    sup = make(argv=[sys.executable, "-c", "import sys; print('hello'); sys.exit(3)"])
    outcome = sup.run()
    assert outcome.returncode == 3 and not outcome.ok
    assert "hello" in outcome.tail
    assert exit_status(outcome) == 3


def _descendants_alive(pids):
    return [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != "zombie"]


def test_stop_ends_the_whole_tree_even_when_sigterm_is_ignored():
    script = ("import signal, subprocess, sys, time\n"
              "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
              "subprocess.Popen([sys.executable, '-c', 'import signal, time; "
              "signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(300)'])\n"
              "time.sleep(300)\n")  # fmt: skip
    sup = make(argv=[sys.executable, "-c", script])
    sup.grace = 1.0
    sup.start()
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        tree = psutil.Process(sup.proc.pid).children(recursive=True)
        if tree:
            break
        time.sleep(0.1)
    pids = [sup.proc.pid] + [p.pid for p in tree]
    assert len(pids) == 2
    threading.Timer(0.5, sup.stop, args=(signal.SIGTERM,)).start()
    outcome = sup.wait()
    assert outcome.stopped_by == "SIGTERM"
    assert outcome.returncode == -signal.SIGKILL
    time.sleep(0.2)
    assert _descendants_alive(pids) == []


def test_daemon_start_failure_without_rank_output_is_recognised():
    sup = make(argv=[sys.executable, "-c",
                     "import sys; print('ORTE was unable to reliably start one or more daemons.');"
                     " sys.exit(213)"])  # fmt: skip
    outcome = sup.run()
    assert outcome.daemons_failed and outcome.never_started
    sup = make(argv=[sys.executable, "-c",
                     "import sys; print('[1,0]<stdout>:hi'); print('orte_init failed'); sys.exit(1)"])
    outcome = sup.run()
    assert outcome.daemons_failed and not outcome.never_started


def test_a_watched_process_that_ends_stops_the_job():
    # A parameter server dies while its worker waits for it forever.
    server = subprocess.Popen([sys.executable, "-c", "import time, sys; time.sleep(0.5); sys.exit(3)"])
    sup = Supervisor([sys.executable, "-c", "import time; time.sleep(60)"], dict(os.environ),
                     os.getcwd(), grace=2.0, watch={"parameter server": server})
    start = time.monotonic()
    outcome = sup.run()
    assert time.monotonic() - start < 20
    assert not outcome.ok and outcome.stopped_by == "SIGTERM"
    assert outcome.watched_exit == f"The parameter server (pid {server.pid}) exited with code 3."


def test_a_watched_process_still_running_changes_nothing():
    server = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        sup = Supervisor([sys.executable, "-c", "pass"], dict(os.environ), os.getcwd(),
                         watch={"parameter server": server}, keep=[server.pid])
        outcome = sup.run()
        assert outcome.ok and outcome.watched_exit is None
    finally:
        server.kill()
        server.wait()
