"""A real Slurm cluster on this machine, for tests and newcomers: ``make slurm-up`` /
``make slurm-down`` (``python -m shoal.slurm.devcluster up|down|status [--nodes N]``).

Debian's own Slurm 22.05 and munge, configured here: slurmctld on this machine, and one slurmd
per node, each node in network and UTS namespaces of its own (hostname ``nodeK``, its own
address on a bridge this machine also sits on), so ``sbatch``/``squeue``/``sacct``/``scancel``
typed here reach the cluster as they would a login node's. The nodes share this machine's
files: any directory is the cluster's shared directory.

``plan()`` is pure data (names, addresses, ``slurm.conf``, hosts files); ``up()`` applies it
and is idempotent (a healthy cluster of that size is left as it is); ``down()`` ends every
daemon and job it started and removes the namespaces, the bridge and the files it wrote,
whatever state ``up()`` reached. A ``slurm.conf`` that Shoal did not write is never touched.
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import attrs
import psutil

from shoal.errors import ConfigError
from shoal.launcher.supervisor import end_processes
from shoal.local.network.namespaces import hosts_text, list_namespaces, namespace_pids

MARKER = "# Written by Shoal's `make slurm-up`: removed by `make slurm-down`."
SLURM_CONF = Path("/etc/slurm/slurm.conf")
STATE_DIR = Path("/var/lib/shoal-slurm")  # slurmctld's state, spools, logs, jobcomp
RUN_DIR = Path("/run/shoal-slurm")
NETNS_ETC = Path("/etc/netns")
BRIDGE = "shoalslurm0"
SUBNET = "10.215.0"
CONTROLLER_ADDRESS = f"{SUBNET}.1"
NAMESPACE_PREFIX = "shoal-slurm-"
MUNGE_SOCKET = Path("/run/munge/munge.socket.2")
READY_SECONDS = 60.0


class ClusterError(ConfigError):
    """The local Slurm cluster could not be started (or stopped) on this machine."""


@attrs.frozen
class Node:
    name: str          # nodeK: its hostname and its Slurm NodeName
    index: int         # K, 1-based
    address: str       # 10.215.0.(10+K)
    cpus: int
    memory_mb: int

    @property
    def namespace(self) -> str:
        return f"{NAMESPACE_PREFIX}{self.name}"

    @property
    def veth(self) -> str:
        return f"ssl{self.index}"  # the bridge's end of the node's link (name <= 15 chars)


@attrs.frozen
class ClusterPlan:
    controller: str    # this machine's short hostname: slurmctld checks it is SlurmctldHost
    nodes: tuple[Node, ...]
    partition: str = "shoal"

    def hosts_file(self) -> str:
        return hosts_text([(CONTROLLER_ADDRESS, self.controller),
                           *((n.address, n.name) for n in self.nodes)])

    def slurm_conf(self) -> str:
        node_lines = [f"NodeName={n.name} NodeAddr={n.address} CPUs={n.cpus} "
                      f"RealMemory={n.memory_mb} State=UNKNOWN" for n in self.nodes]
        names = ",".join(n.name for n in self.nodes)
        return "\n".join([
            MARKER,
            "ClusterName=shoal",
            f"SlurmctldHost={self.controller}({CONTROLLER_ADDRESS})",
            "SlurmUser=root", "SlurmdUser=root",
            "AuthType=auth/munge", "CredType=cred/munge",
            # a requeued job waits for its last run's credential to expire before it starts
            # again: 20 s here instead of 120 (the credential still outlives a step's launch)
            "AuthInfo=cred_expire=20",
            f"StateSaveLocation={STATE_DIR}/ctld",
            f"SlurmdSpoolDir={STATE_DIR}/spool/%n",
            f"SlurmctldPidFile={RUN_DIR}/slurmctld.pid",
            f"SlurmdPidFile={RUN_DIR}/slurmd-%n.pid",
            f"SlurmctldLogFile={STATE_DIR}/log/slurmctld.log",
            f"SlurmdLogFile={STATE_DIR}/log/slurmd-%n.log",
            # no cgroups here: processes are tracked by their parentage
            "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            # finished jobs, one line each, for `sacct -c` (no slurmdbd here)
            "JobCompType=jobcomp/filetxt", f"JobCompLoc={STATE_DIR}/jobcomp.txt",
            "MinJobAge=3600",  # a finished job stays visible to squeue/scontrol for an hour
            "ReturnToService=2",  # a node that comes back is used again
            "SlurmdParameters=config_overrides",
            "SelectType=select/cons_tres", "SelectTypeParameters=CR_CPU",
            "MpiDefault=none", "SwitchType=switch/none",
            "KillWait=30", "SlurmdTimeout=30", "InactiveLimit=0", "Waittime=0",
            *node_lines,
            f"PartitionName={self.partition} Nodes={names} Default=YES MaxTime=INFINITE "
            "State=UP OverSubscribe=NO",
            "",
        ])

    def network_commands(self) -> list[list[str]]:
        commands = [["ip", "link", "add", BRIDGE, "type", "bridge"],
                    ["ip", "addr", "add", f"{CONTROLLER_ADDRESS}/24", "dev", BRIDGE],
                    ["ip", "link", "set", BRIDGE, "up"]]
        for n in self.nodes:
            commands += [
                ["ip", "netns", "add", n.namespace],
                ["ip", "link", "add", "eth0", "netns", n.namespace, "type", "veth", "peer",
                 "name", n.veth],
                ["ip", "link", "set", n.veth, "master", BRIDGE],
                ["ip", "link", "set", n.veth, "up"],
                ["ip", "-n", n.namespace, "addr", "add", f"{n.address}/24", "dev", "eth0"],
                ["ip", "-n", n.namespace, "link", "set", "eth0", "up"],
                ["ip", "-n", n.namespace, "link", "set", "lo", "up"],
            ]
        return commands

    def slurmd_argv(self, node: Node) -> list[str]:
        """slurmd in the node's namespaces: its hostname is its NodeName, its hosts file names
        the controller and every node, and locked memory is raised to its hard limit
        (Debian's unit sets it unlimited: Open MPI needs it). ``nsenter`` rather than ``ip
        netns exec``, which mounts a fresh /sys and so hides /sys/fs/cgroup from slurmd."""
        hosts = NETNS_ETC / node.namespace / "hosts"
        script = (f"hostname {node.name} && mount --bind {hosts} /etc/hosts && "
                  'ulimit -S -l "$(ulimit -H -l)" && exec /usr/sbin/slurmd')
        return ["nsenter", f"--net=/run/netns/{node.namespace}", "unshare", "--uts", "--mount",
                "--propagation", "private", "/bin/sh", "-c", script]


def plan(nodes: int = 2, controller: str | None = None) -> ClusterPlan:
    if not 1 <= nodes <= 200:
        raise ClusterError(f"'nodes' must be in 1..200 (got {nodes})")
    cpus = os.cpu_count() or 1
    memory = max(256, psutil.virtual_memory().total // (1024 * 1024) // nodes // 2)
    return ClusterPlan(controller or socket.gethostname().split(".")[0], tuple(
        Node(f"node{k}", k, f"{SUBNET}.{10 + k}", cpus, memory) for k in range(1, nodes + 1)))


# -- applying it -------------------------------------------------------------------------------
def _run(argv: list[str], check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    if check and done.returncode != 0:
        raise ClusterError(f"{' '.join(argv)} failed: {(done.stderr or done.stdout).strip()}")
    return done


def _preflight() -> None:
    if os.geteuid() != 0:
        raise ClusterError("the local Slurm cluster needs root (network namespaces, slurmd)")
    missing = [p for p in ("/usr/sbin/slurmctld", "/usr/sbin/slurmd", "/usr/sbin/munged",
                           "/usr/bin/sbatch") if not Path(p).exists()]
    if missing:
        raise ClusterError(f"missing {', '.join(missing)}: install Debian's slurmctld slurmd "
                           "slurm-client munge (make slurm-up does)")


def munge_running() -> bool:
    if not MUNGE_SOCKET.exists():
        return False
    encoded = subprocess.run(["munge", "-n"], capture_output=True, timeout=10)
    return encoded.returncode == 0 and subprocess.run(
        ["unmunge"], input=encoded.stdout, capture_output=True, timeout=10).returncode == 0


def start_munge() -> None:
    """One munged for the machine: its socket is a path, seen from every node's namespace."""
    if munge_running():
        return
    key = Path("/etc/munge/munge.key")
    if not key.exists():
        _run(["mungekey", "--create", "--keyfile", str(key)])
    for path, mode in ((key, 0o400), (key.parent, 0o700)):
        os.chown(path, _uid("munge"), _gid("munge"))
        os.chmod(path, mode)
    for folder in (Path("/run/munge"), Path("/var/log/munge"), Path("/var/lib/munge")):
        folder.mkdir(parents=True, exist_ok=True)
        os.chown(folder, _uid("munge"), _gid("munge"))
    _run(["runuser", "-u", "munge", "--", "/usr/sbin/munged"])
    _wait(munge_running, 10, "munged did not answer on /run/munge/munge.socket.2")
    (RUN_DIR / "munged-by-shoal").touch()


def _uid(name: str) -> int:
    import pwd

    return pwd.getpwnam(name).pw_uid


def _gid(name: str) -> int:
    import grp

    return grp.getgrnam(name).gr_gid


def _wait(check, seconds: float, message: str) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        if time.monotonic() > deadline:
            raise ClusterError(message)
        time.sleep(0.3)


def node_states() -> dict[str, str]:
    """Each node's state as sinfo gives it (``idle``, ``alloc``, ``down*`` ...)."""
    done = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %T"], capture_output=True, text=True,
                          timeout=20)
    if done.returncode != 0:
        return {}
    return dict(line.split()[:2] for line in done.stdout.splitlines() if len(line.split()) >= 2)


def slurmd_running(node: Node) -> bool:
    """A slurmd in the node's namespace (slurmctld notices a dead one only after
    SlurmdTimeout: until then sinfo still shows the node as it was)."""
    for pid in namespace_pids([node.namespace]):
        try:
            if Path(f"/proc/{pid}/comm").read_text().strip() == "slurmd":
                return True
        except OSError:
            continue
    return False


def healthy(cluster: ClusterPlan) -> bool:
    states = node_states()
    return (SLURM_CONF.is_file() and SLURM_CONF.read_text() == cluster.slurm_conf()
            and all(slurmd_running(n) for n in cluster.nodes)
            and all(states.get(n.name, "").rstrip("*") in ("idle", "allocated", "mixed",
                                                           "completing")
                    and not states[n.name].endswith("*") for n in cluster.nodes))


def up(nodes: int = 2, say=print) -> ClusterPlan:
    _preflight()
    cluster = plan(nodes)
    if healthy(cluster):
        say(f"the local Slurm cluster is up: {', '.join(n.name for n in cluster.nodes)}")
        return cluster
    if SLURM_CONF.exists() and MARKER not in SLURM_CONF.read_text():
        raise ClusterError(f"{SLURM_CONF} exists and was not written by Shoal: this machine "
                           "has a Slurm configuration of its own; not touching it")
    down(say=lambda *_: None)  # whatever a previous up() left half-done
    for folder in (STATE_DIR / "ctld", STATE_DIR / "spool", STATE_DIR / "log", RUN_DIR):
        folder.mkdir(parents=True, exist_ok=True)
    try:
        start_munge()
        for argv in cluster.network_commands():
            _run(argv)
        for n in cluster.nodes:
            (NETNS_ETC / n.namespace).mkdir(parents=True, exist_ok=True)
            (NETNS_ETC / n.namespace / "hosts").write_text(cluster.hosts_file())
            (STATE_DIR / "spool" / n.name).mkdir(parents=True, exist_ok=True)
        SLURM_CONF.parent.mkdir(parents=True, exist_ok=True)
        SLURM_CONF.write_text(cluster.slurm_conf())
        _run(["/usr/sbin/slurmctld"])  # daemonizes; its pid file is in RUN_DIR
        _wait(lambda: subprocess.run(["scontrol", "ping"], capture_output=True, text=True,
                                     timeout=10).stdout.count("UP") > 0, 20,
              f"slurmctld did not come up: see {STATE_DIR / 'log' / 'slurmctld.log'}")
        for n in cluster.nodes:
            _run(cluster.slurmd_argv(n))
        _wait(lambda: healthy(cluster), READY_SECONDS,
              f"the nodes did not come up idle ({node_states()}): see {STATE_DIR / 'log'}")
    except BaseException:
        down(say=lambda *_: None)
        raise
    say(f"the local Slurm cluster is up: {', '.join(n.name for n in cluster.nodes)} "
        f"(partition {cluster.partition}; logs in {STATE_DIR / 'log'})")
    return cluster


def _end(pids: list[int]) -> None:
    """SIGTERM, then SIGKILL after 10 s, the processes still there."""
    procs = []
    for pid in pids:
        try:
            procs.append(psutil.Process(pid))
        except psutil.NoSuchProcess:
            pass
    end_processes(procs, grace=10)


def _pid_file(path: Path) -> list[int]:
    try:
        return [int(path.read_text().split()[0])]
    except (OSError, ValueError, IndexError):
        return []


def down(say=print) -> None:
    """Ends the cluster's jobs and daemons and removes what up() made (idempotent)."""
    ours = SLURM_CONF.is_file() and MARKER in SLURM_CONF.read_text()
    namespaces = [ns for ns in list_namespaces() if ns.startswith(NAMESPACE_PREFIX)]
    _end(namespace_pids(namespaces))  # slurmd, slurmstepd and every job process on the nodes
    if ours:
        _end(_pid_file(RUN_DIR / "slurmctld.pid")
             or [p.pid for p in psutil.process_iter(["name"]) if p.info["name"] == "slurmctld"])
    for ns in namespaces:
        _run(["ip", "netns", "delete", ns], check=False)
        for path in (NETNS_ETC / ns / "hosts", NETNS_ETC / ns):
            if path.is_dir():
                path.rmdir()
            else:
                path.unlink(missing_ok=True)
    _run(["ip", "link", "delete", BRIDGE], check=False)
    if (RUN_DIR / "munged-by-shoal").exists():
        _end([p.pid for p in psutil.process_iter(["name"]) if p.info["name"] == "munged"])
    if ours:
        SLURM_CONF.unlink()
        import shutil

        shutil.rmtree(STATE_DIR, ignore_errors=True)
        shutil.rmtree(RUN_DIR, ignore_errors=True)
    say("the local Slurm cluster is down")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("action", choices=("up", "down", "status"))
    parser.add_argument("--nodes", type=int, default=int(os.environ.get("SLURM_NODES", "2")))
    args = parser.parse_args(argv)
    try:
        if args.action == "up":
            up(args.nodes)
        elif args.action == "down":
            down()
        else:
            states = node_states()
            print("\n".join(f"{k} {v}" for k, v in sorted(states.items())) or "no cluster")
            return 0 if states else 1
    except ClusterError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
