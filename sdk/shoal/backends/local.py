"""The local backend: the CreateTrainingJob request, run as processes on this machine.

``LocalBackend().submit(request)`` takes the very request that would go to SageMaker, writes
it into a new job directory (``$SHOAL_LOCAL_ROOT`` or ``~/.shoal/local``, see
``shoal.local.layout``) and starts the job's supervisor (``shoal.local.runner``). The returned
``LocalTrainingJob`` reads the job's record, so a job can be followed, described and stopped from
any process: ``LocalTrainingJob.attach("<job>")``.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import threading
import time
from pathlib import Path

from ..errors import (
    ConfigError,
    InputError,
    Interrupted,
    JobFailedError,
    JobNameInUseError,
    JobStoppedError,
)
from ..local import layout, metrics, process, state, storage
from ..local.network import network_mode

POLL_SECONDS = 0.1


class LocalBackend:
    """Runs requests whose instance type is ``local`` or ``local_gpu``."""

    def __init__(self, sagemaker_session=None, root: Path | None = None, region: str = "local"):
        self.sagemaker_session = sagemaker_session
        self.root = Path(root) if root else None
        self.region = region  # in the jobs' ARNs

    def submit(self, request: dict) -> LocalTrainingJob:
        paths = layout.JobPaths.for_job(request["TrainingJobName"], self.root)
        check_request(request, paths)
        network_mode(os.environ)  # an unknown SHOAL_LOCAL_NETWORK fails the call, not the job
        record_job(request, paths, self.region)
        runner = process.spawn_runner(paths.job_dir, paths.log_file)
        # Its own file: the supervisor owns job.json from now on.
        state.write(paths.runner_file, {"Pid": runner.pid, "CreateTime": runner.create_time()})
        return LocalTrainingJob(request["TrainingJobName"], paths, runner)


def check_request(request: dict, paths: layout.JobPaths) -> None:
    """What fails the call rather than the job, for a job whose files live in ``paths``
    (here, or on a Slurm cluster's shared directory)."""
    _check_name_free(request, paths)
    layout.host_names(request)  # refuse a malformed request before anything runs
    _check_local_sources(request)
    _check_local_code(request)
    metrics.definitions(request)  # a bad MetricDefinitions regex fails the call


def record_job(request: dict, paths: layout.JobPaths, region: str) -> None:
    """Claim the job's name and write its request and first record (Starting)."""
    _claim_name(request, paths)
    paths.request_file.write_text(_dumps(request))
    state.write(paths.state_file, state.initial(request, region))


def _check_name_free(request: dict, paths: layout.JobPaths) -> None:
    """A job's name is its folder under the output path: another job's name, or its folder
    (left by a job of another local root, or one whose record was deleted), is refused."""
    name = request["TrainingJobName"]
    taken = _same_name(paths.job_dir)
    if taken is not None:
        raise JobNameInUseError(f"a local job named {taken.name!r} already exists in {taken} "
                                f"(job names are unique regardless of case): choose another "
                                f"name", job_name=name)
    folder = layout.local_job_output(request)
    if folder is not None and folder.exists():
        raise JobNameInUseError(f"{folder} already exists: a job named {name!r} left its "
                                f"artifacts there; choose another job name or output path",
                                job_name=name)


def _same_name(job_dir: Path) -> Path | None:
    """The job directory of that name in any case (the ARN lowercases names, as SageMaker's)."""
    if job_dir.exists():
        return job_dir
    try:
        entries = os.scandir(job_dir.parent)
    except FileNotFoundError:
        return None
    with entries:
        lowered = job_dir.name.lower()
        return next((Path(e.path) for e in entries if e.name.lower() == lowered), None)


def _claim_name(request: dict, paths: layout.JobPaths) -> None:
    """Create the job's directory and its output folder; mkdir is atomic, so of two
    submissions of one name at once the second is refused."""
    paths.job_dir.parent.mkdir(parents=True, exist_ok=True)
    try:
        paths.job_dir.mkdir()
    except FileExistsError:
        raise JobNameInUseError(f"a local job named {paths.job_dir.name!r} already exists in "
                                f"{paths.job_dir}", job_name=paths.job_dir.name) from None
    folder = layout.local_job_output(request)
    try:
        if folder is not None:
            folder.mkdir(parents=True)
    except FileExistsError:
        paths.job_dir.rmdir()
        raise JobNameInUseError(f"{folder} already exists: another job named "
                                f"{paths.job_dir.name!r} writes there", job_name=paths.job_dir.name
                                ) from None
    except BaseException:
        paths.job_dir.rmdir()
        raise


def _check_local_sources(request: dict) -> None:
    """A ``file://`` channel that does not exist fails the call, not the job later."""
    for channel, uri in layout.channel_sources(request).items():
        if not storage.is_s3(uri) and not storage.file_path(uri).exists():
            raise InputError(f"channel {channel!r}: {uri} does not exist on this machine")


def _check_local_code(request: dict) -> None:
    """Code used in place (a ``file://`` ``sagemaker_submit_directory``) must be there now:
    a missing directory or program fails the call, not the job later. A file there is an
    archive (or the script) that the launcher unpacks."""
    from ..local.runner import local_code
    from ..staging import check_code_paths

    path = local_code(request)
    if path is None or os.path.isfile(path):
        return
    program = (request.get("HyperParameters") or {}).get("sagemaker_program")
    check_code_paths(json.loads(program) if program else None, path)


def _with_metrics(record: dict, job_dir: Path) -> dict:
    """The record with its FinalMetricDataList, and MetricDefinitions always present
    (SDK v2's TrainingJobAnalytics indexes it)."""
    spec = record.get("AlgorithmSpecification")
    if spec is None:
        return record
    definitions = spec.setdefault("MetricDefinitions", [])
    if not definitions:
        return record
    final = metrics.final_metrics([d["Name"] for d in definitions], metrics.read(job_dir))
    if final:
        record["FinalMetricDataList"] = final
    return record


def _dumps(data) -> str:
    return json.dumps(data, indent=1, default=str)


class LocalTrainingJob:
    """A local job: ``describe()``, ``wait(logs)``, ``logs()``, ``stop()``, ``model_data``."""

    kind = "local"  # how errors name the job

    def __init__(self, name: str, paths: layout.JobPaths, runner=None):
        self.name = self.job_name = name
        self.paths = paths
        self._runner = runner

    @classmethod
    def attach(cls, job_name: str, root: Path | None = None) -> LocalTrainingJob:
        paths = layout.JobPaths.for_job(job_name, root)
        if not paths.state_file.exists():
            raise ConfigError(f"no local job named {job_name!r} in {paths.job_dir.parent}")
        return cls(job_name, paths)

    # -- reading ---------------------------------------------------------------------------
    def _record(self) -> dict:
        return state.read(self.paths.state_file)

    def describe(self) -> dict:
        record = self._record()
        if record["TrainingJobStatus"] not in state.TERMINAL and self._supervisor_died():
            record = self._record()  # it may have ended between the two reads
            if record["TrainingJobStatus"] not in state.TERMINAL:
                record = state.transition(record, "Failed", "the local job's supervisor died")
                record["FailureReason"] = "ClientError: the local job's supervisor process died"
                state.write(self.paths.state_file, record)
        return _with_metrics(record, self.paths.job_dir)

    def _supervisor_died(self) -> bool:
        # Without runner.json the supervisor is still being started (or started elsewhere).
        known = self._runner is not None or self.paths.runner_file.exists()
        return known and self.runner() is None

    @property
    def status(self) -> str:
        return self.describe()["TrainingJobStatus"]

    @property
    def model_data(self) -> str | None:
        return self.describe().get("ModelArtifacts", {}).get("S3ModelArtifacts")

    def runner(self):
        """The live supervisor process, or None once it has exited."""
        if self._runner is not None:
            return process.find(self._runner.pid, self._runner.create_time())
        if not self.paths.runner_file.exists():
            return None
        info = state.read(self.paths.runner_file)
        return process.find(info["Pid"], info["CreateTime"])

    # -- following -------------------------------------------------------------------------
    def logs(self, wait: bool = True, out=None) -> None:
        """Print the job's log, until the job ends unless ``wait=False``."""
        out = out or sys.stdout
        with _open_log(self.paths.log_file) as log:
            while True:
                chunk = log.read()
                if chunk:
                    out.write(chunk)
                    out.flush()
                elif not wait or self._ended():
                    out.write(log.read())
                    return
                else:
                    time.sleep(POLL_SECONDS)

    def _ended(self) -> bool:
        return self.describe()["TrainingJobStatus"] in state.TERMINAL

    def wait(self, logs="All", out=None) -> dict:
        """Follow the job to its end; raise ``JobFailedError``/``JobStoppedError`` unless it completed.

        Ctrl-C or SIGTERM stops the job (its whole process tree) and raises ``Interrupted``:
        a local job does not outlive the process that follows it.
        """
        try:
            with _sigterm_interrupts():
                if logs and logs != "None":
                    self.logs(wait=True, out=out)
                else:
                    while not self._ended():
                        time.sleep(POLL_SECONDS)
        except KeyboardInterrupt:
            self.stop(wait=True)
            raise Interrupted(f"interrupted: {self.kind} job {self.name} was stopped") from None
        self._reap()
        description = self.describe()
        from shoal.follow import as_output, closing_lines

        if logs and logs != "None":  # final metrics and the rules' findings, as for SageMaker
            printer = as_output(out)
            for line in closing_lines(description):
                printer(line)
        status = description["TrainingJobStatus"]
        if status == "Failed":
            reason = description.get("FailureReason")
            raise JobFailedError(f"{self.kind} job {self.name} failed: {reason}", job_name=self.name,
                                 status=status, reason=reason)
        if status == "Stopped":
            raise JobStoppedError(f"{self.kind} job {self.name} was stopped", job_name=self.name,
                                  status=status)
        return description

    def _reap(self, timeout: float = 30.0) -> None:
        """Wait for the supervisor to exit: it writes the final record just before it does."""
        runner = self._runner or self.runner()  # our own child is reaped here, zombie or not
        if runner is not None:
            try:
                runner.wait(timeout=timeout)
            except Exception:  # psutil.TimeoutExpired: leave it; describe() still tells the truth
                pass

    def stop(self, wait: bool = False, timeout: float = 60.0) -> None:
        """Ask the supervisor to stop the job; with ``wait``, return once the tree is gone."""
        runner = self.runner()
        if runner is None:
            return
        process.terminate_tree(runner, grace=timeout) if wait else runner.terminate()


@contextlib.contextmanager
def _sigterm_interrupts():
    """While following, SIGTERM and SIGINT stop the job (signal handlers exist in the main
    thread only). SIGINT gets its handler explicitly: a process started in the background
    by a non-interactive shell inherits SIGINT ignored, and Python then installs none."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum, frame):
        raise KeyboardInterrupt

    previous = {sig: signal.signal(sig, interrupt) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _open_log(path: Path):
    for _ in range(50):  # the supervisor creates the file as it starts
        if path.exists():
            break
        time.sleep(POLL_SECONDS)
    return open(path, encoding="utf-8", errors="replace")


def backend(session=None) -> LocalBackend:
    """The local backend bound to ``session`` (the protocol of ``shoal.backends``)."""
    return LocalBackend(session)
