"""Running a local job's hosts in namespaces: the path a SageMaker job takes.

Each host runs in its network namespace (``namespaces``) and in mount and UTS namespaces of
its own, where its hostname is ``algo-N`` and the job's tree for it is mounted at ``/opt/ml``,
as in a SageMaker container. There it starts its own sshd (the job's host key; the job's
key pair, made for this job and removed with it, is the only one it accepts) and then
``train``, with no simulation switch: the master waits for its workers over the status port
and port 22, and runs mpirun, which starts the other hosts' ranks over SSH. When the job
ends, however it ends, every process in the namespaces is ended and the namespaces removed.

With an image (``SHOAL_LOCAL_IMAGE``: Shoal's training image as built here), each host runs
inside it instead: a buildah container per host, run from within the host's network
namespace (chroot isolation shares that network), with hostname ``algo-N``, the hosts'
addresses in its hosts file, its tree mounted at ``/opt/ml``, the request's ``Environment``,
and the image's own entrypoint (``shoal-entrypoint train``), which starts the image's sshd
and takes the cluster path with the image's keys: the container path end to end.

The machine needs ``/opt/ml`` as a mount point (created empty if missing).
"""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import attrs

from shoal.launcher import simulate

from . import preflight
from .links import LinkSpec
from .namespaces import JobNetwork, NetworkError, list_namespaces, namespace_pids, signal_namespaces

MOUNT_POINT = "/opt/ml"
SSH_DIR = "ssh"
# what only the simulation uses: a namespaced host takes the real path
SIMULATION_ONLY = (simulate.SIMULATED_ROOT_ENV, simulate.SESSION_TMP_ENV, "SAGEMAKER_BASE_DIR",
                   "SHOAL_HOST", "SHOAL_MASTER_ADDR", "SHOAL_MASTER_PORT", "SHOAL_STATUS_PORT",
                   "SHOAL_TF_ADDRESSES", "SHOAL_HEARTBEAT_ADDRESSES", "OMPI_MCA_orte_tmpdir_base")


def make_keys(job_root: Path) -> Path:
    """The job's SSH material: a host key, a client key pair, the sshd config."""
    folder = Path(job_root) / SSH_DIR
    folder.mkdir(mode=0o700, exist_ok=True)
    for name in ("host_key", "id"):
        if not (folder / name).exists():
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "shoal-local",
                            "-f", str(folder / name)], check=True, capture_output=True)
    shutil.copy(folder / "id.pub", folder / "authorized_keys")
    (folder / "sshd_config").write_text("\n".join([
        "Port 22", "ListenAddress 0.0.0.0", f"HostKey {folder / 'host_key'}",
        f"AuthorizedKeysFile {folder / 'authorized_keys'}", "PermitRootLogin prohibit-password",
        "PasswordAuthentication no", "KbdInteractiveAuthentication no", "UsePAM no",
        "StrictModes no", "PidFile none", "LogLevel ERROR", ""]))
    return folder


def ssh_agent(keys: Path) -> str:
    """mpirun's ``plm_rsh_agent``: ssh with the job's key, to hosts whose keys are new each job."""
    return (f"ssh -i {keys / 'id'} -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null "
            "-o BatchMode=yes -o LogLevel=ERROR")


def host_script(host: str, host_tree: Path, python: str, *, keys: Path | None = None,
                hosts_file: Path | None = None, mount_tree: bool = True,
                run_as: tuple[int, int] | None = None) -> str:
    """What runs in a host's namespaces: its hostname, its /opt/ml (unless the tree is named
    by ``SAGEMAKER_BASE_DIR`` instead; and, on a cluster's node, the job's hosts file naming
    every algo-N), its sshd when mpirun reaches it over SSH (``keys``), then train.

    ``run_as`` (uid, gid): the namespaces belong to a user namespace where an unprivileged
    user is root; train runs as that user again, in a user namespace of its own (Slurm's
    commands refuse a job step from a "root" that its credential says is the user). The shell
    stays, the namespaces' first process, for the Slurm agent to enter."""
    mounts = [f"mount --bind {shlex.quote(str(host_tree))} {MOUNT_POINT}"] if mount_tree else []
    mounts += [f"mount --bind {shlex.quote(str(hosts_file))} /etc/hosts"] if hosts_file else []
    sshd = ["mkdir -p /run/sshd",
            f"/usr/sbin/sshd -f {shlex.quote(str(keys / 'sshd_config'))}"] if keys else []
    return "; ".join([
        "set -e",
        f"hostname {shlex.quote(host)}",
        *mounts,
        *sshd,
        f"{as_user(run_as)} {shlex.quote(python)} -m shoal.launcher.entrypoint" if run_as else
        f"exec {shlex.quote(python)} -m shoal.launcher.entrypoint",
    ])


def as_user(run_as: tuple[int, int]) -> str:
    """The command prefix that maps this user namespace's root back to the user (pure)."""
    return f"unshare --user --map-user={run_as[0]} --map-group={run_as[1]}"


def host_environment(base: Mapping[str, str], keys: Path) -> dict[str, str]:
    env = cluster_environment(base)
    env["OMPI_MCA_plm_rsh_agent"] = ssh_agent(keys)
    return env


def cluster_environment(base: Mapping[str, str]) -> dict[str, str]:
    """The hosts' environment on real (namespaced or cluster) hosts: no simulation switch,
    and the waits shortened for a machine where nothing is slow to start."""
    env = {k: v for k, v in base.items() if k not in SIMULATION_ONLY}
    # the master tells its workers the outcome and waits for their acknowledgements; a worker
    # cut off (its link down) never acknowledges, and this runner ends every host once the
    # master is done: a short wait, not SageMaker's minute
    env.setdefault("SHOAL_STATUS_LINGER", "5")
    # once a rank failed, mpirun ends the job at once unless a host is cut off, when it
    # waits for that host's daemon: stopped after 5 s, not SageMaker's 15
    env.setdefault("SHOAL_FAILURE_GRACE", "5")
    return env


@attrs.frozen
class Image:
    """A training image to run each host in, and the buildah store it is in."""

    reference: str
    buildah: tuple[str, ...] = ("buildah",)  # the global arguments: driver, root
    environment: Mapping[str, str] = attrs.field(factory=dict)  # the request's Environment
    entrypoint: tuple[str, ...] = ("/usr/local/bin/shoal-entrypoint", "train")

    def create(self, network) -> dict[str, str]:
        """A container per host, its hosts file naming every host: host -> container."""
        hosts_args = [a for h in network.plan.hosts for a in ("--add-host", f"{h.host}:{h.address}")]
        made = {}
        for h in network.plan.hosts:
            done = subprocess.run([*self.buildah, "from", "--quiet", *hosts_args, self.reference],
                                  capture_output=True, text=True)
            if done.returncode != 0:
                self.remove(made)
                raise NetworkError(f"buildah from {self.reference}: "
                                             f"{done.stderr.strip()[-500:]}")
            made[h.host] = done.stdout.strip().splitlines()[-1]
        return made

    def run_argv(self, host: str, container: str, tree: Path) -> list[str]:
        env = [a for k, v in self.environment.items() for a in ("--env", f"{k}={v}")]
        return [*self.buildah, "run", "--isolation", "chroot", "--network", "host",
                "--hostname", host, "--volume", f"{tree}:{MOUNT_POINT}", *env, container, "--",
                *self.entrypoint]

    def remove(self, containers: Mapping[str, str]) -> None:
        for name in containers.values():
            subprocess.run([*self.buildah, "rm", name], capture_output=True)


def run_job(job_root: str, hosts: Sequence[str], *, timeout: float | None = None,
            env: Mapping[str, str] | None = None, python: str = sys.executable,
            grace: float = 15.0, output=None, link: LinkSpec | None = None,
            image: Image | None = None, say=None) -> int:
    """Run ``train`` for every host, each in its namespaces (and, with ``image``, inside
    it); the job's exit code (as ``simulate.run_job``: 124 when ``timeout`` ran out)."""
    preflight.check(need_tc=link is not None)
    hosts = sorted(hosts)
    root = Path(job_root).resolve()
    keys = make_keys(root)
    netem = preflight.has_netem_here() if link is not None and link.delay_us else True
    network = JobNetwork(hosts, link=link, netem=netem)
    os.makedirs(MOUNT_POINT, exist_ok=True)
    plan = network.create()
    if say:
        say(f"network slot {plan.slot}: " + ", ".join(f"{h.host} {h.address}" for h in plan.hosts))
    procs, containers = [], {}
    try:
        base = host_environment(os.environ if env is None else env, keys)
        pipes = {"stdout": subprocess.PIPE, "stderr": subprocess.STDOUT} if output else {}
        relays = []
        containers = image.create(network) if image is not None else {}
        for host in hosts:
            if image is not None:
                argv = [*network.exec_prefix(host),
                        *image.run_argv(host, containers[host], root / host)]
            else:
                argv = [*network.exec_prefix(host), "unshare", "--mount", "--uts",
                        "--propagation", "private", "/bin/sh", "-c",
                        host_script(host, root / host, python, keys=keys)]
            procs.append(subprocess.Popen(argv, env=base, **pipes))
            if output:
                relays.append(simulate.relay_lines(host, procs[-1].stdout, output))
        try:
            # a failed host's peers learn the outcome from the master in a moment, or (cut
            # off) never: a short wait before they are ended
            if not simulate.wait_hosts(procs, timeout, min(grace, 5.0)):
                return 124
        finally:
            for relay in relays:
                relay.join(timeout=5)
        return simulate.job_exit_code(procs)
    finally:
        end_namespaces(network, procs, grace)
        if image is not None:
            image.remove(containers)
        network.destroy()
        shutil.rmtree(keys, ignore_errors=True)  # the job's keys live as long as the job


def end_namespaces(network: JobNetwork, procs, grace: float) -> None:
    """SIGTERM, then SIGKILL, every process in the job's namespaces (sshd, ranks, strays)."""
    if network.plan is None:
        return
    present = set(list_namespaces())
    names = [h.namespace for h in network.plan.hosts if h.namespace in present]
    for sig, wait in ((signal.SIGTERM, min(grace, 10.0)), (signal.SIGKILL, 5.0)):
        signal_namespaces(names, sig)
        if sig == signal.SIGTERM:  # a stopped process (a frozen host) acts on it once resumed
            signal_namespaces(names, signal.SIGCONT)
        deadline = time.monotonic() + wait
        while namespace_pids(names) and time.monotonic() < deadline:
            time.sleep(0.1)
    for p in procs:
        if p.poll() is None:
            p.kill()
        p.wait()
