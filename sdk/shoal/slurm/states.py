"""Slurm's job states in SageMaker's terms: one table, read by the backend's ``describe()``.

The job's supervisor (``shoal.local.runner``, run by the batch script) records every transition
itself, as for a local job. Slurm's state says what the supervisor cannot: that the job is
still waiting for nodes (PENDING), or that it ended without the supervisor recording it (a
node failed, the time limit or an administrator's ``scancel`` ended it, it ran out of memory).
"""

from __future__ import annotations

import json
from pathlib import Path

import attrs

RECORD_FILE = "slurm.json"  # in the job's directory: the Slurm job's id, and Shoal's stop

# Slurm state -> (TrainingJobStatus, SecondaryStatus) while the supervisor has not recorded an
# end; None: nothing to add to the supervisor's record
WAITING = {"PENDING": "Starting", "CONFIGURING": "Starting", "REQUEUED": "Starting",
           "REQUEUE_HOLD": "Starting", "REQUEUE_FED": "Starting", "RESV_DEL_HOLD": "Starting"}
RUNNING = {"RUNNING", "COMPLETING", "SUSPENDED", "STOPPED", "RESIZING", "SIGNALING",
           "STAGE_OUT"}
# ended: TrainingJobStatus, SecondaryStatus, and how the FailureReason or message words it
ENDED = {
    "COMPLETED": ("Failed", "Failed", "the batch script ended before the job's supervisor "
                                      "recorded an outcome"),
    "FAILED": ("Failed", "Failed", "the batch script failed"),
    "NODE_FAIL": ("Failed", "Failed", "a node of the job failed"),
    "BOOT_FAIL": ("Failed", "Failed", "a node of the job failed to boot"),
    "OUT_OF_MEMORY": ("Failed", "Failed", "the job ran out of memory"),
    "DEADLINE": ("Failed", "Failed", "the job reached its deadline"),
    "SPECIAL_EXIT": ("Failed", "Failed", "the job ended with a special exit"),
    "PREEMPTED": ("Stopped", "Stopped", "the job was preempted"),
    "REVOKED": ("Stopped", "Stopped", "the job was revoked"),
    "TIMEOUT": ("Stopped", "MaxRuntimeExceeded", "the job reached its time limit"),
    "CANCELLED": ("Stopped", "Stopped", "the job was cancelled"),
}


@attrs.frozen
class SlurmJob:
    """What Slurm says of a job (``scontrol show job`` or the completion log)."""

    job_id: str
    state: str                  # JobState, e.g. RUNNING, NODE_FAIL ("CANCELLED by 0" -> CANCELLED)
    reason: str = ""            # Reason= (why it waits, or why it failed)
    nodes: str = ""             # NodeList (a hostlist expression)
    exit_code: str = ""         # ExitCode=<code>:<signal>
    restarts: int = 0

    @property
    def ended(self) -> bool:
        return self.state in ENDED


def outcome(job: SlurmJob, stop_requested: bool = False) -> tuple[str, str, str]:
    """An ended job the supervisor did not record: (status, secondary status, reason)."""
    status, secondary, text = ENDED[job.state]
    if job.state == "CANCELLED" and not stop_requested:
        text += " by someone other than Shoal (scancel)"
    details = [f"Slurm job {job.job_id} ended {job.state}: {text}"]
    if job.reason and job.reason not in ("None", "(null)"):
        details.append(f"reason {job.reason}")
    if job.nodes and job.nodes != "(null)":
        details.append(f"nodes {job.nodes}")
    if job.exit_code and job.exit_code != "0:0":
        details.append(f"exit code {job.exit_code}")
    return status, secondary, "; ".join(details)


def waiting_message(job: SlurmJob) -> str | None:
    """The StatusMessage of a job that waits for its allocation, None once it runs."""
    if job.state not in WAITING:
        return None
    why = f" ({job.reason})" if job.reason and job.reason != "None" else ""
    return f"Slurm job {job.job_id} is {job.state.lower()}{why}: waiting for nodes"


def stopped_by_shoal(job_dir: Path) -> bool:
    try:
        return bool(json.loads((Path(job_dir) / RECORD_FILE).read_text()).get("StopRequested"))
    except (OSError, ValueError):
        return False


def stop_message(job_dir: Path) -> str | None:
    """The Stopped message of a job that Slurm stopped without Shoal asking (an
    administrator's scancel, a preemption); None when StopTrainingJob asked."""
    if stopped_by_shoal(job_dir):
        return None
    return ("Training job stopped: Slurm ended it (scancel by someone other than Shoal, or a "
            "preemption); what the hosts saved is kept")
