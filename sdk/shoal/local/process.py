"""Process control for local jobs: start the supervisor, end a whole process tree.

A local job is one supervisor process (``python -m shoal.local.runner <job-dir>``) in its own
session, with the launcher, mpirun and the ranks below it. Ending a job means ending that whole
tree, found with psutil (ranks started by mpirun's agents are still descendants), SIGTERM first
and SIGKILL after a grace period.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

GRACE_SECONDS = 10.0


def spawn_runner(job_dir: Path, log_file: Path) -> psutil.Process:
    """Start the supervisor of the job in ``job_dir`` with its output appended to ``log_file``."""
    with open(log_file, "ab", buffering=0) as log:
        child = subprocess.Popen(
            [sys.executable, "-u", "-m", "shoal.local.runner", str(job_dir)],
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            # Ctrl-C in the terminal reaches the follower, which stops the job as a whole.
            start_new_session=True,
        )
    return psutil.Process(child.pid)


def tree(root: psutil.Process) -> list[psutil.Process]:
    try:
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def terminate_tree(root: psutil.Process, grace: float = GRACE_SECONDS) -> None:
    """SIGTERM every process of the tree, then SIGKILL what is left after ``grace`` seconds."""
    procs = tree(root)
    for proc in procs:
        _signal(proc, signal.SIGTERM)
    alive = _wait_gone(procs, grace)
    # Processes forked while we waited are part of the job as well.
    alive = list({p.pid: p for p in alive + tree(root)}.values())
    for proc in alive:
        _signal(proc, signal.SIGKILL)
    _wait_gone(alive, 5)


def _wait_gone(procs: list[psutil.Process], timeout: float) -> list[psutil.Process]:
    """Waits until every process has exited; returns those still running after ``timeout``.

    A zombie has exited: its parent, or init, reaps it when it can. psutil's ``wait_procs``
    waits on a zombie that is not our child until the time-out, and where nothing reaps
    orphans (a container whose first process is not an init) that is the whole grace.
    """
    deadline = time.monotonic() + timeout
    while True:
        psutil.wait_procs(procs, timeout=0)  # reaps those that are our own children
        alive = [p for p in procs if _running(p)]
        if not alive or time.monotonic() >= deadline:
            return alive
        time.sleep(0.05)


def _running(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _signal(proc: psutil.Process, sig: int) -> None:
    try:
        proc.send_signal(sig)
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        pass


def find(pid: int, create_time: float) -> psutil.Process | None:
    """The process ``pid`` if it is still the one started at ``create_time`` (pids get reused)."""
    try:
        proc = psutil.Process(pid)
        if abs(proc.create_time() - create_time) < 0.01 and proc.status() != psutil.STATUS_ZOMBIE:
            return proc
    except psutil.NoSuchProcess:
        pass
    return None
