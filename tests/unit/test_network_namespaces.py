"""A namespaced job's network as data (names, addresses, hosts files, commands), and
``JobNetwork`` over a fake ``ip``: the first free slot, removal whatever happened, and the
sweep of slots whose owner died."""

from __future__ import annotations

import json
import subprocess

import pytest
from shoal.local.network import namespaces
from shoal.local.network.links import LinkSpec
from shoal.local.network.namespaces import JobNetwork, NetworkError, plan


def test_the_plan_names_addresses_and_hosts_file():
    p = plan(["algo-1", "algo-2"], 7)
    assert p.bridge_namespace == "shoal-net7"
    assert [(h.host, h.namespace, h.address, h.veth) for h in p.hosts] == [
        ("algo-1", "shoal-net7-algo-1", "10.213.7.1", "v1"),
        ("algo-2", "shoal-net7-algo-2", "10.213.7.2", "v2")]
    hosts = p.hosts_file(p.host("algo-2"))
    assert "10.213.7.1\talgo-1\n10.213.7.2\talgo-2\n" in hosts
    assert hosts.startswith("127.0.0.1\tlocalhost\n")


def test_setup_puts_eth0_in_each_host_and_the_other_end_on_the_bridge():
    commands = plan(["algo-1", "algo-2"], 3, LinkSpec(rate_bits=10**9)).setup_commands(netem=False)
    assert ["ip", "link", "add", "eth0", "netns", "shoal-net3-algo-2", "type", "veth", "peer",
            "name", "v2", "netns", "shoal-net3"] in commands
    assert ["ip", "-n", "shoal-net3", "link", "set", "v1", "master", "br0"] in commands
    assert ["ip", "-n", "shoal-net3-algo-1", "addr", "add", "10.213.3.1/24", "dev", "eth0"] in commands
    shaped = [c for c in commands if "tbf" in c]
    assert [c[3] for c in shaped] == ["shoal-net3-algo-1", "shoal-net3-algo-2"]
    # nothing is created in the machine's own namespace: every link command names one
    for c in commands:
        if c[:2] == ["ip", "link"]:
            assert "netns" in c


def test_teardown_deletes_every_namespace_hosts_first(tmp_path):
    ip = FakeIp(existing=plan(["algo-1", "algo-2"], 3).namespaces)
    namespaces.remove(3, plan(["algo-1", "algo-2"], 3).namespaces, ip, tmp_path, tmp_path)
    assert [c for c in ip.calls if c[:3] == ["ip", "netns", "delete"]] == [
        ["ip", "netns", "delete", "shoal-net3-algo-2"],
        ["ip", "netns", "delete", "shoal-net3-algo-1"],
        ["ip", "netns", "delete", "shoal-net3"]]


@pytest.mark.parametrize("hosts, slot", [([], 1), (["algo-1"], 0), (["algo-1"], 255)])
def test_impossible_plans_are_refused(hosts, slot):
    with pytest.raises(NetworkError):
        plan(hosts, slot)


class FakeIp:
    """``ip`` with namespaces as a set; ``fail`` makes commands containing it fail."""

    def __init__(self, existing=(), fail=None):
        self.namespaces = set(existing)
        self.fail = fail
        self.calls: list[list[str]] = []

    def __call__(self, argv):
        self.calls.append(argv)
        ok = lambda out="": subprocess.CompletedProcess(argv, 0, out, "")  # noqa: E731
        if self.fail and self.fail in argv:
            return subprocess.CompletedProcess(argv, 2, "", "RTNETLINK answers: nope")
        if argv[:3] == ["ip", "netns", "list"]:
            return ok("".join(f"{n} (id: 0)\n" for n in sorted(self.namespaces)))
        if argv[:3] == ["ip", "netns", "add"]:
            if argv[3] in self.namespaces:
                return subprocess.CompletedProcess(argv, 1, "", "File exists")
            self.namespaces.add(argv[3])
        if argv[:3] == ["ip", "netns", "delete"]:
            self.namespaces.discard(argv[3])
        return ok()


def network(tmp_path, ip, hosts=("algo-1", "algo-2"), **kwargs):
    return JobNetwork(list(hosts), run=ip, owners=tmp_path / "owners",
                      netns_etc=tmp_path / "netns", **kwargs)


def test_create_takes_the_first_free_slot_and_destroy_leaves_nothing(tmp_path):
    ip = FakeIp(existing={"shoal-net1", "other-ns"})
    job = network(tmp_path, ip)
    p = job.create()
    assert p.slot == 2
    assert ip.namespaces == {"shoal-net1", "other-ns", "shoal-net2", "shoal-net2-algo-1",
                             "shoal-net2-algo-2"}
    assert "algo-2" in (tmp_path / "netns" / "shoal-net2-algo-1" / "hosts").read_text()
    owner = json.loads((tmp_path / "owners" / "2.json").read_text())
    assert owner["namespaces"] == p.namespaces
    assert job.exec_prefix("algo-2") == ["ip", "netns", "exec", "shoal-net2-algo-2"]
    job.destroy()
    job.destroy()  # idempotent
    assert ip.namespaces == {"shoal-net1", "other-ns"}
    assert not list((tmp_path / "netns").iterdir())
    assert not (tmp_path / "owners" / "2.json").exists()


def test_a_failure_half_way_removes_what_was_made(tmp_path):
    ip = FakeIp(fail="10.213.1.2/24")
    job = network(tmp_path, ip)
    with pytest.raises(NetworkError, match="RTNETLINK answers: nope"):
        job.create()
    assert ip.namespaces == set()
    assert not (tmp_path / "owners" / "1.json").exists()


def test_the_sweep_removes_slots_whose_owner_is_gone(tmp_path):
    ip = FakeIp()
    live = network(tmp_path, ip)
    live.create()  # owned by this process: kept
    dead = ["shoal-net9", "shoal-net9-algo-1"]
    ip.namespaces.update(dead)
    (tmp_path / "netns" / "shoal-net9-algo-1").mkdir(parents=True)
    (tmp_path / "owners" / "9.json").write_text(json.dumps(
        {"pid": 999_999_999, "create_time": 1.0, "namespaces": dead}))
    assert namespaces.sweep(ip, tmp_path / "owners", tmp_path / "netns") == [9]
    assert ip.namespaces == set(live.plan.namespaces)
    assert not (tmp_path / "netns" / "shoal-net9-algo-1").exists()


def test_slot_of():
    assert namespaces.slot_of("shoal-net12-algo-3") == 12
    assert namespaces.slot_of("shoal-net12") == 12
    assert namespaces.slot_of("docker-ns") is None
