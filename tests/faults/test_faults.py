"""The fault-injection suite: each case injects one fault into a training job of 2 namespaced
hosts x 2 ranks (see ``harness``) and checks that the job ends within its budget, names the
root cause, leaves nothing behind and keeps what it wrote before the fault.

    make test                                  (once each)
    make stress-faults FAULT_RUNS=20           (repeatedly, beside two busy loops)
"""

from __future__ import annotations

import re
import subprocess

from tests.faults.harness import (
    COLLECTIVE_TIMEOUT,
    checkpoints,
    finish,
    host_namespace,
    mark_fault,
    model_files,
    namespace_pids,
    rank_pids,
    signal,
    signal_pids,
    start,
)

QUICK = 60.0                        # a fault the job notices at once, or its heartbeat does
HANGING = COLLECTIVE_TIMEOUT + 30.0  # a fault only the collective time-out notices
# The launchers' heartbeat with its defaults (SHOAL_HOST_TIMEOUT 15 s): a host killed, cut
# off or frozen is named as lost, whatever its ranks were doing
HOST_LOST = r"HostLostError: host algo-2 \(ranks 2-3\) stopped answering: "


def kept_what_it_wrote(job) -> None:
    assert model_files(job)["before-fault.txt"] == b"written before the fault"
    assert checkpoints(job) and checkpoints(job)[0] == 0


def test_a_rank_killed(tmp_path, monkeypatch):
    job = start(tmp_path, "rank-killed", monkeypatch)
    victim = rank_pids("algo-2")[0]
    mark_fault(job)
    signal_pids([victim], signal.SIGKILL)
    d = finish(job, QUICK)
    assert d["TrainingJobStatus"] == "Failed"
    assert re.search(r"Rank [23] on host algo-2 (was killed by SIGKILL|exited)", d["FailureReason"]), \
        d["FailureReason"]
    kept_what_it_wrote(job)


def test_a_host_killed(tmp_path, monkeypatch):
    job = start(tmp_path, "host-killed", monkeypatch)
    mark_fault(job)
    signal_pids(namespace_pids("algo-2"), signal.SIGKILL)  # every process of the host
    d = finish(job, QUICK)
    assert d["TrainingJobStatus"] == "Failed"
    # its kernel refuses the heartbeats at once: no need to wait for the time-out
    assert re.search(HOST_LOST + r"connection refused: ", d["FailureReason"]), d["FailureReason"]
    kept_what_it_wrote(job)


def test_a_link_dropped(tmp_path, monkeypatch):
    job = start(tmp_path, "link-dropped", monkeypatch)
    mark_fault(job)
    subprocess.run(["ip", "-n", host_namespace("algo-2"), "link", "set", "eth0", "down"],
                   check=True)
    d = finish(job, QUICK)
    assert d["TrainingJobStatus"] == "Failed"
    assert re.search(HOST_LOST + r"(unreachable: )?no heartbeat for 1\d\.\d s",
                     d["FailureReason"]), d["FailureReason"]
    kept_what_it_wrote(job)


def test_a_host_frozen(tmp_path, monkeypatch):
    """Every process of algo-2 stopped (SIGSTOP): its kernel still acknowledges TCP, so no
    connection breaks; only the silence of its launcher tells."""
    job = start(tmp_path, "host-frozen", monkeypatch)
    mark_fault(job)
    signal_pids(namespace_pids("algo-2"), signal.SIGSTOP)
    d = finish(job, QUICK)
    assert d["TrainingJobStatus"] == "Failed"
    assert re.search(HOST_LOST + r"no heartbeat for 1\d\.\d s", d["FailureReason"]), \
        d["FailureReason"]
    kept_what_it_wrote(job)


def test_a_rank_frozen_until_the_collective_time_out(tmp_path, monkeypatch):
    """One rank stopped inside a live host: its launcher still answers, so only the
    collective time-out (lowered here, as a user would) ends the job."""
    job = start(tmp_path, "rank-frozen", monkeypatch, SHOAL_COLLECTIVE_TIMEOUT=COLLECTIVE_TIMEOUT)
    victim = rank_pids("algo-2")[-1]
    mark_fault(job)
    signal_pids([victim], signal.SIGSTOP)
    d = finish(job, HANGING)
    assert d["TrainingJobStatus"] == "Failed"
    assert re.search(r"CollectiveTimeoutError: allreduce timed out after 20s waiting for ranks "
                     r"\[[23]\]", d["FailureReason"]), d["FailureReason"]
    kept_what_it_wrote(job)


def test_a_slow_link_slows_the_job_but_does_not_break_it(tmp_path, monkeypatch):
    """The link between the hosts drops to 20 Mbit/s mid-training: collectives that still
    make progress are not a failure (the time-out is for peers that do not arrive); the job
    finishes its steps, correct, within its budget."""
    job = start(tmp_path, "slow-link", monkeypatch, STEPS=60)
    mark_fault(job)
    subprocess.run(["ip", "netns", "exec", host_namespace("algo-2"), "tc", "qdisc", "replace",
                    "dev", "eth0", "root", "tbf", "rate", "20mbit", "burst", "32kb",
                    "latency", "50ms"], check=True)
    d = finish(job, QUICK)
    assert d["TrainingJobStatus"] == "Completed", d.get("FailureReason")
    assert job.log().count("finished") == 4
    kept_what_it_wrote(job)


def test_sigterm_to_the_job_stops_it_and_keeps_its_work(tmp_path, monkeypatch):
    """SageMaker's StopTrainingJob: SIGTERM to the job's supervisor."""
    job = start(tmp_path, "stopped", monkeypatch)
    mark_fault(job)
    job.backend_job.stop()
    d = finish(job, QUICK)
    assert (d["TrainingJobStatus"], d["SecondaryStatus"]) == ("Stopped", "Stopped")
    assert "FailureReason" not in d
    kept_what_it_wrote(job)


def test_a_spot_interruption_then_a_restart_that_resumes_from_its_checkpoints(tmp_path,
                                                                              monkeypatch):
    first = start(tmp_path, "spot-1", monkeypatch)
    mark_fault(first)
    first.backend_job.stop()  # the interruption: SIGTERM, as SageMaker sends it
    assert finish(first, QUICK)["TrainingJobStatus"] == "Stopped"
    saved = checkpoints(first)
    assert saved and saved[-1] > 0
    restart = start(tmp_path, "spot-2", monkeypatch, STEPS=saved[-1] + 40)
    mark_fault(restart)  # nothing more is injected: the restart must complete
    d = finish(restart, QUICK + 60)
    assert d["TrainingJobStatus"] == "Completed", d.get("FailureReason")
    log = restart.log()
    assert f"resumed from step {saved[-1]}" in log and "finished" in log


def test_the_model_directory_disk_full(tmp_path, monkeypatch):
    """Rank 0's model directory (on algo-1) fills up: a 64 KiB file system is mounted over it
    in the host's own mount namespace, and its next 256 KiB save fails."""
    job = start(tmp_path, "disk-full", monkeypatch)
    rank0 = rank_pids("algo-1")[0]
    mark_fault(job)
    subprocess.run(["nsenter", "-t", str(rank0), "-m", "mount", "-t", "tmpfs", "-o", "size=64k",
                    "tmpfs", "/opt/ml/model"], check=True)
    d = finish(job, QUICK)
    assert d["TrainingJobStatus"] == "Failed"
    assert re.search(r"Rank 0 on host algo-1 exited with code 1\. .*No space left on device",
                     d["FailureReason"]), d["FailureReason"]
    kept_what_it_wrote(job)  # what was saved before the disk filled, under the full mount
