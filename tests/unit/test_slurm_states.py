"""Slurm's states in SageMaker's terms, for jobs the supervisor could not record."""

from __future__ import annotations

import pytest
from shoal.local import state
from shoal.slurm import states
from shoal.slurm.states import SlurmJob


@pytest.mark.parametrize("slurm,status,secondary", [
    ("NODE_FAIL", "Failed", "Failed"), ("OUT_OF_MEMORY", "Failed", "Failed"),
    ("TIMEOUT", "Stopped", "MaxRuntimeExceeded"), ("CANCELLED", "Stopped", "Stopped"),
    ("PREEMPTED", "Stopped", "Stopped"), ("BOOT_FAIL", "Failed", "Failed"),
])
def test_an_ended_job_gets_the_services_status_and_a_reason_naming_state_and_nodes(
        slurm, status, secondary):
    job = SlurmJob("41", slurm, "NodeDown", "node[1-2]", "0:9")
    got_status, got_secondary, reason = states.outcome(job, stop_requested=True)
    assert (got_status, got_secondary) == (status, secondary)
    assert state.PRIMARY[got_secondary] == got_status  # a transition the record knows
    assert reason.startswith(f"Slurm job 41 ended {slurm}: ")
    assert "reason NodeDown" in reason and "nodes node[1-2]" in reason
    assert "exit code 0:9" in reason


def test_a_cancel_shoal_did_not_ask_for_says_so():
    job = SlurmJob("7", "CANCELLED")
    assert "by someone other than Shoal" in states.outcome(job, stop_requested=False)[2]
    assert "someone other" not in states.outcome(job, stop_requested=True)[2]


def test_a_waiting_job_says_why_and_a_running_one_nothing():
    assert states.waiting_message(SlurmJob("9", "PENDING", "Resources")) == (
        "Slurm job 9 is pending (Resources): waiting for nodes")
    assert states.waiting_message(SlurmJob("9", "RUNNING")) is None
    assert not SlurmJob("9", "RUNNING").ended and SlurmJob("9", "TIMEOUT").ended
