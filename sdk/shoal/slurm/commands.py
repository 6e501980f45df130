"""The cluster's own commands, the only way the backend talks to Slurm: ``sbatch --parsable``
to submit, ``scontrol show job -o`` for a job's state while slurmctld keeps its record
(``MinJobAge`` after it ends), then ``sacct`` (accounting, or ``-c``: the completion log that
clusters without slurmdbd keep) for an older job, ``scancel`` to stop one.

Every call has a time-out and fails with ``SlurmError`` carrying the command's own message.

``sbatch`` exports the submitter's environment to the job (Slurm's default) but for AWS
secrets: Slurm keeps a job's environment in its state files and hands it to every step, and
the nodes take credentials as SageMaker's instances do, from their own chain (an instance
role, a shared ``~/.aws``, ``AWS_SHARED_CREDENTIALS_FILE``; the file paths do travel).
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Mapping
from pathlib import Path

from shoal.errors import ConfigError
from shoal.launcher.mpi import CREDENTIAL

from .states import SlurmJob

TIMEOUT = 30.0
_FIELD = re.compile(r"(\w+)=(\S*)")


def job_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """What sbatch exports to the job: the environment less AWS secrets (pure)."""
    return {k: v for k, v in environ.items()
            if not CREDENTIAL.match(k) or k.endswith("_FILE")}


class SlurmError(ConfigError):
    """A Slurm command failed, or Slurm is not installed here."""


def _run(argv: list[str], check: bool = True, env: Mapping[str, str] | None = None
         ) -> subprocess.CompletedProcess:  # fmt: skip
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=TIMEOUT, env=env)
    except FileNotFoundError:
        raise SlurmError(f"{argv[0]} is not installed here: the Slurm backend needs the "
                         "cluster's client commands (Debian: slurm-client)") from None
    except subprocess.TimeoutExpired:
        raise SlurmError(f"{' '.join(argv)} did not answer within {TIMEOUT:.0f} s: is "
                         "slurmctld reachable?") from None
    if check and done.returncode != 0:
        raise SlurmError(f"{' '.join(argv)}: {(done.stderr or done.stdout).strip()}")
    return done


def sbatch(script: Path) -> str:
    """Submits the batch script; the job's id."""
    out = _run(["sbatch", "--parsable", str(script)],
               env=job_environment(os.environ)).stdout.strip()
    job_id = out.split(";")[0]  # "<id>" or "<id>;<cluster>"
    if not job_id.isdigit():
        raise SlurmError(f"sbatch answered {out!r}, not a job id")
    return job_id


def parse_show(text: str) -> SlurmJob | None:
    fields = dict(_FIELD.findall(text))
    if "JobId" not in fields:
        return None
    return SlurmJob(fields["JobId"], fields.get("JobState", "").split()[0],
                    fields.get("Reason", ""), fields.get("NodeList", ""),
                    fields.get("ExitCode", ""), int(fields.get("Restarts", 0) or 0))


def parse_sacct(text: str, job_id: str) -> SlurmJob | None:
    """``sacct -P -n -o JobID,State,NodeList,ExitCode`` lines: the job's own line (its steps,
    ``<id>.batch``, ``<id>.0``, are skipped); ``CANCELLED by 0`` is CANCELLED."""
    for line in text.splitlines():
        parts = line.split("|")
        if len(parts) >= 4 and parts[0] == job_id:
            return SlurmJob(job_id, parts[1].split()[0].rstrip("+"), "", parts[2], parts[3])
    return None


def show(job_id: str) -> SlurmJob | None:
    """The job as Slurm knows it, or None when no record is left anywhere."""
    done = _run(["scontrol", "show", "job", "-o", job_id], check=False)
    if done.returncode == 0:
        job = parse_show(done.stdout)
        if job is not None:
            return job
    fields = ["-P", "-n", "-o", "JobID,State,NodeList,ExitCode", "-j", job_id]
    for completion in ([], ["-c"]):  # accounting first; without slurmdbd, the completion log
        done = _run(["sacct", *completion, *fields], check=False)
        if done.returncode == 0:
            job = parse_sacct(done.stdout, job_id)
            if job is not None:
                return job
    return None


def cancel(job_id: str, batch_only: bool = False, signal: str | None = None) -> None:
    """``scancel``: the whole job, or (``batch_only``) a signal to its batch script alone."""
    argv = ["scancel"]
    if batch_only:
        argv.append("--batch")
    if signal:
        argv.append(f"--signal={signal}")
    _run([*argv, job_id])


def hostnames(expression: str) -> list[str]:
    """A hostlist expression (``node[1-3,7]``) expanded, in Slurm's order."""
    return _run(["scontrol", "show", "hostnames", expression]).stdout.split()
