"""The sharding groups of sharded data parallelism and their communicators.

Each reduced-data-parallel group (the ranks holding the same tensor-parallel shard of the
model, in ``rdp_rank`` order) is cut into blocks of ``sharded_data_parallel_degree``
consecutive ranks: consecutive ranks share a host under the default placement, so the
gathers of every layer stay inside a host as long as a group fits in one (MiCS's point).
The ranks at the same position of every block of an RDP group are replicas of each other;
their gradient shards are averaged at the step's end.

A sharding group has four core communicators, each used by one thread only: one for the
gathers the forward and backward make themselves, one for the gathers run ahead
(params.py's prefetching thread), one for the reduce-scatters of the gradients (which run
on a thread of their own while the backward goes on) and one for whatever else needs the
group (norms, the gathers of a step's end, state dicts). Every rank creates every
group, in the same order, at ``smp.init``.
"""

from __future__ import annotations

from typing import Any

import attrs
from shoal.dataparallel import core
from shoal.modelparallel.errors import SMPConfigError
from shoal.modelparallel.topology import CommGroup, Topology

SOLO = None  # a one-rank group: every collective on it is trivial


@attrs.frozen
class ShardGroups:
    """This rank's sharding group, its replica group and their communicators."""

    degree: int
    rank: int  # inside the sharding group
    members: tuple[int, ...]  # global ranks of the sharding group, by shard rank
    replicas: tuple[int, ...]  # global ranks holding the same shard, by replica index
    gather: Any  # core communicators over ``members``
    prefetch: Any
    reduce: Any
    control: Any
    replica: Any  # over ``replicas``; SOLO when there is one replica
    torch_group: Any = None  # ``optimizer.ds_param_shard_group`` (ddp's torch groups)

    @property
    def replica_count(self) -> int:
        return len(self.replicas)


def check_degree(degree: int, topology: Topology) -> None:
    """SMP's check, and the one its documentation states (the degree divides the group)."""
    dp = topology.rdp_size
    if degree > dp:
        raise SMPConfigError(
            f"ZeRO-2D sharding degree ({degree}) cannot be larger than the data parallelism "
            f"degree ({dp}).")
    if dp % degree:
        raise SMPConfigError(
            f"sharded_data_parallel_degree ({degree}) must evenly divide the data parallelism "
            f"degree ({dp}).")


def blocks(topology: Topology, degree: int) -> tuple[list[list[int]], list[list[int]]]:
    """Every sharding group and every replica group of the world, in one order."""
    shards, replicas = [], []
    for rdp in topology.all_groups(CommGroup.RDP_GROUP):
        cut = [rdp[i:i + degree] for i in range(0, len(rdp), degree)]
        shards += cut
        replicas += [rdp[j::degree] for j in range(degree)]
    return shards, replicas


def build(topology: Topology, degree: int, with_torch: bool) -> ShardGroups:
    """Creates every group's communicators (a collective call: every rank, same order)."""
    check_degree(degree, topology)
    shards, replicas = blocks(topology, degree)
    made: dict[str, Any] = {}
    for members in shards:
        comms = [core.new_group(members) for _ in range(4)]
        if topology.rank in members:
            made["members"] = tuple(members)
            made["gather"], made["prefetch"], made["reduce"], made["control"] = comms
    made["replica"], made["replicas"] = SOLO, (topology.rank,)
    for members in replicas:
        if len(members) > 1:
            comm = core.new_group(members)
            if topology.rank in members:
                made["replica"], made["replicas"] = comm, tuple(members)
        elif topology.rank in members:
            made["replicas"] = tuple(members)
    if with_torch:
        made["torch_group"] = _torch_groups(topology, shards)
    return ShardGroups(degree=degree, rank=made["members"].index(topology.rank), **made)


def _torch_groups(topology: Topology, shards: list[list[int]]):
    import torch.distributed as dist

    mine = None
    for members in shards:
        group = dist.new_group(list(members), backend="shoal")
        if topology.rank in members:
            mine = group
    return mine
