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
Slurm, in a step that cannot get the busy nodes, and block. Entering the namespaces needs
root on the node (the local Slurm cluster runs its jobs as root).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from shoal.local.network.hosts import host_script

from . import agent

SLURM_PREFIXES = ("SLURM_", "SLURMD_", "PMI_", "PMIX_")


def host_of(environ) -> str:
    return f"algo-{int(environ['SLURM_NODEID']) + 1}"


def launcher_environment(environ) -> dict[str, str]:
    env = {k: v for k, v in environ.items() if not k.startswith(SLURM_PREFIXES)}
    env["SHOAL_SLURM_JOB_ID"] = environ.get("SLURM_JOB_ID", "")
    env["SHOAL_SLURM_NODE"] = environ.get("SLURMD_NODENAME", "")
    return env


def main(argv=None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m shoal.slurm.node <job-dir>", file=sys.stderr)
        return 2
    root = Path(args[0])
    if os.geteuid() != 0:
        print(f"{os.environ.get('SLURMD_NODENAME', 'this node')}: Shoal's Slurm backend runs "
              "each host in mount and UTS namespaces of its own (its /opt/ml, its algo-N names) "
              "and needs root on the nodes for it", file=sys.stderr)
        return 1
    host = host_of(os.environ)
    script = host_script(host, root / host, sys.executable, hosts_file=root / "hosts")
    # where the agent finds these namespaces: this process becomes unshare, whose child is
    # their first process
    agent.write_pid(root, host, os.getpid())
    # a PID namespace too: when the launcher, the namespace's first process, exits, the kernel
    # ends everything started in it, the daemons the agent brought in included
    argv = ["unshare", "--mount", "--uts", "--pid", "--fork", "--mount-proc", "--propagation",
            "private", "/bin/sh", "-c", script]
    os.execvpe(argv[0], argv, launcher_environment(os.environ))
    return 1  # not reached


if __name__ == "__main__":
    sys.exit(main())
