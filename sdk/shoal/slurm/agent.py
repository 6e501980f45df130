"""How mpirun reaches the other nodes of a Slurm job: as job steps, never over SSH.

The master's launcher runs mpirun with ``-mca plm_rsh_agent "<python> -m shoal.slurm.agent"``
(``SHOAL_RSH_AGENT``, set by ``shoal.slurm.hosts``). Open MPI calls the agent as it would call
ssh, ``agent <host> <orted command...>``; the agent runs

    srun --jobid=<job> --overlap --nodes=1 --ntasks=1 --nodelist=<host's node> ...
         <python> -m shoal.slurm.agent --enter <host> <orted command...>

a step of the job's own allocation (``--overlap``: the hosts' step holds every CPU), which
Slurm tracks, accounts and ends with the job. On the node, ``--enter`` joins that host's mount,
UTS and PID namespaces (those ``shoal.slurm.node`` made: its ``/opt/ml``, its hostname
``algo-N``, its processes; and their user namespace in a user's job) with ``nsenter`` and runs
the daemon there in the host's own environment, as a login over SSH would. The daemon then
dies with the host's launcher.

The node's part records where its namespaces are: ``<job-dir>/nodes/<host>.pid`` holds the
pid (on that node) of the process that made them (``unshare``), whose one child is the
namespaces' first process. The job directory comes in ``SHOAL_SLURM_JOB_ROOT``, the job id in
``SHOAL_SLURM_JOB_ID``, the host -> node map in ``<job-dir>/nodes/nodes.json``.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import psutil

from shoal.launcher.simulate import remote_command
from shoal.local.network.hosts import as_user

JOB_ROOT_ENV = "SHOAL_SLURM_JOB_ROOT"
JOB_ID_ENV = "SHOAL_SLURM_JOB_ID"
STEP_ENV = "SHOAL_SLURM_STEP"  # the daemon's step, ``<job>.<step>``, seen by its ranks
NODES_DIR = "nodes"
NODES_FILE = "nodes.json"
FIND_TIMEOUT = 30.0  # the host's namespaces exist before its launcher reports ready


class AgentError(RuntimeError):
    pass


def command(python: str = sys.executable) -> str:
    """The ``plm_rsh_agent`` value (Open MPI splits it on spaces)."""
    return f"{python} -m shoal.slurm.agent"


def write_nodes(root: Path, placed: Mapping[str, str]) -> None:
    """The host -> node map the agent reads, in the job directory every node sees."""
    folder = root / NODES_DIR
    folder.mkdir(exist_ok=True)
    (folder / NODES_FILE).write_text(json.dumps(dict(placed)))


def write_pid(root: Path, host: str, pid: int) -> None:
    folder = root / NODES_DIR
    folder.mkdir(exist_ok=True)
    (folder / f"{host}.pid").write_text(str(pid))


def srun_argv(job_id: str, node: str, host: str, words: Sequence[str], python: str) -> list[str]:
    """The step that runs one daemon on ``node`` (pure)."""
    return ["srun", f"--jobid={job_id}", "--overlap", "--nodes=1", "--ntasks=1",
            f"--nodelist={node}", "--kill-on-bad-exit=1", "--input=none", "--chdir=/",
            "--quiet", "--job-name=shoal-orted", python, "-u", "-m", "shoal.slurm.agent",
            "--enter", host, *words]


def launch(argv: Sequence[str], environ: Mapping[str, str], python: str = sys.executable) -> list[str]:
    """The srun command line for the agent's arguments ``<host> <command...>``."""
    if len(argv) < 2:
        raise AgentError("usage: python -m shoal.slurm.agent <host> <command...>")
    host, words = argv[0], list(argv[1:])
    root, job_id = environ.get(JOB_ROOT_ENV), environ.get(JOB_ID_ENV)
    if not root or not job_id:
        raise AgentError(f"{JOB_ROOT_ENV} and {JOB_ID_ENV} are not set: not a Slurm job's host")
    nodes = json.loads((Path(root) / NODES_DIR / NODES_FILE).read_text())
    if host not in nodes:
        raise AgentError(f"{host} is not a host of this job ({', '.join(sorted(nodes))})")
    return srun_argv(job_id, nodes[host], host, words, python)


def namespace_process(root: Path, host: str, timeout: float = FIND_TIMEOUT) -> int:
    """The pid of the first process in ``host``'s namespaces on this node."""
    deadline = time.monotonic() + timeout
    path = root / NODES_DIR / f"{host}.pid"
    while True:
        try:
            maker = psutil.Process(int(path.read_text()))
            children = maker.children()
            if os.path.basename(maker.cmdline()[0]) == "unshare" and children:
                return children[0].pid
        except (OSError, ValueError, IndexError, psutil.Error):
            pass
        if time.monotonic() > deadline:
            raise AgentError(f"{host}'s namespaces are not running on this node ({path})")
        time.sleep(0.1)


def host_environ(pid: int) -> dict[str, str]:
    """The environment the host's launcher started with: what a login there would see."""
    return dict(psutil.Process(pid).environ())


def enter_argv(pid: int, words: Sequence[str], *, run_as: tuple[int, int] | None = None
               ) -> list[str]:  # fmt: skip
    """nsenter forks into the PID namespace, so the daemon is one of the host's processes. A
    user's job made its namespaces in a user namespace (``run_as``: the user's uid, gid): the
    daemon joins it, then is the user again, as the host's launcher is."""
    joins = ["--user", "--preserve-credentials"] if run_as else []
    user = as_user(run_as).split() if run_as else []
    return ["nsenter", f"--target={pid}", *joins, "--mount", "--uts", "--pid", "--", *user,
            "/bin/sh", "-c", " ".join(remote_command(words, None))]


def own_user_namespace(pid: int) -> bool:
    """Whether ``pid`` is in a user namespace other than this process's."""
    return os.stat(f"/proc/{pid}/ns/user").st_ino != os.stat("/proc/self/ns/user").st_ino


def enter(argv: Sequence[str], environ: Mapping[str, str]) -> tuple[list[str], dict[str, str]]:
    host, words = argv[0], argv[1:]
    root = environ.get(JOB_ROOT_ENV)
    if not root:
        raise AgentError(f"{JOB_ROOT_ENV} is not set: not a Slurm job's step")
    pid = namespace_process(Path(root), host)
    env = host_environ(pid)
    env[STEP_ENV] = f"{environ.get('SLURM_JOB_ID', '')}.{environ.get('SLURM_STEP_ID', '')}"
    run_as = (os.getuid(), os.getgid()) if own_user_namespace(pid) else None
    return enter_argv(pid, words, run_as=run_as), env


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        if args[:1] == ["--enter"]:
            if len(args) < 3:
                raise AgentError("usage: python -m shoal.slurm.agent --enter <host> <command...>")
            command_argv, env = enter(args[1:], os.environ)
        else:
            command_argv, env = launch(args, os.environ), dict(os.environ)
    except (AgentError, OSError, ValueError) as e:
        print(f"shoal.slurm.agent: {e}", file=sys.stderr)
        return 1
    os.execvpe(command_argv[0], command_argv, env)
    return 1  # not reached


if __name__ == "__main__":
    sys.exit(main())
