"""The process's model-parallel state (``smp.state``): configuration, topology, groups.

``smp.init`` reads the configuration once (config.py), bootstraps the collective core from
the rank environment mpirun gives, works out every rank (topology.py) and creates one core
sub-communicator per distinct group of ranks (the pipeline's carries its transfers). With
``ddp: True`` it also starts torch.distributed on Shoal's backend and makes the same groups
as torch process groups, which scripts reach through ``smp.get_dp_process_group()`` & co.
"""

from __future__ import annotations

import atexit
import logging
import os
import warnings
from typing import Any

import attrs
from shoal.dataparallel import core
from shoal.modelparallel import config as _config
from shoal.modelparallel.errors import DDPNotEnabledError, SMPNotInitializedError
from shoal.modelparallel.topology import CommGroup, Topology

log = logging.getLogger("shoal.modelparallel")

# Every kind of group a script can name, with the topology's member lists.
_KINDS = (CommGroup.PP_GROUP, CommGroup.TP_GROUP, CommGroup.RDP_GROUP, CommGroup.DP_GROUP,
          CommGroup.MP_GROUP)


@attrs.define
class State:
    cfg: _config.Config
    topology: Topology
    groups: dict[tuple[int, ...], Any]  # members -> core Group (None where not a member)
    torch_groups: dict[tuple[int, ...], Any] = attrs.field(factory=dict)
    engine: Any = None
    model: Any = None
    optimizer: Any = None
    tracing: bool = False  # the first microbatch runs whole on world rank 0 to partition
    tp_p2p: Any = None  # the TP group's communicator for tagged exchanges (tp and pp > 1)
    shard_groups: Any = None  # sharded data parallelism's groups (sharded/groups.py)
    # SHOAL_ACTIVATION_CHECKPOINTING, parsed (activations.Planned; None: off)
    planned_checkpointing: Any = None

    def members(self, group: CommGroup) -> tuple[int, ...]:
        return tuple(self.topology.group_of(group))

    def core_group(self, group: CommGroup):
        """The core communicator of this rank's group of that kind (None: the world)."""
        members = self.members(group)
        if len(members) == self.topology.size:
            return None
        return self.groups[members]

    def torch_group(self, group: CommGroup):
        if not self.cfg.ddp:
            raise DDPNotEnabledError()
        import torch.distributed as dist

        members = self.members(group)
        return dist.group.WORLD if len(members) == self.topology.size else self.torch_groups[members]


_state: State | None = None


def __getattr__(name: str):
    """``smp.state.cfg`` and the like (read by HF transformers) from the running state."""
    if name in attrs.fields_dict(State):
        return getattr(require(), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def current() -> State | None:
    return _state


def require() -> State:
    if _state is None:
        raise SMPNotInitializedError()
    return _state


def init(config: dict | None = None) -> State:
    """Starts the runtime (idempotent: a second call warns and keeps the first state)."""
    global _state
    if _state is not None:
        if config:
            warnings.warn("smp.init() was already called (smdistributed.modelparallel.torch "
                          "initializes itself under mpirun when SM_HP_MP_PARAMETERS is set; "
                          "set SMP_MANUAL_INIT=1 to pass a config dict); this call's config "
                          "is ignored", UserWarning, stacklevel=2)
        return _state
    cfg = _config.resolve(config, os.environ)
    from shoal.modelparallel.torch.activations import PLANNED_VARIABLE, parse_planned

    planned = parse_planned(os.environ.get(PLANNED_VARIABLE))
    if cfg.ddp:  # torch's world first: it takes the core's world communicator
        from shoal.dataparallel.torch.distributed import init_process_group

        init_process_group(backend="shoal")
    world = core.init()
    _config.validate_world(cfg, world.size, world.local_size)
    topology = Topology.build(world.rank, world.size, world.local_rank, world.local_size,
                              pp=cfg.pipeline_parallel_degree, tp=cfg.tensor_parallel_degree,
                              placement_strategy=cfg.placement_strategy)
    state = State(cfg, topology, _core_groups(topology), planned_checkpointing=planned)
    if topology.tp_size > 1 and topology.pp_size > 1:
        state.tp_p2p = _tagged_tp_group(topology)
    if cfg.ddp:
        state.torch_groups = _torch_groups(topology)
    if cfg.sharded_data_parallel_degree > 1:
        from shoal.modelparallel.torch.sharded import groups as _shard_groups

        state.shard_groups = _shard_groups.build(
            topology, cfg.sharded_data_parallel_degree, with_torch=cfg.ddp)
    from shoal.modelparallel.torch.pipeline import Engine
    from shoal.modelparallel.torch.timeline import from_environment

    state.engine = Engine(topology.pp_rank, topology.pp_size, _transport_group(topology),
                          cfg.pipeline, reply_timeout=_collective_timeout(),
                          timeline=from_environment(topology.rank))
    _state = state
    atexit.register(shutdown)
    log.info("smp initialized: rank %d of %d, pp_rank %d/%d, dp_rank %d/%d, %d microbatches, "
             "%s pipeline", topology.rank, topology.size, topology.pp_rank, topology.pp_size,
             topology.dp_rank, topology.dp_size, cfg.microbatches, cfg.pipeline)
    return state


def _collective_timeout() -> float:
    return float(os.environ.get("SHOAL_COLLECTIVE_TIMEOUT", "300"))


def _transport_group(topology: Topology):
    """The pipeline's own communicator over each pipeline's ranks (every rank joins every
    pipeline's creation). Its receives wait as long as a rank is idle between requests (a
    follower may wait out the leader's evaluation or data loading), so it is made without
    the core's time-out; a peer that dies still fails it at once, and a reply that does
    not come in time is the engine's own time-out."""
    previous = os.environ.get("SHOAL_COLLECTIVE_TIMEOUT")
    os.environ["SHOAL_COLLECTIVE_TIMEOUT"] = "86400"
    try:
        mine = None
        for members in topology.all_groups(CommGroup.PP_GROUP):
            if len(members) > 1:
                made = core.new_group(members)
                mine = made if made is not None else mine
        return mine
    finally:
        if previous is None:
            os.environ.pop("SHOAL_COLLECTIVE_TIMEOUT", None)
        else:
            os.environ["SHOAL_COLLECTIVE_TIMEOUT"] = previous


def _tagged_tp_group(topology: Topology):
    """A second communicator over each TP group, for the tagged exchanges of TP modules
    inside pipeline tasks (collectives.py), apart from the TP group's collectives."""
    mine = None
    for members in topology.all_groups(CommGroup.TP_GROUP):
        made = core.new_group(members)
        mine = made if made is not None else mine
    return mine


def _distinct_groups(topology: Topology) -> list[tuple[int, ...]]:
    """Every distinct member list of every kind, in one order on every rank."""
    seen: dict[tuple[int, ...], None] = {}
    for kind in _KINDS:
        for members in topology.all_groups(kind):
            if 1 < len(members) < topology.size:
                seen.setdefault(tuple(members), None)
    return list(seen)


def _core_groups(topology: Topology) -> dict[tuple[int, ...], Any]:
    """A core communicator per distinct group; a one-rank group needs none (SOLO)."""
    groups: dict[tuple[int, ...], Any] = {(topology.rank,): SOLO}
    for members in _distinct_groups(topology):
        groups[members] = core.new_group(members)
    return groups


SOLO = object()  # this rank alone: every collective on it is trivial


def _torch_groups(topology: Topology) -> dict[tuple[int, ...], Any]:
    """The same groups as torch process groups; one-rank ones too (every rank creates
    every group, in one order, as torch's new_group asks)."""
    import torch.distributed as dist

    groups: dict[tuple[int, ...], Any] = {}
    lists = list(_distinct_groups(topology))
    lists += [(r,) for r in range(topology.size)]
    for members in lists:
        made = dist.new_group(list(members), backend="shoal")
        if topology.rank in members:
            groups[members] = made
    return groups


def shutdown() -> None:
    """Ends the pipeline's receiving thread (at exit, this rank alone: after an error its
    peers may still be busy, and it must not wait for them)."""
    global _state
    state, _state = _state, None
    if state is not None and state.engine is not None:
        try:
            state.engine.close()
        except Exception as exc:  # noqa: BLE001 - at exit, a peer may already be gone
            log.debug("closing the pipeline: %s", exc)
