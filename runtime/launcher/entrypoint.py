"""``train``: the container entry point of a Shoal (or SageMaker) training job.

Reads the job's /opt/ml configuration, fetches and installs the code, exports the ``SM_*``
environment, picks the runner (see :mod:`shoal.launcher.runners`) and runs it:

* process / torchrun / parameter server: every host runs its own processes;
* MPI and data-parallel: the master host runs mpirun (with ``shoal-rank`` per rank) once
  every worker is ready; workers wait for the outcome (:mod:`shoal.launcher.cluster`).
  Meanwhile the hosts' launchers watch each other (:mod:`shoal.launcher.heartbeat`): a host
  that stops answering fails the job on every other host, which ends its ranks.

Every host ends with ``output/success`` or ``output/failure`` and a matching exit code.
SIGTERM is forwarded to every rank, with SIGKILL after ``SHOAL_STOP_GRACE`` seconds.
Each of the launcher's log lines starts with its host (``[algo-2] ...``). Under
``SAGEMAKER_BASE_DIR``, hyperparameters naming paths under /opt/ml are moved under it
(:func:`shoal.launcher.paths.rebase`) and the moved keys are logged.

Knobs (environment): ``SM_LOG_LEVEL`` (a number or a name: ``debug`` also lists the names of
the variables exported to the job's processes), ``SHOAL_STOP_GRACE`` (10 s),
``SHOAL_FAILURE_GRACE`` (15 s: how long mpirun may take to end the job once a rank failed
or a host was lost before it is stopped), ``SHOAL_WORKER_TIMEOUT`` (3600 s),
``SHOAL_HOST_TIMEOUT`` (15 s), ``SHOAL_HEARTBEAT_INTERVAL`` (1 s) and ``SHOAL_HEARTBEAT_PORT``
(7595) of the hosts' heartbeat (:mod:`shoal.launcher.heartbeat`),
``SHOAL_STATUS_PORT`` (7594), ``SHOAL_STATUS_LINGER`` (60 s), ``SHOAL_MASTER_PORT``
(7777), ``SHOAL_MASTER_ADDR``, ``SHOAL_GETHOSTNAME_PRELOAD`` (a prebuilt shim, see
:mod:`shoal.launcher.hostname`), ``SHOAL_S3_EXPECTED_BUCKET_OWNER``.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Mapping

import attrs
from shoal.errors import LaunchError, ShoalError
from shoal.launcher import cluster, failure, heartbeat, hostname, mpi, runners, source
from shoal.launcher.environment import (
    TrainingEnvironment,
    load_environment,
    process_env_vars,
    sm_env_vars,
)
from shoal.launcher.paths import JobPaths
from shoal.launcher.profiling import profiler_env
from shoal.launcher.rank import end_host_ranks, job_id, write_host_environment
from shoal.launcher.runners import Runner
from shoal.launcher.simulate import LOOPBACK, SESSION_TMP_ENV, SIMULATED_ROOT_ENV, agent_command
from shoal.launcher.supervisor import (
    Outcome,
    Supervisor,
    become_subreaper,
    exit_status,
    install_stop_handlers,
)

log = logging.getLogger("shoal.launcher")


def _float_env(environ: Mapping[str, str], name: str, default: float) -> float:
    try:
        return float(environ.get(name, default))
    except ValueError:
        return default


def _tool(name: str) -> str:
    """A console script next to this interpreter when there is one (venvs), else by name."""
    local = os.path.join(os.path.dirname(sys.executable), name)
    return local if os.path.exists(local) else name


class Launch:
    """One host's part of a job: the parsed configuration and the pieces built from it."""

    def __init__(self, job: TrainingEnvironment, environ: Mapping[str, str]) -> None:
        self.job, self.environ = job, dict(environ)
        self.simulated = bool(environ.get(SIMULATED_ROOT_ENV))
        # mpirun's way to the other hosts: ssh to their sshd (SageMaker's), the simulation's
        # agent, or a platform's own (a Slurm job starts its daemons as job steps)
        self.rsh_agent = environ.get(mpi.RSH_AGENT_ENV) or (
            agent_command() if self.simulated else None)
        self.over_ssh = self.rsh_agent is None
        table = environ.get(runners.TF_ADDRESSES_ENV) if self.simulated else None
        self.tf_addresses = json.loads(table) if table else None
        self.dist = runners.Distribution.from_params(job.additional_framework_parameters)
        # Sorted: the master (mpirun's host) is the first, and ranks fill hosts in this order.
        self.hosts = sorted(job.distribution_hosts or job.hosts)
        in_dist = job.current_instance_group in job.distribution_instance_groups
        self.runner = runners.choose_runner(self.dist, len(self.hosts), in_dist)
        self.ppn = self.dist.ranks_per_host(job.num_gpus)
        self.interface = LOOPBACK if self.simulated else job.network_interface_name
        self.master_addr = environ.get("SHOAL_MASTER_ADDR") or job.master_hostname
        self.grace = _float_env(environ, "SHOAL_STOP_GRACE", 10.0)
        self.failure_grace = _float_env(environ, "SHOAL_FAILURE_GRACE", 15.0)
        self.coordinated = self.runner in (Runner.MPI, Runner.DATAPARALLEL)
        self.heartbeat = heartbeat.Settings.from_environ(environ)
        self._env: dict[str, str] | None = None
        self.preload: str | None = None

    def sm_vars(self) -> dict[str, str]:
        return sm_env_vars(self.job)

    def env(self) -> dict[str, str]:
        """The environment of the job's processes on this host (a fresh copy)."""
        if self._env is None:
            self._env = self._build_env()
        return dict(self._env)

    def _build_env(self) -> dict[str, str]:
        env = {**self.environ, **process_env_vars(self.job, self.environ), **self.sm_vars()}
        env.setdefault("SHOAL_HOST", self.job.current_host)
        env.setdefault("LD_LIBRARY_PATH", "")  # mpirun -x warns about unset variables
        env["SHOAL_JOB_ID"] = job_id(env)
        env.update(profiler_env(self.job.paths, env))  # framework events, when configured
        env["SHOAL_NETWORK_INTERFACE"] = self.interface
        env["MASTER_ADDR"] = self.master_addr
        env["MASTER_PORT"] = self.environ.get("SHOAL_MASTER_PORT", runners.TORCH_MASTER_PORT)
        if self.dist.multi_worker_mirrored:
            config = runners.multi_worker_mirrored_tf_config(
                self.hosts, self.job.current_host, self.tf_addresses)
            env["TF_CONFIG"] = json.dumps(config)
        added = sorted(set(env) - set(self.environ))
        # The names only, and only when asked: values can hold secrets.
        log.info("exporting %d variables to the job's processes (SM_LOG_LEVEL=debug names "
                 "them)", len(added))
        log.debug("exported variables: %s", ", ".join(added))
        return env

    def mpirun_env(self) -> dict[str, str]:
        env = self.env()
        session_tmp = self.environ.get(SESSION_TMP_ENV)
        if self.simulated and session_tmp:
            # mpirun's session directory apart from every simulated host's orted.
            env["OMPI_MCA_orte_tmpdir_base"] = os.path.join(session_tmp, "mpirun")
            os.makedirs(env["OMPI_MCA_orte_tmpdir_base"], exist_ok=True)
        return env

    def user_command(self, python: list[str]) -> list[str]:
        entry = self.job.user_entry_point
        if not entry:
            raise LaunchError("no entry point: sagemaker_program is not set")
        kind = runners.entry_point_kind(self.job.paths.code_dir, entry)
        return runners.user_command(kind, entry, self.job.to_cmd_args(), python)

    def mpirun_argv(self) -> list[str]:
        dp = self.runner is Runner.DATAPARALLEL
        plan = mpi.MpiPlan(
            hosts=self.hosts,
            processes_per_host=self.ppn,
            network_interface=self.interface,
            instance_type=self.dist.instance_type or self.job.current_instance_type,
            custom_mpi_options=(
                self.dist.dataparallel_custom_options if dp else self.dist.mpi_custom_options
            ),
            num_processes=None if dp else self.dist.num_processes,
            preload=self.environ.get("SHOAL_GETHOSTNAME_PRELOAD") or self.preload,
            env_names=tuple(self.sm_vars()),
            rsh_agent=self.rsh_agent,
            rank_wrapper=_tool(mpi.RANK_WRAPPER),
        )
        command = self.user_command([sys.executable, "-m", "mpi4py"])
        build = mpi.dataparallel_argv if dp else mpi.mpi_argv
        return build(plan, command)

    def supervise(self, argv: list[str], env: Mapping[str, str], keep=(), watch=None,
                  host_lost: Callable[[], str | None] | None = None) -> Outcome:
        sup = Supervisor(argv, env, self.job.paths.code_dir, hosts=self.hosts,
                         ranks_per_host=self.ppn, grace=self.grace,
                         failure_timeout=self.failure_grace, keep=keep,
                         watch=watch, host_lost=host_lost)  # fmt: skip
        install_stop_handlers(sup)
        return sup.run()

    def watch_hosts(self) -> heartbeat.Heartbeat | None:
        """This host's heartbeat agent (see :mod:`shoal.launcher.heartbeat`), started. A lost
        host's verdict goes to the failure file at once: this host may be ended soon after
        (a cut-off peer's launcher exits, and the platform stops the job)."""
        def lost(host: str, text: str) -> None:
            failure.write_failure(self.job.paths, text)

        return heartbeat.start(self.job.current_host, self.hosts, self.heartbeat, self.environ,
                               ranks_per_host=self.ppn, on_lost=lost)


def _finish(paths: JobPaths, outcome: Outcome) -> tuple[int, str]:
    if outcome.ok:
        failure.write_success(paths)
        return 0, ""
    text = failure.failure_message(outcome, last_error=outcome.watched_exit)
    failure.write_failure(paths, text)
    log.error("training failed: %s", text.splitlines()[0])
    return exit_status(outcome), text


def _status_port(launch: Launch) -> int:
    return int(launch.environ.get("SHOAL_STATUS_PORT", cluster.STATUS_PORT))


def _workers(launch: Launch) -> list[str]:
    return [h for h in launch.hosts if h != launch.job.current_host]


def run_master(launch: Launch) -> int:
    workers = _workers(launch)
    timeout = _float_env(launch.environ, "SHOAL_WORKER_TIMEOUT", 3600.0)
    linger = _float_env(launch.environ, "SHOAL_STATUS_LINGER", 60.0)
    status = cluster.StatusServer(_status_port(launch)) if workers else None
    sshd = None
    try:
        if workers:
            if launch.over_ssh:
                sshd = cluster.start_sshd()
            status.wait_for_workers(workers, timeout)
            if launch.over_ssh:
                cluster.wait_for_ports(workers, 22, timeout)
    except ShoalError as e:
        code = _startup_failed(launch.job.paths, e)
        status.publish(cluster.JobStatus(code, failure.startup_failure_message(e)))
        status.close(workers, linger=linger)
        return code
    beat = launch.watch_hosts() if workers else None
    try:
        keep = [sshd.pid] if sshd else []
        outcome = launch.supervise(launch.mpirun_argv(), launch.mpirun_env(), keep,
                                   host_lost=lambda: beat.lost if beat else None)
        if beat and not outcome.ok and not outcome.host_lost and beat.settle():
            outcome = attrs.evolve(outcome, host_lost=beat.lost)
        if beat:  # the outcome is known: a worker that leaves now is no failure
            beat.on_lost = None
        code, text = _finish(launch.job.paths, outcome)
    except BaseException as e:
        if status:
            status.publish(cluster.JobStatus(1, f"the master failed: {e}"))
            status.close(workers, linger=5.0)
        if beat:
            beat.stop()
        raise
    if status:
        status.publish(cluster.JobStatus(code, text))
        status.close(workers, linger=linger)
    if beat:  # once the workers have the outcome: they stop watching this host first
        beat.stop()
    return code


def report_startup_failure(launch: Launch, text: str) -> None:
    """Tell the other hosts of an MPI job that this host could not start."""
    timeout = _float_env(launch.environ, "SHOAL_WORKER_TIMEOUT", 3600.0)
    if launch.job.current_host == launch.hosts[0]:
        status = cluster.StatusServer(_status_port(launch))
        status.publish(cluster.JobStatus(1, text))
        status.close(_workers(launch), linger=_float_env(launch.environ,
                                                         "SHOAL_STATUS_LINGER", 60.0))
    else:
        cluster.wait_for_outcome(launch.master_addr, _status_port(launch), timeout,
                                 me=launch.job.current_host, failed=text)


def _outcome_unless_lost(launch: Launch, beat: heartbeat.Heartbeat | None,
                         timeout: float) -> cluster.JobStatus | None:
    """The master's outcome, or None once another host is lost (its verdict is then in the
    failure file)."""
    settled, result = threading.Event(), []

    def wait() -> None:
        result.append(cluster.wait_for_outcome(launch.master_addr, _status_port(launch),
                                               timeout, me=launch.job.current_host))
        if beat:  # the outcome is known: a master that leaves now is no failure
            beat.on_lost = None
        settled.set()

    threading.Thread(target=wait, name="shoal-outcome", daemon=True).start()
    while not settled.wait(0.2):
        if beat and beat.lost:
            return None
    return result[0]  # (a verdict after it is not this job's failure)


def run_worker(launch: Launch) -> int:
    if launch.over_ssh:
        cluster.start_sshd()
    timeout = _float_env(launch.environ, "SHOAL_WORKER_TIMEOUT", 3600.0)
    paths = launch.job.paths
    beat = launch.watch_hosts()  # before reporting ready: the master expects it then
    log.info("waiting for the master %s to run the job", launch.master_addr)
    try:
        status = _outcome_unless_lost(launch, beat, timeout)
    finally:
        if beat:
            beat.stop()
    if status is None:
        ended = end_host_ranks(paths.input_dir, launch.grace)
        log.error("another host is lost: ended %d rank(s) of this host", ended)
        return 1
    if status.exit_code == 0:
        failure.write_success(paths)
    else:
        failure.write_failure(paths, status.message or "the job failed on the master host")
    return status.exit_code


def run_torchrun(launch: Launch) -> int:
    env = launch.env()
    itype = launch.dist.instance_type or launch.job.current_instance_type
    if itype in mpi.EFA_NCCL_INSTANCES:
        env["FI_PROVIDER"] = "efa"
    if itype in mpi.EFA_RDMA_INSTANCES:
        env["FI_EFA_USE_DEVICE_RDMA"] = "1"
    env["NCCL_SOCKET_IFNAME"] = launch.interface
    argv = runners.torchrun_argv(
        launch.hosts, launch.job.current_host, launch.ppn, launch.job.user_entry_point,
        launch.job.to_cmd_args(), master_addr=launch.master_addr,
        master_port=env["MASTER_PORT"], torchrun=_tool("torchrun"),
    )  # fmt: skip
    return _finish(launch.job.paths, launch.supervise(argv, env))[0]


_PS_SERVER = (
    "import json, os, tensorflow as tf\n"
    "c = json.loads(os.environ['TF_CONFIG'])\n"
    "tf.distribute.Server(tf.train.ClusterSpec(c['cluster']), job_name='ps',"
    " task_index=c['task']['index'], config=tf.compat.v1.ConfigProto(device_count={'GPU': 0})"
    ").join()\n"
)


def run_parameter_server(launch: Launch) -> int:
    env = launch.env()
    host = launch.job.current_host
    table = launch.tf_addresses
    ps_env = {**env, "TF_CONFIG": json.dumps(runners.parameter_server_tf_config(
        launch.hosts, host, ps_task=True, table=table)), "CUDA_VISIBLE_DEVICES": "-1"}  # fmt: skip
    ps = subprocess.Popen([sys.executable, "-c", _PS_SERVER], env=ps_env)
    env["TF_CONFIG"] = json.dumps(runners.parameter_server_tf_config(launch.hosts, host,
                                                                     table=table))
    try:
        # Workers wait for their parameter servers forever: a dead one must end the job.
        outcome = launch.supervise(launch.user_command([sys.executable]), env, keep=[ps.pid],
                                   watch={"parameter server": ps})
    finally:
        ps.terminate()
        try:
            ps.wait(timeout=launch.grace)
        except subprocess.TimeoutExpired:
            ps.kill()
    return _finish(launch.job.paths, outcome)[0]


def run_process(launch: Launch) -> int:
    argv = launch.user_command([sys.executable])
    return _finish(launch.job.paths, launch.supervise(argv, launch.env()))[0]


def _startup_failed(paths: JobPaths, error: BaseException) -> int:
    if isinstance(error, ShoalError):
        log.error("%s", error)
    else:
        log.exception("launcher error")
    failure.write_failure(paths, failure.startup_failure_message(error))
    return error.exit_code if isinstance(error, ShoalError) else 1


def _dispatch(launch: Launch) -> int:
    job = launch.job
    log.info("host %s of %s; runner %s; %d process(es) per host", job.current_host,
             launch.hosts, launch.runner.value, launch.ppn)  # fmt: skip
    if launch.coordinated:
        # Every host builds the shim before reporting ready: ranks preload it by path.
        launch.preload = hostname.ensure_shim(launch.environ)
        write_host_environment(job.paths.input_dir, launch.env())
        return run_master(launch) if job.current_host == launch.hosts[0] else run_worker(launch)
    if launch.runner is Runner.TORCH_DISTRIBUTED:
        return run_torchrun(launch)
    if launch.runner is Runner.PARAMETER_SERVER:
        return run_parameter_server(launch)
    return run_process(launch)


def train(paths: JobPaths, environ: Mapping[str, str] = os.environ) -> int:
    """Run this host's part of the job; the exit code."""
    try:
        job = load_environment(paths, environ)
        HOST_TAG.host = job.current_host
        if job.rebased_keys:
            log.info("hyperparameters with /opt/ml paths mapped under %s: %s",
                     paths.base_dir, ", ".join(job.rebased_keys))  # fmt: skip
        paths.ensure_output_dirs()
        launch = Launch(job, environ)
    except Exception as e:  # the failure file must say why, whatever broke
        return _startup_failed(paths, e)
    try:
        source.fetch_code(job.module_dir, paths.code_dir, environ=environ)
        source.install_dependencies(paths.code_dir)
    except Exception as e:
        code = _startup_failed(paths, e)
        if launch.coordinated and len(launch.hosts) > 1:
            report_startup_failure(launch, failure.startup_failure_message(e))
        return code
    try:
        return _dispatch(launch)
    except Exception as e:
        return _startup_failed(paths, e)


class HostTag(logging.Filter):
    """Gives every log record the host it was printed on (``%(host)s``).

    Multi-host logs are read interleaved (local mode, CloudWatch exports), so each of the
    launcher's lines says ``[algo-2] ...``. The host is known from ``SHOAL_HOST`` on simulated
    hosts, else once the resource configuration is read (:func:`train` sets it).
    """

    def __init__(self, host: str = "") -> None:
        super().__init__()
        self.host = host

    def filter(self, record: logging.LogRecord) -> bool:
        record.host = self.host or "?"
        return True


HOST_TAG = HostTag()
LOG_FORMAT = "[%(host)s] %(asctime)s %(name)s %(levelname)s: %(message)s"


def log_level(environ: Mapping[str, str]) -> int:
    """``SM_LOG_LEVEL`` (or ``SAGEMAKER_CONTAINER_LOG_LEVEL``): a number as SageMaker sets it
    (``10``), or a level's name (``debug``); INFO otherwise."""
    text = environ.get("SM_LOG_LEVEL") or environ.get("SAGEMAKER_CONTAINER_LOG_LEVEL") or ""
    text = text.strip()
    if text.isdigit():
        return int(text)
    level = logging.getLevelName(text.upper())
    return level if isinstance(level, int) else logging.INFO


def _configure_logging(environ: Mapping[str, str]) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(LOG_FORMAT))
    handler.addFilter(HOST_TAG)
    HOST_TAG.host = environ.get("SHOAL_HOST", "")
    logging.basicConfig(level=log_level(environ), handlers=[handler])


def _stopped_before_start(signum, frame):
    # Until a job process runs (its supervisor takes SIGTERM over), stopping is a failure
    # that every host reports.
    raise LaunchError(f"the launcher received {signal.Signals(signum).name} before the job ran")


def main(argv: list[str] | None = None) -> None:
    _configure_logging(os.environ)
    become_subreaper()
    signal.signal(signal.SIGTERM, _stopped_before_start)
    if not shutil.which("mpirun"):
        log.debug("mpirun not on PATH; only non-MPI runners can work")
    sys.exit(train(JobPaths.from_environ(os.environ), os.environ))


if __name__ == "__main__":
    main()
