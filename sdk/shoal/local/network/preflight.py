"""What namespaced hosts need from the machine, checked before anything is created, with an
error that names what is missing: root (creating namespaces and veths needs
CAP_NET_ADMIN and CAP_SYS_ADMIN), iproute2's ``ip`` with ``netns``, ``tc`` for an emulated
link, and OpenSSH's server for the hosts' sshd."""

from __future__ import annotations

import os
import shutil
import subprocess

from .namespaces import NetworkError

SSHD = "/usr/sbin/sshd"


def missing(need_tc: bool = False, need_sshd: bool = True) -> list[str]:
    """What is missing, in words (empty: all there)."""
    problems = []
    if os.geteuid() != 0:
        problems.append("root (network namespaces and veth pairs need CAP_NET_ADMIN and "
                        "CAP_SYS_ADMIN): run the job as root")
    if shutil.which("ip") is None:
        problems.append("iproute2's 'ip' (apt-get install iproute2)")
    elif subprocess.run(["ip", "netns", "list"], capture_output=True).returncode != 0:
        problems.append("'ip netns' (this kernel or container does not allow network namespaces)")
    if need_tc and shutil.which("tc") is None:
        problems.append("'tc' for the emulated link (apt-get install iproute2)")
    if need_sshd and not os.path.exists(SSHD):
        problems.append(f"OpenSSH's server at {SSHD} (apt-get install openssh-server)")
    return problems


def check(need_tc: bool = False, need_sshd: bool = True) -> None:
    problems = missing(need_tc, need_sshd)
    if problems:
        raise NetworkError("SHOAL_LOCAL_NETWORK=namespaces needs " + "; ".join(problems))


def has_netem(namespace: str) -> bool:
    """Whether this kernel offers the netem qdisc (tried on a dummy link in ``namespace``)."""
    probe = ["ip", "-n", namespace, "link", "add", "probe0", "type", "veth", "peer", "name",
             "probe1"]
    if subprocess.run(probe, capture_output=True).returncode != 0:
        return False
    try:
        done = subprocess.run(["ip", "netns", "exec", namespace, "tc", "qdisc", "add", "dev",
                               "probe0", "root", "netem", "delay", "1us"], capture_output=True)
        return done.returncode == 0
    finally:
        subprocess.run(["ip", "-n", namespace, "link", "delete", "probe0"], capture_output=True)


def has_netem_here() -> bool:
    """``has_netem`` in a namespace of its own, removed after."""
    name = f"shoal-probe-{os.getpid()}"
    if subprocess.run(["ip", "netns", "add", name], capture_output=True).returncode != 0:
        return False
    try:
        return has_netem(name)
    finally:
        subprocess.run(["ip", "netns", "delete", name], capture_output=True)
