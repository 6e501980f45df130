"""A job that Slurm requeues (``scontrol requeue``, a node failure with ``--requeue``,
HyperPod's auto-resume) gets SIGTERM like a cancelled one and later runs its batch script again
from the top, with ``SLURM_RESTART_COUNT`` one higher. The supervisor tells the two apart by
asking Slurm: while the requeue is under way the job's ``Restarts`` is already the new count.
"""

from __future__ import annotations

from collections.abc import Mapping

from . import commands


def restart_count(environ: Mapping[str, str]) -> int:
    """How many times Slurm has restarted this job before this run (0: its first run)."""
    try:
        return int(environ.get("SLURM_RESTART_COUNT") or 0)
    except ValueError:
        return 0


def requeue_pending(environ: Mapping[str, str]) -> int | None:
    """The restart Slurm is about to start, when the SIGTERM just received is a requeue;
    None for a cancel, a time limit, or when Slurm cannot be asked."""
    job_id = environ.get("SLURM_JOB_ID")
    if not job_id:
        return None
    try:
        job = commands.show(job_id)
    except commands.SlurmError:
        return None
    if job is not None and job.restarts > restart_count(environ):
        return job.restarts
    return None
