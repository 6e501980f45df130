"""A local job's hosts in network namespaces: the plan, and applying and removing it.

Job slot ``S`` (1-254, the first one free on this machine) owns namespace ``shoal-netS``,
which holds bridge ``br0``, and one namespace ``shoal-netS-<host>`` per host, whose ``eth0``
is one end of a veth pair (the other end, ``vN``, sits on the bridge) with address
``10.213.S.N/24``: a range used only inside these namespaces, so nothing outside them, the
machine's own namespace included, gains an interface, an address or a route. Each host's
``/etc/netns/<namespace>/hosts`` (which ``ip netns exec`` mounts over ``/etc/hosts``) names
every ``algo-N``.

``plan()`` is pure data (names, addresses, hosts files, commands); ``JobNetwork`` runs it, and
removes it whatever happened. The slot's owner (pid and start time) is recorded in
``/run/shoal-netns/S.json``: a later job removes the namespaces of an owner that is gone, and
every process still in them (a supervisor killed with SIGKILL cannot clean up after itself).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

import attrs
import psutil

from shoal.errors import ConfigError

from .links import LinkSpec, qdisc_commands

PREFIX = "shoal-net"
SUBNET = "10.213"
SLOTS = range(1, 255)
NETNS_ETC = Path("/etc/netns")
OWNERS = Path("/run/shoal-netns")


class NetworkError(ConfigError):
    """The job's namespaces could not be set up on this machine."""


@attrs.frozen
class HostPlan:
    host: str
    index: int         # 1-based: its address's last byte and its veth's number
    namespace: str
    address: str       # 10.213.S.N

    @property
    def veth(self) -> str:
        return f"v{self.index}"


@attrs.frozen
class NetworkPlan:
    slot: int
    hosts: tuple[HostPlan, ...]
    link: LinkSpec | None = None

    @property
    def bridge_namespace(self) -> str:
        return f"{PREFIX}{self.slot}"

    @property
    def namespaces(self) -> list[str]:
        return [self.bridge_namespace, *(h.namespace for h in self.hosts)]

    def host(self, name: str) -> HostPlan:
        return next(h for h in self.hosts if h.host == name)

    def hosts_file(self, host: HostPlan) -> str:
        return hosts_text((h.address, h.host) for h in self.hosts)

    def setup_commands(self, netem: bool = True) -> list[list[str]]:
        """Everything after the bridge namespace exists (it is the slot's lock)."""
        br = self.bridge_namespace
        commands = [["ip", "-n", br, "link", "add", "br0", "type", "bridge"],
                    ["ip", "-n", br, "link", "set", "br0", "up"]]
        for h in self.hosts:
            commands += [
                ["ip", "netns", "add", h.namespace],
                ["ip", "link", "add", "eth0", "netns", h.namespace, "type", "veth", "peer",
                 "name", h.veth, "netns", br],
                ["ip", "-n", br, "link", "set", h.veth, "master", "br0"],
                ["ip", "-n", br, "link", "set", h.veth, "up"],
                ["ip", "-n", h.namespace, "addr", "add", f"{h.address}/24", "dev", "eth0"],
                ["ip", "-n", h.namespace, "link", "set", "eth0", "up"],
                ["ip", "-n", h.namespace, "link", "set", "lo", "up"],
            ]
            if self.link is not None:
                commands += [["ip", "netns", "exec", h.namespace, *c]
                             for c in qdisc_commands(self.link, "eth0", netem)]
        return commands


def hosts_text(entries: Iterable[tuple[str, str]]) -> str:
    """A hosts file: localhost, then each (address, name)."""
    lines = ["127.0.0.1\tlocalhost", "::1\tlocalhost ip6-localhost ip6-loopback"]
    return "\n".join(lines + [f"{address}\t{name}" for address, name in entries]) + "\n"


def plan(hosts: Sequence[str], slot: int, link: LinkSpec | None = None) -> NetworkPlan:
    if slot not in SLOTS:
        raise NetworkError(f"'slot' must be in 1..254 (got {slot})")
    if not 1 <= len(hosts) <= 250:
        raise NetworkError(f"a namespaced job has 1 to 250 hosts (got {len(hosts)})")
    return NetworkPlan(slot, tuple(
        HostPlan(host, n, f"{PREFIX}{slot}-{host}", f"{SUBNET}.{slot}.{n}")
        for n, host in enumerate(hosts, start=1)), link)


Run = Callable[[list[str]], subprocess.CompletedProcess]


def run_command(argv: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, timeout=60)


class JobNetwork:
    """Creates a job's namespaces (``create``) and removes them (``destroy``, idempotent)."""

    def __init__(self, hosts: Sequence[str], link: LinkSpec | None = None, netem: bool = True,
                 run: Run = run_command, owners: Path = OWNERS, netns_etc: Path = NETNS_ETC):
        self.hosts, self.link, self.netem, self.run = list(hosts), link, netem, run
        self.owners, self.netns_etc = Path(owners), Path(netns_etc)
        self.plan: NetworkPlan | None = None

    def create(self) -> NetworkPlan:
        sweep(self.run, self.owners, self.netns_etc)
        self.plan = self._claim_slot()
        try:
            for host in self.plan.hosts:
                folder = self.netns_etc / host.namespace
                folder.mkdir(parents=True, exist_ok=True)
                (folder / "hosts").write_text(self.plan.hosts_file(host))
            for argv in self.plan.setup_commands(self.netem):
                self._check(argv)
        except BaseException:
            self.destroy()
            raise
        return self.plan

    def _claim_slot(self) -> NetworkPlan:
        existing = set(list_namespaces(self.run))
        for slot in SLOTS:
            candidate = plan(self.hosts, slot, self.link)
            if candidate.bridge_namespace in existing:
                continue
            # creating the bridge namespace is the lock: it fails if another job took the slot
            if self.run(["ip", "netns", "add", candidate.bridge_namespace]).returncode == 0:
                self.owners.mkdir(parents=True, exist_ok=True)
                me = psutil.Process()
                (self.owners / f"{slot}.json").write_text(json.dumps(
                    {"pid": me.pid, "create_time": me.create_time(),
                     "namespaces": candidate.namespaces}))
                return candidate
        raise NetworkError("no free network slot: 254 namespaced jobs are running")

    def _check(self, argv: list[str]) -> None:
        done = self.run(argv)
        if done.returncode != 0:
            raise NetworkError(f"{' '.join(argv)} failed: {(done.stderr or '').strip()}")

    def destroy(self) -> None:
        if self.plan is None:
            return
        remove(self.plan.slot, self.plan.namespaces, self.run, self.owners, self.netns_etc)
        self.plan = None

    def exec_prefix(self, host: str) -> list[str]:
        """Runs a command in ``host``'s namespace (with its hosts file as /etc/hosts)."""
        assert self.plan is not None, "create() first"
        return ["ip", "netns", "exec", self.plan.host(host).namespace]


def list_namespaces(run: Run = run_command) -> list[str]:
    done = run(["ip", "netns", "list"])
    return [line.split()[0] for line in (done.stdout or "").splitlines() if line.strip()]


def namespace_pids(names: Sequence[str], run: Run = run_command) -> list[int]:
    """The processes inside the namespaces ``names``."""
    found = []
    for ns in names:
        found += [int(p) for p in (run(["ip", "netns", "pids", ns]).stdout or "").split()
                  if p.isdigit()]
    return found


def signal_namespaces(names: Sequence[str], sig: int, run: Run = run_command) -> None:
    for pid in namespace_pids(names, run):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def remove(slot: int, namespaces: Sequence[str], run: Run = run_command, owners: Path = OWNERS,
           netns_etc: Path = NETNS_ETC) -> None:
    """Deletes a slot's namespaces (hosts first, the bridge's last; their veth ends go with
    them), their hosts files and its owner record (idempotent)."""
    present = set(list_namespaces(run))
    for ns in reversed(list(namespaces)):
        if ns in present:
            # a process left inside (its job's supervisor was killed outright) would keep
            # the namespace, and its sshd or rank, alive after the name is gone
            signal_namespaces([ns], signal.SIGKILL, run)
            run(["ip", "netns", "delete", ns])
        shutil.rmtree(netns_etc / ns, ignore_errors=True)
    (owners / f"{slot}.json").unlink(missing_ok=True)


def sweep(run: Run = run_command, owners: Path = OWNERS, netns_etc: Path = NETNS_ETC) -> list[int]:
    """Removes the slots whose owner process is gone; returns them."""
    removed = []
    for record in sorted(owners.glob("*.json")) if owners.exists() else []:
        try:
            owner = json.loads(record.read_text())
            slot = int(record.stem)
        except (OSError, ValueError):
            continue
        if not _alive(owner.get("pid"), owner.get("create_time")):
            remove(slot, owner.get("namespaces", []), run, owners, netns_etc)
            removed.append(slot)
    return removed


def _alive(pid, create_time) -> bool:
    try:
        return abs(psutil.Process(int(pid)).create_time() - float(create_time)) < 0.01
    except (psutil.NoSuchProcess, TypeError, ValueError):
        return False


def slot_of(namespace: str) -> int | None:
    """The slot a Shoal namespace belongs to, or None for any other namespace."""
    if not namespace.startswith(PREFIX):
        return None
    digits = namespace[len(PREFIX):].split("-", 1)[0]
    return int(digits) if digits.isdigit() else None
