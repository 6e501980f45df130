"""Two or more simulated hosts on one machine, for tests and local mode.

``run_job(job_root, hosts)`` expects ``job_root/<host>/`` to be an /opt/ml-shaped tree per
host, already written by the caller (``input/config/*.json`` with ``current_host`` set to
that host, ``code/`` or ``sagemaker_submit_directory``). It starts one ``train`` process per
host with that host's environment and returns the job's exit code (the master's, or the
first non-zero one).

How the hosts stay apart on one machine:

* each ``train`` gets ``SAGEMAKER_BASE_DIR=job_root/<host>`` and ``SHOAL_HOST=<host>``;
* ``SHOAL_SIMULATED_ROOT=job_root`` tells the launcher to skip sshd, to use the loopback
  interface, and to give mpirun ``-mca plm_rsh_agent "<python> -m shoal.launcher.simulate"``:
  Open MPI then "ssh"es to ``algo-2`` through this module's :func:`agent_main`, which runs
  the remote command (Open MPI's ``orted``) locally with algo-2's ``SAGEMAKER_BASE_DIR`` and
  ``SHOAL_HOST``. Every simulated host gets its own ``orted``, so Open MPI and the
  collective core (which groups ranks by ``SHOAL_HOST``) treat them as different hosts;
* each host gets its own Open MPI session directory (``orte_tmpdir_base``) under a
  short per-job temporary directory, also where mpirun passes its own on the orted
  command line (see :func:`remote_command`);
* the master, status and heartbeat ports are allocated per job (``SHOAL_MASTER_PORT``,
  ``SHOAL_STATUS_PORT``, ``SHOAL_HEARTBEAT_ADDRESSES``) and ``SHOAL_MASTER_ADDR=127.0.0.1``, so concurrent jobs never
  collide; so is a loopback address for every TensorFlow task and parameter server
  (``SHOAL_TF_ADDRESSES``), which TF_CONFIG then names instead of ``algo-N:2222``.

The hosts' output goes to this process's stdout and stderr, or, with
``output=callback``, line by line to ``callback(host, line)``; :func:`tag_line` prefixes a
line with its host (``[algo-2] ...``) unless it already names one, as the launcher's own
log lines and the supervisor's rank tags do.

Example::

    from shoal.launcher.simulate import run_job, tag_line
    code = run_job("/tmp/job", ["algo-1", "algo-2"], timeout=600,
                   output=lambda host, line: print(tag_line(host, line)))
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence

import psutil
from shoal.launcher.heartbeat import ADDRESSES_ENV
from shoal.launcher.ports import free_port
from shoal.launcher.runners import TF_ADDRESSES_ENV, simulated_tf_addresses

SIMULATED_ROOT_ENV = "SHOAL_SIMULATED_ROOT"
SESSION_TMP_ENV = "SHOAL_SIMULATED_TMP"
LOOPBACK = "lo"
# The supervisor's rank tags ``[1,mpirank:3,algo-2]<stdout>:`` already name the rank's host.
_RANK_TAG = re.compile(r"^\[\d+,mpirank:\d+,[^\]]*\]")

Output = Callable[[str, str], None]


def tag_line(host: str, line: str) -> str:
    """``line`` as printed by ``host``, prefixed ``[host] `` unless it already names one (pure)."""
    if line.startswith(f"[{host}] ") or _RANK_TAG.match(line):
        return line
    return f"[{host}] {line}"


def agent_command(python: str = sys.executable) -> str:
    """The ``plm_rsh_agent`` value that runs remote commands on simulated hosts."""
    return f"{python} -m shoal.launcher.simulate"


def host_environment(job_root: str, host: str, base: Mapping[str, str]) -> dict[str, str]:
    """The environment of one simulated host's processes (pure)."""
    env = {
        **base,
        "SAGEMAKER_BASE_DIR": os.path.join(os.path.abspath(job_root), host),
        "SHOAL_HOST": host,
        SIMULATED_ROOT_ENV: os.path.abspath(job_root),
        "SHOAL_MASTER_ADDR": "127.0.0.1",
        # Open MPI maps its shared topology at a "hole" it picks in the address space; with
        # several daemons starting at once on one machine the pick can land on a growing
        # stack and the daemon segfaults (hwloc_shmem_topology_write). Each process then
        # reads the topology itself instead.
        "OMPI_MCA_rtc_hwloc_vmhole": "none",
    }
    if base.get(SESSION_TMP_ENV):
        # Each simulated host keeps its Open MPI session directory apart: hosts and
        # concurrent jobs on one machine would otherwise share /tmp/ompi.<hostname>.<uid>.
        env["OMPI_MCA_orte_tmpdir_base"] = os.path.join(base[SESSION_TMP_ENV], host)
    return env


def _end(procs: Sequence[subprocess.Popen], grace: float) -> None:
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + grace
    for p in procs:
        try:
            p.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            for child in _tree(p.pid):
                child.kill()
            p.wait()


def _tree(pid: int) -> list[psutil.Process]:
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.Error:
        return []


def run_job(
    job_root: str,
    hosts: Sequence[str],
    *,
    timeout: float | None = None,
    env: Mapping[str, str] | None = None,
    python: str = sys.executable,
    grace: float = 15.0,
    output: Output | None = None,
) -> int:
    """Run ``train`` for every simulated host; the job's exit code.

    With ``output``, every line a host prints (stdout and stderr) is passed to
    ``output(host, line)`` instead of going to this process's own streams.
    """
    hosts = sorted(hosts)
    base = dict(os.environ if env is None else env)
    base.setdefault("SHOAL_MASTER_PORT", str(free_port()))
    base.setdefault("SHOAL_STATUS_PORT", str(free_port()))
    # The launchers' heartbeats too: each simulated host listens on a port of its own.
    base.setdefault(ADDRESSES_ENV, json.dumps({h: ["127.0.0.1", free_port()] for h in hosts}))
    # TensorFlow clusters name host:port; here every task needs a port of its own.
    base.setdefault(TF_ADDRESSES_ENV, json.dumps(simulated_tf_addresses(hosts, free_port)))
    # Short paths: Open MPI puts unix sockets in its session directory.
    session_tmp = tempfile.mkdtemp(prefix="shoal-")
    base[SESSION_TMP_ENV] = session_tmp
    try:
        return _run_hosts(job_root, hosts, base, timeout, python, grace, output)
    finally:
        shutil.rmtree(session_tmp, ignore_errors=True)


def relay_lines(host: str, pipe, output: Output) -> threading.Thread:
    def run():
        with pipe:
            for raw in iter(pipe.readline, b""):
                output(host, raw.decode("utf-8", "replace").rstrip("\n"))

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def wait_hosts(procs: Sequence[subprocess.Popen], timeout: float | None, grace: float) -> bool:
    """Wait for every host; False on timeout. As on SageMaker, a host that fails ends the
    job: the others get ``grace`` seconds to finish (and to learn the outcome from the
    master), then they are stopped."""
    deadline = None if timeout is None else time.monotonic() + timeout
    failed_at = None
    while any(p.poll() is None for p in procs):
        now = time.monotonic()
        if deadline is not None and now > deadline:
            _end(procs, grace)
            return False
        if failed_at is None and any(p.returncode for p in procs):
            failed_at = now
        if failed_at is not None and now - failed_at > grace:
            _end(procs, grace)
            break
        time.sleep(0.1)
    return True


def _run_hosts(job_root, hosts, base, timeout, python, grace, output) -> int:
    procs, relays = [], []
    pipes = {"stdout": subprocess.PIPE, "stderr": subprocess.STDOUT} if output else {}
    for host in hosts:
        host_env = host_environment(job_root, host, base)
        os.makedirs(host_env.get("OMPI_MCA_orte_tmpdir_base", "."), exist_ok=True)
        argv = [python, "-m", "shoal.launcher.entrypoint"]
        procs.append(subprocess.Popen(argv, env=host_env, **pipes))
        if output:
            relays.append(relay_lines(host, procs[-1].stdout, output))
    try:
        if not wait_hosts(procs, timeout, grace):
            return 124
    except BaseException:
        _end(procs, grace)
        raise
    finally:
        for relay in relays:
            relay.join(timeout=5)  # the rest of the output, unless a grandchild holds the pipe
    return job_exit_code(procs)


def job_exit_code(procs: Sequence[subprocess.Popen]) -> int:
    """The job's code from its hosts' (the master first): the master's, or the first
    non-zero one."""
    codes = [p.returncode for p in procs]
    return codes[0] or next((c for c in codes if c), 0)


def agent_main(argv: Sequence[str]) -> None:
    """``plm_rsh_agent``: run ``argv[1:]`` (a shell command) locally as host ``argv[0]``."""
    if len(argv) < 2:
        sys.exit("usage: python -m shoal.launcher.simulate <host> <command...>")
    host = argv[0]
    root = os.environ.get(SIMULATED_ROOT_ENV)
    if not root:
        sys.exit(f"{SIMULATED_ROOT_ENV} is not set: not a simulated job")
    env = host_environment(root, host, os.environ)
    session = env.get("OMPI_MCA_orte_tmpdir_base")
    if session:
        os.makedirs(session, exist_ok=True)
    os.execve("/bin/sh", ["/bin/sh", "-c", " ".join(remote_command(argv[1:], session))], env)


def remote_command(words: Sequence[str], session_dir: str | None) -> list[str]:
    """The words of the ``orted`` command mpirun asked to run, made fit for one simulated host.

    * ``--daemonize`` goes: orted stays the agent's process, so it remains in mpirun's tree;
    * mpirun repeats its own ``-mca orte_tmpdir_base`` on the orted command line, where it
      beats the environment: every simulated host's orted would then share mpirun's session
      directory (the real host name is the same), and one daemon cleaning up removes the
      other's files ("orte_session_dir failed", "ORTE does not know how to route"). The value
      becomes this host's own directory.
    """
    out: list[str] = []
    i = 0
    while i < len(words):
        word = words[i]
        if word.strip() == "--daemonize":
            i += 1
            continue
        if (session_dir and word.strip() in ("-mca", "--mca") and i + 2 < len(words)
                and words[i + 1].strip() == "orte_tmpdir_base"):  # fmt: skip
            out += [word, words[i + 1], shlex.quote(session_dir)]
            i += 3
            continue
        out.append(word)
        i += 1
    return out


if __name__ == "__main__":
    agent_main(sys.argv[1:])
