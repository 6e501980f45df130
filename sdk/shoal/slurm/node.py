"""One node's part of a Slurm job: ``python -m shoal.slurm.node <job-dir>``, started by
``srun`` once per node of the allocation (``shoal.slurm.hosts``).

The node is host ``algo-<SLURM_NODEID + 1>``. As a namespaced local host does, it enters mount
and UTS namespaces of its own, where its hostname is that name, its tree on the shared
directory is mounted at ``/opt/ml`` and the job's hosts file (every ``algo-N`` and its node's
address) is its ``/etc/hosts``; it starts ``train``, which takes the cluster path: the master
waits for its workers and runs mpirun, whose daemons on the other nodes start as steps of the
job (``shoal.slurm.agent``, which enters these namespaces): no sshd, no SSH. It runs in a PID
namespace of its own, so that nothing it started outlives it.

Slurm's variables are kept from the launcher (their values move to ``SHOAL_SLURM_JOB_ID`` and
``SHOAL_SLURM_NODE``): Open MPI inside a job step would otherwise start its daemons through
Slurm, in a step that cannot get the busy nodes, and block.

Jobs need not run as root. A user's job enters a user namespace first (``unshare --user
--map-root-user``, which unprivileged users may on current kernels), where it may set its
hostname and bind its mounts, then runs ``train`` as the user again (``host_script``'s
``run_as``); if the node has no ``/opt/ml`` to bind onto (only root could make one), the host's
tree is named by ``SAGEMAKER_BASE_DIR`` instead, as the launcher allows.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path

from shoal.local.network.hosts import MOUNT_POINT, host_script

from . import agent

SLURM_PREFIXES = ("SLURM_", "SLURMD_", "PMI_", "PMIX_")


def host_of(environ) -> str:
    return f"algo-{int(environ['SLURM_NODEID']) + 1}"


def launcher_environment(environ) -> dict[str, str]:
    env = {k: v for k, v in environ.items() if not k.startswith(SLURM_PREFIXES)}
    env["SHOAL_SLURM_JOB_ID"] = environ.get("SLURM_JOB_ID", "")
    env["SHOAL_SLURM_NODE"] = environ.get("SLURMD_NODENAME", "")
    return env


def unshare_argv(privileged: bool) -> list[str]:
    """A PID namespace too: when the launcher, the namespace's first process, exits, the kernel
    ends everything started in it, the daemons the agent brought in included (pure)."""
    user = [] if privileged else ["--user", "--map-root-user"]
    return ["unshare", *user, "--mount", "--uts", "--pid", "--fork", "--mount-proc",
            "--propagation", "private"]


def host_command(root: Path, host: str, environ: Mapping[str, str], *, privileged: bool,
                 opt_ml: bool, python: str = sys.executable) -> tuple[list[str], dict[str, str]]:
    """What the node's part execs, and its environment (pure)."""
    env = launcher_environment(environ)
    mount_tree = privileged or opt_ml
    if not mount_tree:
        env["SAGEMAKER_BASE_DIR"] = str(root / host)
    script = host_script(host, root / host, python, hosts_file=root / "hosts",
                         mount_tree=mount_tree,
                         run_as=None if privileged else (os.getuid(), os.getgid()))
    return [*unshare_argv(privileged), "/bin/sh", "-c", script], env


def main(argv=None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m shoal.slurm.node <job-dir>", file=sys.stderr)
        return 2
    root = Path(args[0])
    host = host_of(os.environ)
    privileged = os.geteuid() == 0
    if privileged:
        os.makedirs(MOUNT_POINT, exist_ok=True)
    command, env = host_command(root, host, os.environ, privileged=privileged,
                                opt_ml=os.path.isdir(MOUNT_POINT))
    # where the agent finds these namespaces: this process becomes unshare, whose child is
    # their first process
    agent.write_pid(root, host, os.getpid())
    os.execvpe(command[0], command, env)
    return 1  # not reached


if __name__ == "__main__":
    sys.exit(main())
