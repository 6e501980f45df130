"""Reading Slurm's answers: scontrol's one-line records, sacct's rows, sbatch's id."""

from __future__ import annotations

import subprocess

import pytest
from shoal.slurm import commands

SHOW = ("JobId=12 JobName=my-job UserId=root(0) GroupId=root(0) Priority=1 JobState=NODE_FAIL "
        "Reason=NodeDown Dependency=(null) Requeue=0 Restarts=2 BatchFlag=1 ExitCode=0:9 "
        "NodeList=node[1-2] BatchHost=node1 Command=/shared/my job/sbatch.sh")


def test_scontrol_show_job_gives_state_reason_nodes_exit_code_and_restarts():
    job = commands.parse_show(SHOW)
    assert (job.job_id, job.state, job.reason, job.nodes, job.exit_code, job.restarts) == (
        "12", "NODE_FAIL", "NodeDown", "node[1-2]", "0:9", 2)
    assert commands.parse_show("slurm_load_jobs error: Invalid job id specified") is None


def test_sacct_rows_skip_the_steps_and_read_a_cancellation_by_someone():
    text = ("12.batch|CANCELLED|node1|0:15\n12|CANCELLED by 0|node[1-2]|0:0\n"
            "12.0|CANCELLED|node[1-2]|0:15\n")
    job = commands.parse_sacct(text, "12")
    assert (job.state, job.nodes) == ("CANCELLED", "node[1-2]")
    assert commands.parse_sacct("13|COMPLETED|node1|0:0\n", "12") is None


class Calls:
    def __init__(self, answers):
        self.answers, self.argvs = answers, []

    def __call__(self, argv, **_):
        self.argvs.append(argv)
        code, out = self.answers[argv[0] + (" -c" if "-c" in argv else "")]
        return subprocess.CompletedProcess(argv, code, out, "error text" if code else "")


def test_an_expired_record_is_read_from_accounting_then_the_completion_log(monkeypatch):
    calls = Calls({"scontrol": (1, ""), "sacct": (1, ""),
                   "sacct -c": (0, "12|TIMEOUT|node[1-2]|0:0\n")})
    monkeypatch.setattr(commands.subprocess, "run", calls)
    assert commands.show("12").state == "TIMEOUT"
    assert [a[0] for a in calls.argvs] == ["scontrol", "sacct", "sacct"]


def test_sbatch_gives_the_id_and_its_errors_verbatim(monkeypatch, tmp_path):
    monkeypatch.setattr(commands.subprocess, "run", Calls({"sbatch": (0, "42;cluster\n")}))
    assert commands.sbatch(tmp_path / "s.sh") == "42"
    monkeypatch.setattr(commands.subprocess, "run", Calls({"sbatch": (1, "")}))
    with pytest.raises(commands.SlurmError, match="sbatch --parsable .*: error text"):
        commands.sbatch(tmp_path / "s.sh")


def test_sbatch_exports_the_environment_but_aws_secrets(monkeypatch, tmp_path):
    seen = {}

    def run(argv, **kwargs):
        seen.update(kwargs["env"])
        return subprocess.CompletedProcess(argv, 0, "7\n", "")

    monkeypatch.setattr(commands.subprocess, "run", run)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "s3cr3t")
    monkeypatch.setenv("AWS_SESSION_TOKEN", "t0k3n")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/shared/home/.aws/credentials")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-west-2")
    assert commands.sbatch(tmp_path / "s.sh") == "7"
    assert "AWS_SECRET_ACCESS_KEY" not in seen and "AWS_SESSION_TOKEN" not in seen
    assert "AWS_ACCESS_KEY_ID" not in seen
    assert seen["AWS_SHARED_CREDENTIALS_FILE"] == "/shared/home/.aws/credentials"
    assert seen["AWS_DEFAULT_REGION"] == "us-west-2" and "PATH" in seen


def test_missing_commands_say_what_to_install(monkeypatch):
    def missing(argv, **_):
        raise FileNotFoundError(argv[0])

    monkeypatch.setattr(commands.subprocess, "run", missing)
    with pytest.raises(commands.SlurmError, match="scancel is not installed here.*slurm-client"):
        commands.cancel("1")
