"""Output tagging, failure detection, and ending whole process trees."""

import os
import signal
import subprocess
import sys
import threading
import time

import psutil
import pytest
from shoal.launcher import failure
from shoal.launcher.rank import failure_line
from shoal.launcher.supervisor import RankLines, Supervisor, Tag, exit_status


def make(hosts=("algo-1", "algo-2"), ppn=2, argv=("true",)):
    return Supervisor(list(argv), dict(os.environ), os.getcwd(), hosts=hosts, ranks_per_host=ppn)


def feed(sup, *chunks):
    """What ``sup`` prints for ``chunks`` read from one pipe, then EOF."""
    lines = RankLines()
    got = [ln for chunk in chunks for ln in lines.feed(chunk.encode())] + lines.close()
    return [sup.handle_line(text, tag) for tag, text in got]


def ompi(rank, data):
    """One write of ``rank`` to stderr as mpirun --tag-output forwards it: a tag at the
    start and after every newline inside."""
    tag = f"[1,{rank}]<stderr>:"
    return tag + data[:-1].replace("\n", "\n" + tag) + data[-1:]


def test_tags_name_the_host_and_pieces_are_joined():
    sup = make()
    assert feed(sup, "[1,3]<stdout>:rank[1,3]<stdout>: 3 done\n") == [
        "[1,mpirank:3,algo-2]<stdout>:rank 3 done"]
    assert feed(sup, "[1,0]<stderr>:oops\n") == ["[1,mpirank:0,algo-1]<stderr>:oops"]
    assert feed(sup, "plain line\n") == ["plain line"]


def test_marker_is_the_root_cause_even_after_mpirun_messages():
    sup = make()
    feed(sup, "[1,1]<stderr>:ValueError: boom\n",
         '[1,1]<stderr>:SHOAL_RANK_FAILED {"rank": 1, "host": "algo-1", '
         '"exit_code": 1, "signal": null}\n',
         "MPI_ABORT was invoked on rank 3 in communicator MPI_COMM_WORLD\n")  # fmt: skip
    failure = sup._failure
    assert (failure.rank, failure.host, failure.exit_code) == (1, "algo-1", 1)


def test_a_rank_killed_by_a_signal_is_the_cause_not_the_peer_that_noticed_first():
    sup = make()
    peer = ('[1,1]<stderr>:SHOAL_RANK_FAILED {"rank": 1, "host": "algo-1", "exit_code": 1, '
            '"signal": null}\n')
    killed = ('[1,2]<stderr>:SHOAL_RANK_FAILED {"rank": 2, "host": "algo-2", '
              '"exit_code": 137, "signal": "SIGKILL"}\n')
    feed(sup, peer, killed)
    assert (sup._failure.rank, sup._failure.signal) == (2, "SIGKILL")
    later = make()
    feed(later, peer)
    later._failure_at -= 60  # long after: a separate failure, not the cause of the first
    feed(later, killed)
    assert later._failure.rank == 1


def rank_failed(rank, host, code=1):
    return (f'[1,{rank}]<stderr>:SHOAL_RANK_FAILED {{"rank": {rank}, "host": "{host}", '
            f'"exit_code": {code}, "signal": null}}\n')


def test_the_rank_whose_own_error_a_peer_relayed_is_the_cause():
    # a pipeline leader relays its follower's failure (SMPPeerError), and its line comes first
    relayed = ompi(0, "[rank0]: shoal.modelparallel.errors.SMPPeerError: module '[1:3]' failed "
                      "on pipeline rank 1:\n[rank0]: ValueError: bad activations\n")
    own = ompi(1, "[rank1]: Traceback (most recent call last):\n[rank1]: ValueError: bad "
                  "activations\n")
    sup = make()
    feed(sup, relayed, rank_failed(0, "algo-1"), own, rank_failed(1, "algo-1"))
    assert sup._failure.rank == 1
    # two relays: the first stays; a relay never displaces a rank's own error
    lost = ompi(3, "shoal.errors.PeerLostError: broadcast: rank 0 exited\n")
    sup = make()
    feed(sup, relayed, rank_failed(0, "algo-1"), lost, rank_failed(3, "algo-2"))
    assert sup._failure.rank == 0
    sup = make()
    feed(sup, own, rank_failed(1, "algo-1"), relayed, rank_failed(0, "algo-1"))
    assert sup._failure.rank == 1
    # long after: a separate failure, not the cause of the first
    sup = make()
    feed(sup, relayed, rank_failed(0, "algo-1"))
    sup._failure_at -= 60
    feed(sup, own, rank_failed(1, "algo-1"))
    assert sup._failure.rank == 0


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


# A traceback's writes as Python 3.11 makes them to stderr (strace): the exception line
# in four, and the marker that shoal-rank writes after the script exited.
EXCEPTION = "RuntimeError: boom: the data is bad"
WRITES = ("Traceback (most recent call last):\n", '  File "train.py", line 7, in <module>\n',
          "    ", 'raise RuntimeError("boom: the data is bad")', "\n",
          "RuntimeError", ": ", "boom: the data is bad", "\n")  # fmt: skip


def marker(rank):
    ranks = {"RANK": str(rank), "LOCAL_RANK": "0", "SHOAL_HOST": f"algo-{rank + 1}"}
    return failure_line(ranks, 1) + "\n"


def alternate(*writers):
    """One write of each writer in turn, as mpirun forwards ranks that write at once."""
    longest = max(len(w) for w in writers)
    return [w[i] for i in range(longest) for w in writers if i < len(w)]


def interleaved(*ranks, crlf=False):
    """Every rank's traceback, their writes alternating (so another rank's line lands inside
    each line written in pieces), then the markers, rank 0's first (the root cause)."""
    writes = [w.replace("\n", "\r\n") if crlf else w for w in WRITES]
    return alternate(*[[ompi(r, w) for w in writes] for r in ranks]) + [
        ompi(r, marker(r)) for r in sorted(ranks)]


def rechunked(chunks, size):
    """The same bytes cut every ``size`` characters: mid-tag, mid-word, mid-CRLF."""
    data = "".join(chunks)
    return [data[i:i + size] for i in range(0, len(data), size)]


def head_of_failure(*chunks):
    sup = make(ppn=1)
    feed(sup, *chunks)
    outcome = sup.outcome(1)
    assert outcome.rank_tails[0][-2:] == (EXCEPTION, marker(0).strip())
    return failure.failure_message(outcome).splitlines()[0]


@pytest.mark.parametrize("chunks", [
    pytest.param(interleaved(0), id="one-rank-write-per-chunk"),
    # CI's case: rank 1's header lands after rank 0's "RuntimeError: ".
    pytest.param([*[ompi(0, w) for w in WRITES[:7]], ompi(1, WRITES[0]),
                  *[ompi(0, w) for w in WRITES[7:]], ompi(0, marker(0))],
                 id="header-inside-exception-line"),
    pytest.param(interleaved(0, 1), id="ranks-interleaved-inside-lines"),
    pytest.param(interleaved(1, 0), id="other-rank-first"),
    pytest.param(rechunked(interleaved(0, 1), 7), id="split-mid-tag-and-word"),
    pytest.param(rechunked(interleaved(0, 1), 1), id="one-byte-reads"),
    pytest.param(interleaved(0, 1, crlf=True), id="crlf"),
    pytest.param(rechunked(interleaved(0, 1, crlf=True), 5), id="crlf-split"),
    pytest.param([*[ompi(0, w) for w in WRITES[:5]], ompi(0, "Runt"),
                  ompi(1, "Traceback (most recent call last):\n"), "mpirun: a message\n",
                  ompi(0, "imeError: bo"), ompi(1, '  File "train.py", line 7'),
                  ompi(0, "om: the data is bad\n"), ompi(1, ", in <module>\n"),
                  ompi(0, marker(0))],
                 id="rank-splits-mid-word"),
])  # fmt: skip
def test_the_failure_keeps_the_exception_line_however_the_traceback_arrives(chunks):
    assert head_of_failure(*chunks) == f"Rank 0 on host algo-1 exited with code 1. {EXCEPTION}"


def test_a_last_line_without_newline_is_ended_at_eof():
    # mpirun's report can come before the rank's last chunk, which never gets its newline.
    chunks = ["  Process name: [[25250,1],0]\n", "  Exit code:    1\n",
              *[ompi(0, w) for w in WRITES[:-1]]]  # fmt: skip
    sup = make(ppn=1)
    printed = feed(sup, *rechunked(chunks, 3))
    assert printed[-1] == f"[1,mpirank:0,algo-1]<stderr>:{EXCEPTION}"
    head = failure.failure_message(sup.outcome(1)).splitlines()[0]
    assert head == f"Rank 0 on host algo-1 exited with code 1. {EXCEPTION}"


def test_interleaved_ranks_print_whole_lines():
    printed = feed(make(ppn=1), *interleaved(0, 1))
    assert printed.count(f"[1,mpirank:1,algo-2]<stderr>:{EXCEPTION}") == 1
    assert printed.count("[1,mpirank:0,algo-1]<stderr>:Traceback (most recent call last):") == 1
    assert len(printed) == 2 * 5


def test_rank_lines_keep_untagged_text_and_split_characters_apart():
    lines = RankLines()
    data = "[1,0]<stdout>:caf\u00e9 [1,1]<stdout>:x\nmpirun: note\n[1,0]<stdout>:ok\n".encode()
    got = [ln for i in range(len(data)) for ln in lines.feed(data[i:i + 1])] + lines.close()
    assert got == [(Tag("1", 1, "stdout"), "x"), (None, "mpirun: note"),
                   (Tag("1", 0, "stdout"), "caf\u00e9 ok")]  # fmt: skip
    assert RankLines().close() == []


def test_the_pipe_is_read_in_chunks_to_eof():
    # The real reader: a child writes the interleaved pieces and ends without a newline.
    chunks = interleaved(0, 1)[:-2] + [ompi(0, marker(0).strip())]
    script = ("import os, sys\n"
              f"for c in {chunks!r}:\n"
              "    os.write(2, c.encode())\n"
              "sys.exit(1)\n")  # fmt: skip
    outcome = make(ppn=1, argv=[sys.executable, "-c", script]).run()
    assert outcome.returncode == 1 and outcome.failure.rank == 0
    assert failure.failure_message(outcome).splitlines()[0].endswith(f"code 1. {EXCEPTION}")


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


def test_a_lost_host_stops_the_job_and_is_its_root_cause():
    lost = []
    sup = Supervisor([sys.executable, "-c", "import time; time.sleep(60)"], dict(os.environ),
                     os.getcwd(), grace=10.0, failure_timeout=1.0,
                     host_lost=lambda: lost[0] if lost else None)
    reason = "HostLostError: host algo-2 (ranks 2-3) stopped answering: no heartbeat for 15.0 s."
    threading.Timer(0.5, lambda: lost.append(reason)).start()
    start = time.monotonic()
    outcome = sup.run()
    assert time.monotonic() - start < 8  # SIGTERM at once, not the 10 s grace of a stop
    assert not outcome.ok and outcome.host_lost == reason
    text = failure.failure_message(outcome)
    assert text.startswith(reason + "\nExecuteUserScriptError:"), text
