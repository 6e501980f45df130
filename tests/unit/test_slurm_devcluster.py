"""The local Slurm cluster's plan (pure): its slurm.conf, names, addresses and commands."""

from __future__ import annotations

import pytest
from shoal.slurm import devcluster


def test_the_plan_names_nodes_gives_addresses_and_per_node_paths():
    plan = devcluster.plan(3, controller="vm")
    assert [n.name for n in plan.nodes] == ["node1", "node2", "node3"]
    assert [n.address for n in plan.nodes] == ["10.215.0.11", "10.215.0.12", "10.215.0.13"]
    conf = plan.slurm_conf()
    assert conf.startswith(devcluster.MARKER)
    assert "SlurmctldHost=vm(10.215.0.1)" in conf
    for key in ("SlurmdSpoolDir", "SlurmdPidFile", "SlurmdLogFile"):
        line = next(x for x in conf.splitlines() if x.startswith(key + "="))
        assert "%n" in line  # the nodes share this machine's files
    assert "ProctrackType=proctrack/linuxproc" in conf and "TaskPlugin=task/none" in conf
    assert "NodeName=node2 NodeAddr=10.215.0.12 " in conf
    assert "PartitionName=shoal Nodes=node1,node2,node3 Default=YES" in conf
    assert "10.215.0.1\tvm" in plan.hosts_file() and "10.215.0.13\tnode3" in plan.hosts_file()


def test_slurmd_runs_as_its_node_in_the_nodes_network_without_remounting_sys():
    node = devcluster.plan(2, controller="vm").nodes[1]
    argv = devcluster.plan(2, controller="vm").slurmd_argv(node)
    assert argv[:2] == ["nsenter", "--net=/run/netns/shoal-slurm-node2"]
    assert "hostname node2" in argv[-1] and "/etc/netns/shoal-slurm-node2/hosts" in argv[-1]
    assert "ip" not in argv  # `ip netns exec` mounts a new /sys, hiding the cgroup tree


def test_node_counts_are_bounded():
    with pytest.raises(devcluster.ClusterError, match=r"'nodes' must be in 1..200 \(got 0\)"):
        devcluster.plan(0)
