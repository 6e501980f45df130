"""Running a job's hosts on the nodes of its Slurm allocation (the supervisor's side).

The supervisor runs in the batch script on the allocation's first node. Its hosts ``algo-1..N``
are the allocation's nodes in Slurm's order (``SLURM_JOB_NODELIST``): it writes the job's hosts
file (each ``algo-N`` at its node's address) and the host -> node map to the job's directory
on the shared filesystem, then starts every node's part (``shoal.slurm.node``) with one
``srun``. The master's mpirun starts its daemons on the other nodes as steps of the job
(``shoal.slurm.agent``): ranks start through Slurm, never over SSH. Each output line comes
back labelled with its task, which is its host.

As on SageMaker, a host that ends lets the others finish for ``grace`` seconds (``srun
--wait``) before Slurm ends them; the supervisor's time-out and stop end the step with SIGTERM
(srun passes it to every task), then SIGKILL.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from shoal.launcher.mpi import RSH_AGENT_ENV
from shoal.local.network.hosts import cluster_environment
from shoal.local.network.namespaces import hosts_text

from . import agent, commands

TIMED_OUT = 124  # as simulate.run_job: MaxRuntimeInSeconds ran out
_LABEL = re.compile(r"^\s*(\d+): ?(.*)$")


def hosts_file(hosts: Sequence[str], addresses: Sequence[str]) -> str:
    return hosts_text(zip(addresses, hosts))


def allocation(environ: Mapping[str, str], hosts: Sequence[str]) -> list[tuple[str, str, str]]:
    """(host, node, address) for each host, in order."""
    nodes = commands.hostnames(environ["SLURM_JOB_NODELIST"])
    if len(nodes) != len(hosts):
        raise commands.SlurmError(f"the allocation has {len(nodes)} node(s) ({', '.join(nodes)}) "
                                  f"for {len(hosts)} host(s)")
    return [(h, n, socket.gethostbyname(n)) for h, n in zip(hosts, nodes)]


def srun_argv(count: int, root: Path, python: str, grace: float) -> list[str]:
    return ["srun", f"--nodes={count}", f"--ntasks={count}", "--ntasks-per-node=1",
            "--kill-on-bad-exit=0", f"--wait={max(1, int(grace))}", "--label",
            "--job-name=shoal-hosts", python, "-u", "-m", "shoal.slurm.node", str(root)]


def _relay(pipe, hosts: Sequence[str], output) -> threading.Thread:
    def run():
        with pipe:
            for raw in iter(pipe.readline, b""):
                line = raw.decode("utf-8", "replace").rstrip("\n")
                match = _LABEL.match(line)
                if match and int(match.group(1)) < len(hosts):
                    output(hosts[int(match.group(1))], match.group(2))
                else:  # srun's own messages
                    output(hosts[0], line)

    thread = threading.Thread(target=run, daemon=True, name="shoal-srun-relay")
    thread.start()
    return thread


def run_job(job_root: str, hosts: Sequence[str], *, timeout: float | None = None,
            env: Mapping[str, str] | None = None, output=None, python: str = sys.executable,
            grace: float = 15.0, say=None) -> int:
    """Every host's launcher on its node; the job's exit code (124: the time-out ran out)."""
    environ = dict(os.environ if env is None else env)
    root = Path(job_root).resolve()
    placed = allocation(environ, hosts)
    (root / "hosts").write_text(hosts_file(hosts, [a for _, _, a in placed]))
    agent.write_nodes(root, {h: n for h, n, _ in placed})
    if say:
        say("hosts on the Slurm allocation: " + ", ".join(f"{h} {n} {a}" for h, n, a in placed))
    pipes = {"stdout": subprocess.PIPE, "stderr": subprocess.STDOUT} if output else {}
    proc = subprocess.Popen(srun_argv(len(hosts), root, python, grace),
                            env=slurm_environment(environ, root, python), **pipes)
    relay = _relay(proc.stdout, list(hosts), output) if output else None
    try:
        return _wait(proc, root, hosts, timeout, failure_grace(environ))
    finally:
        _end(proc, min(grace, 5.0))
        if relay is not None:
            relay.join(timeout=5)


def slurm_environment(environ: Mapping[str, str], root: Path, python: str) -> dict[str, str]:
    """The hosts' environment: mpirun reaches the other nodes through the Slurm agent."""
    env = cluster_environment(environ)
    env[RSH_AGENT_ENV] = agent.command(python)
    env[agent.JOB_ROOT_ENV] = str(root)
    return env


def failure_grace(environ: Mapping[str, str]) -> float:
    return float(environ.get("SHOAL_FAILURE_GRACE") or 5)


def _failed(root: Path, hosts: Sequence[str]) -> bool:
    """A host's launcher wrote its failure file: the job's outcome is known."""
    for host in hosts:
        path = root / host / "output" / "failure"
        try:
            if path.stat().st_size > 0:
                return True
        except OSError:
            continue
    return False


def _wait(proc, root: Path, hosts: Sequence[str], timeout: float | None, grace: float) -> int:
    """srun's code; 124 at the time-out. Once a host has failed, the others get ``grace``
    seconds: srun itself waits for a dead node's task until Slurm declares the node down
    (half a minute and more), and the job's failure is known already."""
    deadline = None if timeout is None else time.monotonic() + timeout
    failed_at = None
    while proc.poll() is None:
        now = time.monotonic()
        if deadline is not None and now > deadline:
            return TIMED_OUT
        if failed_at is None and _failed(root, hosts):
            failed_at = now
        if failed_at is not None and now - failed_at > grace:
            return 1
        time.sleep(0.1)
    return proc.returncode


def _end(proc: subprocess.Popen, grace: float) -> None:
    """SIGTERM to srun (it signals every task), SIGKILL after ``grace``."""
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
