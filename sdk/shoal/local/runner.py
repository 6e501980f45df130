"""The supervisor of one local job: ``python -m shoal.local.runner <job-dir>``.

It does on this machine what SageMaker does around the container: lays out every simulated
host's ``/opt/ml`` tree, fetches the input channels and restores checkpoints (Downloading), runs
the launcher for all hosts through ``shoal.launcher.simulate`` (Training), saves checkpoints and
packages ``model.tar.gz`` / ``output.tar.gz`` into the job's own folder of the output path,
``<output_path>/<job>/output/`` (Uploading; a job that failed, was stopped or ran out of time
once training had begun keeps them too, as on SageMaker), and records every
transition in ``job.json``. SIGTERM (``stop()``, Ctrl-C) ends the launcher's whole process tree
and the job ends as Stopped. Its output is the job's log (``logs.txt``).
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import signal
import sys
import tarfile
import tempfile
import threading
import time
from pathlib import Path

import psutil

from ..errors import InputError
from . import framework, layout, log_streams, metrics, process, state, storage
from .network import network_mode

FAILURE_LIMIT = 1024
TIMEOUT_EXIT = 124  # simulate.run_job's code when MaxRuntimeInSeconds ran out


class Supervisor:
    def __init__(self, job_dir: Path):
        self.paths = layout.JobPaths(job_dir)
        self.request = json.loads(self.paths.request_file.read_text())
        self.hosts = layout.host_names(self.request)
        self.stopping = threading.Event()
        # The main thread moves the job while the rules thread records verdicts: each
        # read-modify-write of the record holds this, or one of them loses the other's change.
        self.record_lock = threading.Lock()
        self.network = network_mode(os.environ)
        # the batch script of a Slurm job runs this supervisor on the allocation's first node
        self.on_slurm = os.environ.get("SHOAL_BACKEND") == "slurm"
        self.hosts_done = False  # the hosts' launchers have all ended
        if self.on_slurm:
            _SPEAKER[0] = "slurm"
        self.training = False
        self.profiler = None
        config = self.request.get("ProfilerConfig") or {}
        if config and not config.get("DisableProfiler", False):
            from . import profiling  # numpy and the rules: only for a job that profiles

            self.profiler = profiling.JobProfiler(self.request, self.paths.job_dir, self.hosts)

    # -- state -----------------------------------------------------------------------------
    def move(self, status: str, message: str | None = None, quiet: bool = False,
             **fields) -> None:
        with self.record_lock:
            record = state.transition(state.read(self.paths.state_file), status, message)
            record.update(fields)
            if not quiet:  # first: a follower reads the log to its end once the record is final
                say(record["SecondaryStatusTransitions"][-1]["StatusMessage"])
            state.write(self.paths.state_file, record)

    # -- phases ----------------------------------------------------------------------------
    def restarting(self) -> None:
        """A Slurm job run again after a requeue: say so; the last run's failure files go
        (this run's outcome is its own)."""
        if not self.on_slurm:
            return
        from shoal.slurm.restarts import restart_count

        count = restart_count(os.environ)
        if count:
            self.move("Restarting", f"Slurm restarted the job (restart {count}): restoring its "
                                    "checkpoints")
            for host in self.hosts:
                (self.paths.output_dir(host) / "failure").unlink(missing_ok=True)

    def prepare(self) -> None:
        code = local_code(self.request)
        interface = ("eth0" if self.network == "namespaces" or self.on_slurm
                     else layout.LOCAL_NETWORK_INTERFACE)
        for host in self.hosts:
            config = self.paths.config_dir(host)
            config.mkdir(parents=True, exist_ok=True)
            for name, content in layout.config_files(self.request, host, interface).items():
                (config / name).write_text(json.dumps(content, indent=1))
            for sub in ("model", "output/data", "code"):
                (self.paths.host_dir(host) / sub).mkdir(parents=True, exist_ok=True)
            if code:
                place_code(self.request, code, self.paths.host_dir(host) / "code")

    def download(self) -> None:
        for channel, uri in layout.channel_sources(self.request).items():
            self.stage_channel(channel, uri)
        s3_uri, local_path = layout.checkpoint_config(self.request)
        if s3_uri:  # the script finds its checkpoint directory, restored into or empty
            for host in self.hosts:
                self.paths.checkpoint_dir(host, local_path).mkdir(parents=True, exist_ok=True)
        if s3_uri and not storage.is_s3(s3_uri) and not storage.file_path(s3_uri).exists():
            say(f"no checkpoints in {s3_uri} yet: nothing to restore")  # a first run
            s3_uri = None
        if s3_uri:
            for host in self.hosts:
                count = storage.download(s3_uri, self.paths.checkpoint_dir(host, local_path))
                say(f"restored {count} checkpoint file(s) from {s3_uri} on {host}")

    def stage_channel(self, channel: str, uri: str) -> None:
        if storage.is_s3(uri):
            # Fetched once per job, then linked into every host: hosts share a disk here.
            source = self.paths.job_dir / "inputs" / channel
            count = storage.download(uri, source)
            say(f"channel {channel}: {count} file(s) from {uri}")
        else:
            source = storage.file_path(uri).resolve()
            if not source.exists():
                raise InputError(f"channel {channel}: {source} does not exist")
        for host in self.hosts:
            target = self.paths.channel_dir(host, channel)
            target.parent.mkdir(parents=True, exist_ok=True)
            if source.is_dir():
                if target.is_symlink():  # a restarted Slurm job links it again
                    target.unlink()
                target.symlink_to(source, target_is_directory=True)
            else:
                target.mkdir(exist_ok=True)
                (target / source.name).unlink(missing_ok=True)
                (target / source.name).symlink_to(source)

    def train(self) -> int:
        from shoal.launcher import simulate

        limit = self.request.get("StoppingCondition", {}).get("MaxRuntimeInSeconds")
        environment = {**os.environ, **(self.request.get("Environment") or {})}
        image = self.request['AlgorithmSpecification'].get('TrainingImage')
        where = "on the Slurm allocation " if self.on_slurm else ""
        say(f"running {len(self.hosts)} host(s) {where}with {sys.executable} (image {image} is "
            f"not used {'on the nodes' if self.on_slurm else 'locally'})")
        in_image = (self.network == "namespaces" and not self.on_slurm
                    and os.environ.get("SHOAL_LOCAL_IMAGE"))
        note = None if in_image else framework.framework_note(self.request)
        if note:
            say(note)
        if self.profiler is not None:
            environment = self.profiler.environment(environment)
            self.profiler.start(on_change=self.record_rules)
        streams = log_streams.StreamWriter(self.paths.job_dir)
        recorder = metrics.Recorder(self.paths.job_dir, metrics.definitions(self.request))

        def output(host: str, line: str) -> None:
            at = time.time()  # one time for the log event and its metrics
            streams.write(host, line, at)
            recorder.feed(host, log_streams.event_text(host, line), int(at * 1000))
            host_line(host, line)

        run = simulate.run_job
        if self.on_slurm:
            from shoal.slurm import hosts as slurm_hosts

            run = functools.partial(slurm_hosts.run_job, say=say)
        elif self.network == "namespaces":
            from .network import hosts as namespaced
            from .network.links import LinkSpec

            link = LinkSpec.parse(os.environ.get("SHOAL_LOCAL_LINK"))
            image = local_image(os.environ, self.request)
            say(f"hosts in network namespaces of their own (link: "
                f"{link.describe() if link else 'unshaped'}"
                f"{f'; inside {image.reference}' if image else ''})")
            run = functools.partial(namespaced.run_job, link=link, image=image, say=say)
        try:
            return run(str(self.paths.job_dir), self.hosts, timeout=limit, env=environment,
                       output=output)
        finally:
            streams.close()
            recorder.close()

    def record_rules(self, statuses: list[dict]) -> None:
        with self.record_lock:
            record = state.read(self.paths.state_file)
            record["ProfilerRuleEvaluationStatuses"] = statuses
            state.write(self.paths.state_file, record)

    def finish_profiling(self) -> None:
        """The rules' verdicts over all the data, then the data and reports to the output."""
        if self.profiler is None:
            return
        statuses = self.profiler.finish()
        if statuses:
            self.record_rules(statuses)
            for s in statuses:
                say(f"{s['RuleConfigurationName']}: {s['RuleEvaluationStatus']}")
        profiler_uri = storage.join(profiler_prefix(self.request), "profiler-output")
        storage.upload_dir(self.profiler.data, profiler_uri)
        if self.profiler.rule_output.exists():
            storage.upload_dir(self.profiler.rule_output,
                               storage.join(layout.job_output(self.request), "rule-output"))

    def save_checkpoints(self) -> None:
        s3_uri, local_path = layout.checkpoint_config(self.request)
        if s3_uri:
            for host in self.hosts:
                storage.upload_dir(self.paths.checkpoint_dir(host, local_path), s3_uri)

    def upload(self) -> dict:
        self.save_checkpoints()
        destination = layout.output_prefix(self.request)  # this job's own folder
        with tempfile.TemporaryDirectory(dir=self.paths.job_dir) as tmp:
            model = archive(Path(tmp) / "model.tar.gz", [self.paths.model_dir(h) for h in self.hosts])
            output = archive(Path(tmp) / "output.tar.gz",
                             [self.paths.output_dir(h) / "data" for h in self.hosts])
            model_uri = storage.upload_file(model, storage.join(destination, "model.tar.gz"))
            storage.upload_file(output, storage.join(destination, "output.tar.gz"))
        say(f"model artifacts: {model_uri}")
        return {"ModelArtifacts": {"S3ModelArtifacts": model_uri}}

    def failure_reason(self, exit_code: int) -> str:
        for host in self.hosts:
            failure = self.paths.output_dir(host) / "failure"
            if failure.exists() and failure.read_text().strip():
                return failure.read_text().strip()[:FAILURE_LIMIT]
        return f"AlgorithmError: the launcher exited with code {exit_code} and wrote no failure file"

    # -- the whole job ---------------------------------------------------------------------
    def run(self) -> int:
        signal.signal(signal.SIGTERM, self.on_signal)
        signal.signal(signal.SIGINT, self.on_signal)
        try:
            self.restarting()
            self.prepare()
            channels = sorted(layout.channel_sources(self.request))
            # Recorded as on SageMaker, printed only when there is data to fetch.
            self.move("Downloading", input_message(channels), quiet=not channels)
            self.download()
            if self.stopping.is_set():
                self.move("Stopped")
                return 1
            self.move("Training")
            self.training = True
            code = self.train()
            self.hosts_done = True
            if code == TIMEOUT_EXIT:
                # SageMaker ends it as it stops a job (SIGTERM first) and keeps what it saved
                self.move("MaxRuntimeExceeded", **self.upload())
                return 1
            self.move("Uploading")
            self.finish_profiling()
            artifacts = self.upload()
            if code == 0:
                self.move("Completed", **artifacts)
                return 0
            self.move("Failed", FailureReason=self.failure_reason(code), **artifacts)
            return 1
        except Requeued:
            # Slurm runs the batch script again: what the hosts saved goes to the checkpoint
            # store, from which the next run restores it; the record stays in progress
            if self.training:
                self.save_checkpoints()
            return 1
        except StopRequested:
            # as SageMaker does for a stopped job: what the script saved before the stop
            # (checkpoints, the model directory) is kept, so that a restart can resume
            artifacts = self.upload() if self.training else {}
            self.move("Stopped", self.stop_message(), **artifacts)
            return 1
        except Exception as error:  # the record must end in a terminal state whatever happened
            self.move("Failed", FailureReason=f"ClientError: {error}"[:FAILURE_LIMIT])
            return 1
        finally:
            end_descendants()

    def stop_message(self) -> str | None:
        """Who stopped the job, where it is not StopTrainingJob (the default message)."""
        if not self.on_slurm:
            return None
        from shoal.slurm.states import stop_message

        return stop_message(self.paths.job_dir)

    def on_signal(self, signum, frame) -> None:
        """Stop: unwind the current phase; ``simulate.run_job`` ends its hosts as it unwinds."""
        if self.stopping.is_set():
            return
        if self.on_slurm and self.hosts_done:
            # Slurm ends a job whose node failed, or that ran past its limit, with SIGTERM:
            # once the hosts have ended there is nothing to stop, and the outcome and its
            # upload (within Slurm's KillWait) are what the job keeps
            return
        self.stopping.set()
        if self.on_slurm:
            from shoal.slurm.restarts import requeue_pending

            restart = requeue_pending(os.environ)
            if restart is not None:
                self.move("Interrupted", f"Slurm requeued the job (restart {restart}): it "
                                         "restarts from its checkpoints")
                raise Requeued()
        self.move("Stopping")
        raise StopRequested()


def input_message(channels: list[str]) -> str:
    """The Downloading status message, naming the channels."""
    if not channels:
        return "No input data to download"
    if len(channels) == 1:
        return f"Downloading input data (channel {channels[0]})"
    return f"Downloading input data ({len(channels)} channels: {', '.join(channels)})"


class Requeued(BaseException):
    """Slurm is requeueing the job: this run ends, the job does not."""


class StopRequested(BaseException):
    """Raised in the supervisor's main thread by SIGTERM/SIGINT (BaseException: not a failure)."""


def local_image(environ, request: dict):
    """``SHOAL_LOCAL_IMAGE``: the image each namespaced host runs inside (buildah; its store
    from ``SHOAL_LOCAL_BUILDAH_ROOT`` when not buildah's default), or None."""
    reference = environ.get("SHOAL_LOCAL_IMAGE")
    if not reference:
        return None
    from shoal.containers.builder import Buildah

    from .network.hosts import Image

    store = Buildah(root=environ.get("SHOAL_LOCAL_BUILDAH_ROOT") or None)
    return Image(reference, tuple(store.global_args()),
                 dict(request.get("Environment") or {}))


def end_descendants() -> None:
    """Nothing the job started may outlive it (ranks, orted, a stray child of the script)."""
    me = psutil.Process()
    for child in me.children(recursive=False):
        process.terminate_tree(child, grace=5)


def place_code(request: dict, source: str, code_dir: Path) -> None:
    """Put the ``file://`` code into a host's ``code/``; the launcher then skips fetching.

    A directory is copied as staging would archive it (same ignores, ``.shoalignore``), so the
    script sees locally the files it will see on SageMaker; a tarball is extracted safely.
    """
    if Path(source).is_dir():
        from shoal.staging import collect_members

        program = json.loads(request["HyperParameters"]["sagemaker_program"])
        for member in collect_members(program, source):
            target = code_dir / member.arcname
            if member.is_dir:
                target.mkdir(parents=True, exist_ok=True)
            else:
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(member.path, target)
    else:
        from shoal.launcher.source import fetch_code

        fetch_code(source, str(code_dir))


def local_code(request: dict) -> str | None:
    """The local path of ``sagemaker_submit_directory`` when it is a ``file://`` URI."""
    raw = (request.get("HyperParameters") or {}).get("sagemaker_submit_directory")
    value = json.loads(raw) if raw else None
    if isinstance(value, str) and value.startswith("file://"):
        return str(storage.file_path(value))
    return None


def profiler_prefix(request: dict) -> str:
    """``<ProfilerConfig.S3OutputPath>/<job>`` (the output path's, when it names none)."""
    config = request.get("ProfilerConfig") or {}
    base = config.get("S3OutputPath") or request["OutputDataConfig"]["S3OutputPath"]
    return storage.join(base, request["TrainingJobName"])


def archive(target: Path, sources: list[Path]) -> Path:
    """A gzipped tar of the files of ``sources``; on a name clash the first source wins."""
    seen = set()
    with tarfile.open(target, "w:gz") as tar:
        for source in sources:
            if not source.is_dir():
                continue
            for root, _, files in os.walk(source):
                for name in sorted(files):
                    path = Path(root) / name
                    rel = path.relative_to(source).as_posix()
                    if rel not in seen:
                        seen.add(rel)
                        tar.add(path, arcname=rel)
    return target


# Each host's output is relayed by its own thread; print() writes a line and its newline
# separately, so two hosts printing at once could join their lines and leave an empty one.
_PRINT_LOCK = threading.Lock()


def _print_line(line: str) -> None:
    with _PRINT_LOCK:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


_SPEAKER = ["local"]  # how the supervisor's own lines are tagged: [local], or [slurm]


def say(message: str) -> None:
    _print_line(f"[{_SPEAKER[0]}] {message}")


def host_line(host: str, line: str) -> None:
    """One line of a simulated host's output, tagged with the host unless it already is."""
    from shoal.launcher.simulate import tag_line

    _print_line(tag_line(host, line))


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    return Supervisor(Path(argv[0])).run()


if __name__ == "__main__":
    sys.exit(main())
