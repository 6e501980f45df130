"""The Slurm backend: the CreateTrainingJob request run on a Slurm cluster.

``SlurmBackend(settings).submit(request)`` checks the request as the local backend does, writes
it and its record into ``<shared_dir>/<job>/`` (a directory every node sees), and submits the
job's batch script (``shoal.slurm.batch``) with ``sbatch``. The script runs the job's
supervisor on the allocation's first node; it records every transition in ``job.json`` as a
local job's does, so ``describe()``, ``logs()`` and ``wait()`` read the same files. Slurm is
asked (``scontrol``, then ``sacct``) only for what the supervisor cannot record: a job still
waiting for nodes, or one that Slurm ended (node failure, time limit, out of memory, an
administrator's ``scancel``), whose state then becomes the record's end with its reason.

``stop()`` signals the batch script alone (SIGTERM): the supervisor stops the hosts, keeps what
they saved and records Stopped, as on SageMaker; a job still pending is cancelled outright.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from ..errors import ConfigError
from ..local import layout, state
from ..slurm import batch, commands, states
from ..slurm.settings import SlurmSettings
from . import local

QUERY_SECONDS = 2.0  # how often describe() asks Slurm at most (logs() polls ten times a second)


class SlurmBackend:
    """Runs requests on a Slurm cluster (``Session(backend="slurm")``, ``SHOAL_BACKEND=slurm``)."""

    def __init__(self, sagemaker_session=None, settings: SlurmSettings | None = None,
                 region: str = "local"):
        if settings is None and hasattr(sagemaker_session, "slurm_settings"):
            settings = sagemaker_session.slurm_settings()
        self.settings = settings or SlurmSettings.from_env()
        self.region = region

    def submit(self, request: dict) -> SlurmTrainingJob:
        paths = layout.JobPaths.for_job(request["TrainingJobName"], self.settings.shared_dir)
        local.check_request(request, paths)
        text = batch.script(request, paths.job_dir, self.settings)  # refuses before anything
        local.record_job(request, paths, self.region)
        script = paths.job_dir / batch.SCRIPT_NAME
        script.write_text(text)
        try:
            job_id = commands.sbatch(script)
        except ConfigError as error:
            record = state.transition(state.read(paths.state_file), "Failed")
            record["FailureReason"] = f"ClientError: sbatch refused the job: {error}"[:1024]
            state.write(paths.state_file, record)
            raise
        state.write(paths.job_dir / states.RECORD_FILE, {"JobId": job_id, "StopRequested": False})
        return SlurmTrainingJob(request["TrainingJobName"], paths)


class SlurmTrainingJob(local.LocalTrainingJob):
    """A Slurm job: the local job's files, and Slurm's state where they cannot tell."""

    kind = "Slurm"

    def __init__(self, name: str, paths: layout.JobPaths, runner=None):
        super().__init__(name, paths, None)
        self._queried: tuple[float, states.SlurmJob | None] | None = None
        self._job_id: str | None = None  # fixed once sbatch answered

    @classmethod
    def attach(cls, job_name: str, root: Path | None = None) -> SlurmTrainingJob:
        root = root or SlurmSettings.from_env().shared_dir
        paths = layout.JobPaths.for_job(job_name, root)
        if not paths.state_file.exists():
            raise ConfigError(f"no Slurm job named {job_name!r} in {root} (the cluster's "
                              "shared directory: SHOAL_SLURM_SHARED_DIR)")
        return cls(job_name, paths)

    @property
    def slurm(self) -> dict:
        """The Slurm side's record; empty for a job sbatch refused (its record says why)."""
        try:
            return json.loads((self.paths.job_dir / states.RECORD_FILE).read_text())
        except FileNotFoundError:
            return {}

    @property
    def slurm_job_id(self) -> str | None:
        if self._job_id is None:  # describe() runs ten times a second while logs() follows
            self._job_id = self.slurm.get("JobId")
        return self._job_id

    def slurm_job(self, fresh: bool = False) -> states.SlurmJob | None:
        if self.slurm_job_id is None:
            return None
        now = time.monotonic()
        if fresh or self._queried is None or now - self._queried[0] > QUERY_SECONDS:
            self._queried = (now, commands.show(self.slurm_job_id))
        return self._queried[1]

    def describe(self) -> dict:
        record = self._record()
        if record["TrainingJobStatus"] not in state.TERMINAL:
            job = self.slurm_job()
            if job is None or job.ended:
                record = self._record()  # the supervisor may have just written its end
                if record["TrainingJobStatus"] not in state.TERMINAL:
                    record = self._end_from_slurm(record, job)
            elif (message := states.waiting_message(job)) is not None:
                record["SecondaryStatusTransitions"][-1]["StatusMessage"] = message
        return local._with_metrics(record, self.paths.job_dir)

    def _end_from_slurm(self, record: dict, job: states.SlurmJob | None) -> dict:
        if job is None:
            status, secondary = "Failed", "Failed"
            reason = (f"Slurm job {self.slurm_job_id} is unknown to the cluster (its record "
                      "expired) and its supervisor recorded no end")
        else:
            status, secondary, reason = states.outcome(job, self.slurm.get("StopRequested", False))
        record = state.transition(record, secondary, reason if status != "Failed" else None)
        if status == "Failed":
            record["FailureReason"] = reason[:1024]
        state.write(self.paths.state_file, record)
        return record

    def _supervisor_died(self) -> bool:
        return False  # Slurm says so instead (describe)

    def _reap(self, timeout: float = 30.0) -> None:
        """After the supervisor's last record, until Slurm has ended the job too (its batch
        script exits right after): wait() returns with nothing of the job left running."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            job = self.slurm_job(fresh=True)
            if job is None or job.ended:
                return
            time.sleep(0.2)

    def runner(self):
        return None

    def stop(self, wait: bool = False, timeout: float = 60.0) -> None:
        """SIGTERM to the batch script (the supervisor stops the job and records Stopped); a
        job not running yet is cancelled. With ``wait``, until it ended, then ``scancel``."""
        if self.slurm_job_id is None:
            return  # never submitted
        info = {**self.slurm, "StopRequested": True}
        state.write(self.paths.job_dir / states.RECORD_FILE, info)
        job = self.slurm_job(fresh=True)
        if job is None or job.ended:
            return
        if job.state in states.WAITING:
            commands.cancel(info["JobId"])
        else:
            commands.cancel(info["JobId"], batch_only=True, signal="TERM")
        if wait:
            deadline = time.monotonic() + timeout
            while not self._ended() and time.monotonic() < deadline:
                time.sleep(0.5)
            if not self._ended():
                commands.cancel(info["JobId"])


def backend(session=None) -> SlurmBackend:
    return SlurmBackend(session)
