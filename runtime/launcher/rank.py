"""``shoal-rank``: Shoal's per-rank wrapper (where SageMaker runs the closed ``smddprun``).

mpirun starts ``shoal-rank <command...>`` for every rank. The wrapper computes the rank
environment (the contract with the collective core), runs the command as its child, and
reports how it ended:

* ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE`` from Open MPI's
  ``OMPI_COMM_WORLD_*`` (or kept from a torchrun-style environment);
* ``MASTER_ADDR`` (``$SHOAL_MASTER_ADDR``, else the job's first host, else 127.0.0.1) and
  ``MASTER_PORT`` (``$SHOAL_MASTER_PORT``, else ``$MASTER_PORT``, else 7777);
* ``SHOAL_HOST``: the SageMaker host name of this rank's host (``$SHOAL_HOST`` as set for a
  simulated host, else ``current_host`` of this host's resourceconfig.json, else the
  machine's hostname);
* ``SHOAL_JOB_ID``: the same on every rank of one mpirun job and different between jobs
  (job name plus Open MPI's job id), to namespace shared memory and sockets;
* ``SHOAL_NETWORK_INTERFACE`` from resourceconfig.json's ``network_interface_name``;
  ``SHOAL_COLLECTIVE_TIMEOUT`` passes through untouched.

Ranks on worker hosts are started by an ``orted`` that sshd launched, with sshd's
environment rather than the container's: the launcher of every host writes its job
environment to ``input/shoal-host-env.json`` (mode 0600) and the wrapper starts from it,
with what mpirun passed on top. The ``SM_*`` variables forwarded by mpirun are those of the
master host; when this host's /opt/ml configuration is readable they are recomputed for
this host. When the command
fails (and the wrapper was not told to stop), one line ``SHOAL_RANK_FAILED {json}`` on
stderr names the rank, host, exit code or signal, for the launcher's failure report. The
child is killed if the wrapper dies (``PR_SET_PDEATHSIG``), so no rank is orphaned. While its
rank runs, the wrapper notes its pid under ``input/shoal-ranks/`` for its host's launcher, which
ends the host's ranks that way when another host is lost (:func:`end_host_ranks`). Each
rank starts by printing ``shoal-rank: rank R of N (local L of M) on HOST`` to stderr
(``SHOAL_RANK_QUIET=1`` turns it off).
"""

from __future__ import annotations

import ctypes
import json
import os
import re
import signal
import socket
import subprocess
import sys
import uuid
from collections.abc import Mapping, Sequence

FAILURE_MARKER = "SHOAL_RANK_FAILED"
HOST_ENV_FILE = "shoal-host-env.json"
RANKS_DIR = "shoal-ranks"  # under input/: one empty file per running wrapper, named by its pid
DEFAULT_MASTER_PORT = "7777"
_PR_SET_PDEATHSIG = 1


def _first(environ: Mapping[str, str], *names: str, default: str) -> str:
    for name in names:
        value = environ.get(name)
        if value not in (None, ""):
            return value
    return default


def job_id(environ: Mapping[str, str]) -> str:
    """Identical on all ranks of one mpirun job; unique per job run."""
    mpi_job = environ.get("OMPI_MCA_ess_base_jobid") or environ.get("PMIX_NAMESPACE")
    if mpi_job:
        name = environ.get("TRAINING_JOB_NAME") or "job"
        raw = f"{name}-{mpi_job}"
    else:
        raw = environ.get("SHOAL_JOB_ID") or environ.get("TRAINING_JOB_NAME") or uuid.uuid4().hex
        raw = raw[:64]
    return re.sub(r"[^A-Za-z0-9_.-]", "_", raw)[:64]


def rank_environment(
    environ: Mapping[str, str],
    *,
    host: str | None = None,
    master_host: str | None = None,
    network_interface: str | None = None,
) -> dict[str, str]:
    """The rank variables to add to ``environ`` (pure)."""
    env = {
        "RANK": _first(environ, "OMPI_COMM_WORLD_RANK", "RANK", default="0"),
        "WORLD_SIZE": _first(environ, "OMPI_COMM_WORLD_SIZE", "WORLD_SIZE", default="1"),
        "LOCAL_RANK": _first(environ, "OMPI_COMM_WORLD_LOCAL_RANK", "LOCAL_RANK", default="0"),
        "LOCAL_WORLD_SIZE": _first(
            environ, "OMPI_COMM_WORLD_LOCAL_SIZE", "LOCAL_WORLD_SIZE", default="1"
        ),
        "MASTER_ADDR": environ.get("SHOAL_MASTER_ADDR")
        or master_host
        or environ.get("MASTER_ADDR")
        or "127.0.0.1",
        "MASTER_PORT": _first(
            environ, "SHOAL_MASTER_PORT", "MASTER_PORT", default=DEFAULT_MASTER_PORT
        ),
        "SHOAL_HOST": environ.get("SHOAL_HOST") or host or socket.gethostname(),
        "SHOAL_JOB_ID": job_id(environ),
    }
    iface = environ.get("SHOAL_NETWORK_INTERFACE") or network_interface
    if iface:
        env["SHOAL_NETWORK_INTERFACE"] = iface
    return env


def _host_environment(environ: Mapping[str, str]) -> tuple[dict[str, str], dict[str, str]]:
    """(rank variables, this host's SM_* variables) with this host's config when readable."""
    from shoal.errors import ShoalError
    from shoal.launcher.environment import load_environment, sm_env_vars
    from shoal.launcher.paths import JobPaths

    try:
        gpus = int(environ.get("SM_NUM_GPUS", "0") or 0)
        job = load_environment(JobPaths.from_environ(environ), environ, num_gpus=gpus)
    except (ShoalError, OSError, ValueError):
        return rank_environment(environ), {}
    host = environ.get("SHOAL_HOST") or job.current_host
    if host != job.current_host and host in job.hosts:
        job = job.__class__(**{**_fields(job), "current_host": host})
    ranks = rank_environment(
        environ,
        host=host,
        master_host=job.master_hostname,
        network_interface=job.resource_config.get("network_interface_name"),
    )
    return ranks, sm_env_vars(job)


def write_host_environment(input_dir: str, env: Mapping[str, str]) -> str:
    """Save this host's job environment for ranks started through sshd (owner-only)."""
    path = os.path.join(input_dir, HOST_ENV_FILE)
    os.makedirs(input_dir, exist_ok=True)
    fd = os.open(path + ".tmp", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(dict(env), f)
    os.replace(path + ".tmp", path)
    return path


def read_host_environment(environ: Mapping[str, str]) -> dict[str, str]:
    from shoal.launcher.paths import JobPaths

    path = os.path.join(JobPaths.from_environ(environ).input_dir, HOST_ENV_FILE)
    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, ValueError):
        return {}
    return {str(k): str(v) for k, v in data.items()} if isinstance(data, dict) else {}


def _ranks_dir(environ: Mapping[str, str]) -> str:
    from shoal.launcher.paths import JobPaths

    return os.path.join(JobPaths.from_environ(environ).input_dir, RANKS_DIR)


def register(environ: Mapping[str, str]) -> str | None:
    """Note this wrapper where its host's launcher finds it (:func:`end_host_ranks`): ranks
    on a worker host are started by an ``orted`` that sshd launched, not by the launcher."""
    try:
        folder = _ranks_dir(environ)
        os.makedirs(folder, exist_ok=True)
        path = os.path.join(folder, str(os.getpid()))
        open(path, "w").close()
        return path
    except OSError:
        return None


def end_host_ranks(input_dir: str, grace: float) -> int:
    """End the ranks running on this host (SIGTERM to their wrappers, which pass it on;
    SIGKILL after ``grace`` seconds); how many there were."""
    import psutil
    from shoal.launcher.supervisor import end_processes

    folder = os.path.join(input_dir, RANKS_DIR)
    procs = []
    for name in os.listdir(folder) if os.path.isdir(folder) else ():
        try:
            proc = psutil.Process(int(name))
            if any("shoal-rank" in part or "launcher.rank" in part for part in proc.cmdline()):
                procs.append(proc)  # not a pid reused since
        except (ValueError, psutil.Error):
            continue
    end_processes(procs, grace)
    return len(procs)


def _fields(job) -> dict:
    import attrs

    return {f.name: getattr(job, f.name) for f in attrs.fields(type(job))}


def _die_with_parent() -> None:
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        pass


def failure_line(ranks: Mapping[str, str], returncode: int) -> str:
    sig = -returncode if returncode < 0 else None
    record = {
        "rank": int(ranks["RANK"]),
        "local_rank": int(ranks["LOCAL_RANK"]),
        "host": ranks["SHOAL_HOST"],
        "exit_code": 128 + sig if sig else returncode,
        "signal": signal.Signals(sig).name if sig else None,
    }
    return f"{FAILURE_MARKER} {json.dumps(record, sort_keys=True)}"


def _say(line: str) -> None:
    """One write per line: unbuffered print() writes the newline separately, and
    mpirun then tags another rank's text onto the same output line."""
    os.write(sys.stderr.fileno(), (line + "\n").encode())


def run(command: Sequence[str], environ: Mapping[str, str] = os.environ) -> int:
    environ = {**read_host_environment(environ), **environ}
    ranks, sm_vars = _host_environment(environ)
    env = {**environ, **sm_vars, **ranks}
    stopping = []
    if environ.get("SHOAL_RANK_QUIET") not in ("1", "true"):
        # One line per rank: which rank runs where (the log's map of the job).
        _say(f"shoal-rank: rank {ranks['RANK']} of {ranks['WORLD_SIZE']} (local "
             f"{ranks['LOCAL_RANK']} of {ranks['LOCAL_WORLD_SIZE']}) on {ranks['SHOAL_HOST']}")
    try:
        child = subprocess.Popen(list(command), env=env, preexec_fn=_die_with_parent)
    except OSError as e:
        _say(f"shoal-rank: cannot start {command[0]!r}: {e}")
        _say(failure_line(ranks, 127))
        return 127

    def forward(signum, frame):
        stopping.append(signum)
        if child.poll() is None:
            child.send_signal(signum)

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(sig, forward)
    registered = register(environ)
    try:
        code = child.wait()
    finally:
        if registered:
            _remove(registered)
    if code != 0 and not stopping:
        _say(failure_line(ranks, code))
    return 128 - code if code < 0 else code


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def main(argv: Sequence[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] == "--":
        args = args[1:]
    if not args:
        print("usage: shoal-rank <command> [args...]", file=sys.stderr)
        sys.exit(2)
    sys.exit(run(args))


if __name__ == "__main__":
    main()
