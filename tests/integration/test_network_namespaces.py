"""Real namespaces: two hosts that reach each other by name over their own eth0 addresses,
through an emulated link, and nothing left behind (namespaces, hosts files, owner records,
and no interface in the machine's own namespace)."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
from shoal.local.network import namespaces, preflight
from shoal.local.network.links import LinkSpec
from shoal.local.network.namespaces import JobNetwork

pytestmark = [pytest.mark.netns, pytest.mark.skipif(
    bool(preflight.missing(need_tc=True, need_sshd=False)),
    reason="; ".join(preflight.missing(need_tc=True, need_sshd=False)) or "ok")]

SERVER = """
import socket, sys
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", 5999)); s.listen(1); print("listening", flush=True)
import time
c, peer = s.accept(); total = 0; first = None
while True:
    data = c.recv(1 << 20)
    if not data: break
    first = first or time.monotonic()
    total += len(data)
print(peer[0], total, round(time.monotonic() - first, 3), flush=True)
"""
CLIENT = """
import socket, time
s = socket.create_connection(("algo-2", 5999), timeout=30)
s.sendall(b"x" * (20 << 20)); s.close()
print(socket.gethostbyname("algo-2"), flush=True)
"""


def own_links() -> set[str]:
    out = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    return {line.split(":")[1].strip().split("@")[0] for line in out.splitlines()}


def test_two_hosts_reach_each_other_by_name_through_a_shaped_link_and_leave_nothing():
    before = own_links()
    network = JobNetwork(["algo-1", "algo-2"], link=LinkSpec(rate_bits=200 * 10**6), netem=False)
    plan = network.create()
    try:
        address = subprocess.run(["ip", "-n", plan.host("algo-1").namespace, "-4", "-o", "addr",
                                  "show", "eth0"], capture_output=True, text=True).stdout
        assert f"{plan.host('algo-1').address}/24" in address
        server = subprocess.Popen([*network.exec_prefix("algo-2"), sys.executable, "-c", SERVER],
                                  stdout=subprocess.PIPE, text=True)
        assert server.stdout.readline().strip() == "listening"
        client = subprocess.run([*network.exec_prefix("algo-1"), sys.executable, "-c", CLIENT],
                                capture_output=True, text=True, timeout=120)
        assert client.returncode == 0, client.stderr
        resolved = client.stdout.strip()
        # timed where the bytes arrive (a sender's buffers would hide the rate)
        peer, received, seconds = server.communicate(timeout=60)[0].split()
        assert resolved == plan.host("algo-2").address
        assert peer == plan.host("algo-1").address and int(received) == 20 << 20
        assert float(seconds) >= 0.8 * (20 << 20) * 8 / 200e6  # the link's rate held
        assert own_links() == before  # nothing in the machine's own namespace
    finally:
        network.destroy()
    left = [n for n in namespaces.list_namespaces() if namespaces.slot_of(n) == plan.slot]
    assert left == []
    assert not any((namespaces.NETNS_ETC / ns).exists() for ns in plan.namespaces)
    assert not (namespaces.OWNERS / f"{plan.slot}.json").exists()


def test_a_job_killed_outright_is_swept_by_the_next():
    script = ("import subprocess, sys\n"
              "from shoal.local.network.namespaces import JobNetwork\n"
              "n = JobNetwork(['algo-1']); p = n.create()\n"
              "subprocess.Popen([*n.exec_prefix('algo-1'), 'sleep', '600'])  # left inside\n"
              "print(p.slot, flush=True)\n"
              "import time; time.sleep(600)\n")
    owner = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    slot = int(owner.stdout.readline())
    owner.kill()  # SIGKILL: no clean-up of its own
    owner.wait()
    assert f"shoal-net{slot}" in namespaces.list_namespaces()
    deadline = time.monotonic() + 10
    while slot not in namespaces.sweep() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [n for n in namespaces.list_namespaces() if namespaces.slot_of(n) == slot]
    left = subprocess.run(["pgrep", "-f", "^sleep 600$"], capture_output=True, text=True).stdout
    assert left.split() == []  # the process it had left inside went with the namespace
