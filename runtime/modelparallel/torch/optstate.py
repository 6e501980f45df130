"""Optimizer-state sharding: SMP's ``shard_optimizer_state`` (ZeRO stage 1).

The data-parallel replicas of a parameter hold the same value, so its optimizer state
(Adam's moments, SGD's momentum) and, with fp16/bf16, its float32 master copy need to live
on one of them only. Each parameter of this rank's pipeline stage gets one owner in the
group that reduces its gradient: the data-parallel group, or, for tensor parallelism's
scaled-batch parameters, the reduced-data-parallel group (the replicas that hold that same
shard). At the end of the step each gradient is averaged onto its owner only (gradsync.py:
one reduce per bucket, the buckets made per owner) and the other members drop theirs; the
owner alone steps the parameter, and ``optimizer.step()`` ends with one allgather per group
that brings every replica the updated values.

The partitioning is by whole parameter, the largest first to the least loaded member (ties
to the lowest rank), rather than ZeRO-1's contiguous ranges of one flat buffer. The user's
optimizer then steps the user's own parameter objects, so every torch optimizer keeps its
exact numerics, those whose update depends on the whole tensor included (LAMB's and LARS's
trust ratios, Adafactor's factored moments); ``param_groups``, LR schedulers and torch's
per-parameter state-dict layout are unchanged. The price is a balance per tensor: a rank's
share is at most ``total / dp`` plus the largest tensor, so a model dominated by one tensor
larger than ``total / dp`` saves less than ``1 / dp``.
"""

from __future__ import annotations

from typing import Any

import attrs
import torch
from shoal.dataparallel import core
from shoal.modelparallel.errors import SMPConfigError, SMPUsageError
from shoal.modelparallel.topology import CommGroup
from shoal.modelparallel.torch import state as _state

_BUCKET_VIEW = "gradient_as_bucket_view must be True when shard_optimizer_state is True."
LOCAL_ONLY = ("Since shard_optimizer_state is enabled, only returning local state_dict from "
              "state_dict() call on smp.DistributedOptimizer.")


def assign(sizes: list[int], parts: int) -> list[int]:
    """The owner (0 .. parts-1) of each tensor of ``sizes``: the largest first, each to the
    least loaded part, ties to the lower index; the same on every rank."""
    loads = [0] * parts
    owners = [0] * len(sizes)
    for i in sorted(range(len(sizes)), key=lambda i: (-sizes[i], i)):
        part = min(range(parts), key=lambda r: (loads[r], r))
        owners[i] = part
        loads[part] += sizes[i]
    return owners


def check_model(cfg, gradient_as_bucket_view: bool) -> None:
    """SMP's conditions on ``smp.DistributedModel`` when ``shard_optimizer_state`` is set."""
    if not cfg.shard_optimizer_state:
        return
    if not cfg.ddp:
        raise SMPConfigError("Setting config parameter shard_optimizer_state to non-default "
                             "value True requires ddp to be set to True. Found: False")
    if not gradient_as_bucket_view:
        raise SMPUsageError(_BUCKET_VIEW)


def check_dtypes(params) -> None:
    """One dtype for every parameter: SMP's condition on sharding the optimizer state."""
    found = sorted({str(p.dtype) for p in params})
    if len(found) > 1:
        raise SMPUsageError("Currently shard_optimizer_state is supported only when all "
                            "parameters in the model have the same dtype. Found "
                            f"{', '.join(found)}.")


@attrs.define
class _Group:
    """The parameters one group reduces, with each one's owner (a rank in the group)."""

    kind: CommGroup
    core: Any  # the core communicator (None: the world)
    size: int
    me: int
    params: list[torch.Tensor]
    owners: list[int]

    def owned_by(self, member: int) -> list[torch.Tensor]:
        return [p for p, o in zip(self.params, self.owners) if o == member]


class Sharding:
    """Who steps which parameter of this stage; made when the model is partitioned."""

    def __init__(self) -> None:
        self.groups: list[_Group] = []
        self._owner: dict[int, tuple[_Group, int]] = {}
        self._place: dict[int, tuple[CommGroup, int]] = {}  # id -> (group kind, index in it)

    def setup(self, model) -> None:
        """Assigns the owners and makes the model's gradient syncs reduce to them."""
        st = _state.require()
        params = [p for p in model.local_parameters() if p.requires_grad]
        for kind, members in model._by_reducer(params).items():
            if not members:
                continue
            size = len(st.members(kind))
            owners = assign([p.numel() for p in members], size)
            group = _Group(kind, st.core_group(kind), size, st.topology.rank_in(kind),
                           members, owners)
            self.groups.append(group)
            self._owner.update({id(p): (group, o) for p, o in zip(members, owners)})
            self._place.update({id(p): (kind, j) for j, p in enumerate(members)})
        for sync in (s for s in model._grad_syncs if s.params):
            sync.shard([self._owner[id(p)][1] for p in sync.params],
                       self._owner[id(sync.params[0])][0].me)

    def owns(self, param: torch.Tensor) -> bool:
        """Whether this rank steps ``param`` (those without a gradient: every rank)."""
        if id(param) not in self._owner:
            return True
        group, owner = self._owner[id(param)]
        return owner == group.me

    def gather(self) -> None:
        """Every replica gets the parameters their owners just stepped (one allgather of
        the owned parameters' bytes per group)."""
        for group in self.groups:
            if group.size > 1:
                _allgather_owned(group)

    def drop_unowned(self, optimizer_state: dict) -> None:
        """Forgets the state of parameters other replicas own (after loading a whole one)."""
        for param in list(optimizer_state):
            if not self.owns(param):
                del optimizer_state[param]

    def gather_state(self, state: dict[int, Any], masters: list | None, params: list):
        """The stage's whole optimizer state from the replicas' shards. ``state`` is by
        index in ``params``, ``masters`` None or a list by the same index; the replicas'
        entries travel under their parameter's place in its group (tensor-parallel ranks
        hold different parameter lists), the scaled-batch ones from the same tp_rank."""
        from shoal.modelparallel.torch import comm

        st = _state.require()
        places = [self._place.get(id(p)) for p in params]
        mine = {places[i]: (state.get(i), None if masters is None else masters[i])
                for i in range(len(params)) if places[i] is not None
                and (i in state or (masters is not None and masters[i] is not None))}
        tp_rank = st.topology.tp_rank
        merged, whole = dict(state), (list(masters) if masters is not None else None)
        for peer_tp, part in comm.allgather((tp_rank, mine), CommGroup.DP_GROUP):
            for i, place in enumerate(places):
                if place is None or place not in part:
                    continue
                if place[0] is CommGroup.RDP_GROUP and peer_tp != tp_rank:
                    continue
                entry, master = part[place]
                if entry is not None:
                    merged.setdefault(i, entry)
                if whole is not None and whole[i] is None:
                    whole[i] = master
        return dict(sorted(merged.items())), whole

    def counts_in_norm(self, param: torch.Tensor) -> bool:
        """Whether this rank's copy of ``param``'s gradient enters the global norm: its
        owner's, and for a shard replicated over the TP group, tp_rank 0's only."""
        model = _state.require().model
        replicated_in_tp = (model.is_scaled_batch_parameter(param)
                            and not model.is_distributed_parameter(param))
        return self.owns(param) and (not replicated_in_tp or _state.require().topology.tp_rank == 0)


def _allgather_owned(group: _Group) -> None:
    widths = [sum(_nbytes(p) for p in group.owned_by(r)) for r in range(group.size)]
    width = max(widths)
    if not width:
        return
    # this rank's row is filled in place (the gather needs no copy of its share); the
    # others' rows arrive whole, so only this row's padding is zeroed
    rows = torch.empty(group.size, width, dtype=torch.uint8)
    offset = 0
    for param in group.owned_by(group.me):
        n = _nbytes(param)
        rows[group.me, offset:offset + n] = param.detach().reshape(-1).view(torch.uint8)
        offset += n
    rows[group.me, offset:].zero_()
    gathered = rows.numpy()
    core.allgather(gathered[group.me], group=group.core, out=gathered)
    with torch.no_grad():
        for member in range(group.size):
            if member == group.me:
                continue
            offset = 0
            for param in group.owned_by(member):
                n = _nbytes(param)
                param.copy_(rows[member, offset:offset + n].view(param.dtype).view_as(param))
                offset += n


def _nbytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


def install(st: _state.State) -> Sharding | None:
    """With ``shard_optimizer_state``: checks the model and returns the sharding, set up
    when the model is partitioned (before any hook registered after this call)."""
    if not st.cfg.shard_optimizer_state:
        return None
    check_dtypes(list(st.model.parameters()))
    sharding = Sharding()
    st.model.register_post_partition_hook(lambda model, _o: sharding.setup(model))
    return sharding


def state_bytes(optimizer) -> int:
    """The bytes of the tensors this rank's optimizer holds: its state and, with fp16/bf16,
    the float32 masters."""
    inner = getattr(optimizer, "optimizer", optimizer)
    total = sum(_nbytes(t) for entry in inner.state.values() for t in entry.values()
                if isinstance(t, torch.Tensor))
    for _, master in getattr(optimizer, "_pairs", []):
        total += _nbytes(master)
    return total
