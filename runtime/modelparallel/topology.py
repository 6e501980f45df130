"""Rank arithmetic of the model-parallel runtime: every rank and group SMP exposes.

Pure arithmetic, no communication. The world of ``size`` processes is a grid of three
axes: D (reduced data parallelism, ``rdp``), P (pipeline, ``pp``) and T (tensor
parallelism, ``tp``). A placement strategy orders the axes; the right-most letter varies
fastest along the global rank ("cluster" is "DPT", "spread" is "TPD"). So with 8
processes and 2 pipeline stages, "cluster" puts a model replica on neighbours
(mp groups [0, 1], [2, 3], ...) and "spread" as far apart as possible ([0, 4], [1, 5], ...).

Two combined groups exist besides the axes: the data-parallel group (processes holding
the same pipeline stage: the D and T axes) and the model-parallel group (processes
holding one replica: the P and T axes). The rank inside a combined group puts the axis
that varies faster along the global rank first.

Groups are lists of global ranks ordered by the rank inside the group. ``all_groups``
lists every group of a kind in one fixed order, so that every process can create
sub-communicators collectively in the same sequence.
"""

from __future__ import annotations

import enum

import attrs
from shoal.modelparallel.errors import SMPConfigError
from shoal.modelparallel.parameters import PLACEMENT_ORDERS, TENSOR_PLACEMENTS


class CommGroup(enum.IntEnum):
    """The groups SMP's collectives take (``smp.CommGroup``)."""

    WORLD = 0
    PP_GROUP = 1
    TP_GROUP = 2
    RDP_GROUP = 3
    DP_GROUP = 4
    MP_GROUP = 5


class RankType(enum.IntEnum):
    """Which rank ``smp.send``/``smp.recv_from`` address (``smp.RankType``).

    Each matches the ``CommGroup`` of the same value.
    """

    WORLD_RANK = 0
    PP_RANK = 1
    TP_RANK = 2
    RDP_RANK = 3
    DP_RANK = 4
    MP_RANK = 5


# SMP also exports the groups at module level (``smp.DP_GROUP``).
WORLD = CommGroup.WORLD
PP_GROUP = CommGroup.PP_GROUP
TP_GROUP = CommGroup.TP_GROUP
RDP_GROUP = CommGroup.RDP_GROUP
DP_GROUP = CommGroup.DP_GROUP
MP_GROUP = CommGroup.MP_GROUP

# The axes each group spans, the faster-varying-first order decided per placement.
_AXES = {
    CommGroup.WORLD: "DPT",
    CommGroup.PP_GROUP: "P",
    CommGroup.TP_GROUP: "T",
    CommGroup.RDP_GROUP: "D",
    CommGroup.DP_GROUP: "DT",
    CommGroup.MP_GROUP: "PT",
}


def placement_order(strategy: str) -> str:
    """The axis letters of ``strategy``, slowest first ("cluster" -> "DPT")."""
    order = PLACEMENT_ORDERS.get(strategy, strategy)
    if order not in TENSOR_PLACEMENTS:
        choices = [*PLACEMENT_ORDERS, *TENSOR_PLACEMENTS]
        raise SMPConfigError(
            f"Config parameter placement_strategy must be one of {choices}. Found: {strategy}."
        )
    return order


@attrs.frozen
class Topology:
    """This process's place in the grid, and every group of the world."""

    rank: int
    size: int
    local_rank: int
    local_size: int
    pp_size: int
    tp_size: int
    placement: str  # the axis letters, slowest first

    @classmethod
    def build(
        cls,
        rank: int,
        size: int,
        local_rank: int,
        local_size: int,
        pp: int,
        tp: int = 1,
        placement_strategy: str = "cluster",
    ) -> Topology:
        """The topology of process ``rank`` of ``size``; raises SMPConfigError if it cannot be."""
        order = placement_order(placement_strategy)
        _check_counts(rank, size, local_rank, local_size, pp, tp)
        return cls(rank, size, local_rank, local_size, pp, tp, order)

    # ------------------------------------------------------------------ sizes

    @property
    def rdp_size(self) -> int:
        return self.size // (self.pp_size * self.tp_size)

    @property
    def dp_size(self) -> int:
        return self.rdp_size * self.tp_size

    @property
    def mp_size(self) -> int:
        return self.pp_size * self.tp_size

    # ------------------------------------------------------------------ ranks

    @property
    def pp_rank(self) -> int:
        return self._coords(self.rank)["P"]

    @property
    def tp_rank(self) -> int:
        return self._coords(self.rank)["T"]

    @property
    def rdp_rank(self) -> int:
        return self._coords(self.rank)["D"]

    @property
    def dp_rank(self) -> int:
        return self.rank_in(CommGroup.DP_GROUP)

    @property
    def mp_rank(self) -> int:
        return self.rank_in(CommGroup.MP_GROUP)

    def rank_in(self, group: CommGroup) -> int:
        """This process's rank inside its group of kind ``group``."""
        return self._rank_in(self.rank, CommGroup(group))

    # ------------------------------------------------------------------ groups

    @property
    def world(self) -> list[int]:
        return list(range(self.size))

    @property
    def pp_group(self) -> list[int]:
        return self.group_of(CommGroup.PP_GROUP)

    @property
    def tp_group(self) -> list[int]:
        return self.group_of(CommGroup.TP_GROUP)

    @property
    def rdp_group(self) -> list[int]:
        return self.group_of(CommGroup.RDP_GROUP)

    @property
    def dp_group(self) -> list[int]:
        return self.group_of(CommGroup.DP_GROUP)

    @property
    def mp_group(self) -> list[int]:
        return self.group_of(CommGroup.MP_GROUP)

    def group_of(self, comm_group: CommGroup) -> list[int]:
        """The global ranks of this process's group of that kind, by rank inside it."""
        return self._group_containing(self.rank, CommGroup(comm_group))

    def all_groups(self, kind: CommGroup) -> list[list[int]]:
        """Every group of kind ``kind``, ordered by its lowest global rank.

        The order is the same on every process, for creating sub-communicators together.
        """
        kind = CommGroup(kind)
        groups, seen = [], set()
        for rank in range(self.size):
            if rank not in seen:
                group = self._group_containing(rank, kind)
                seen.update(group)
                groups.append(group)
        return groups

    def to_global(self, rank_type: RankType, rank_in_group: int) -> int:
        """The global rank of the member of this process's ``rank_type`` group with that rank."""
        group = self.group_of(CommGroup(int(RankType(rank_type))))
        if not 0 <= rank_in_group < len(group):
            raise ValueError(
                f"{RankType(rank_type).name} {rank_in_group} is out of range: the group has "
                f"{len(group)} members"
            )
        return group[rank_in_group]

    # ------------------------------------------------------------------ arithmetic

    def _sizes(self) -> dict[str, int]:
        return {"D": self.rdp_size, "P": self.pp_size, "T": self.tp_size}

    def _coords(self, rank: int) -> dict[str, int]:
        """The axis coordinates of global ``rank``: the right-most letter varies fastest."""
        sizes, coords = self._sizes(), {}
        for letter in reversed(self.placement):
            rank, coords[letter] = divmod(rank, sizes[letter])
        return coords

    def _global(self, coords: dict[str, int]) -> int:
        sizes, rank = self._sizes(), 0
        for letter in self.placement:
            rank = rank * sizes[letter] + coords[letter]
        return rank

    def _spanned(self, kind: CommGroup) -> str:
        """The axes ``kind`` spans, the one varying faster along the global rank first."""
        return "".join(a for a in reversed(self.placement) if a in _AXES[kind])

    def _rank_in(self, rank: int, kind: CommGroup) -> int:
        # Mixed radix over the spanned axes, the faster-varying axis as the low digit:
        # dp_rank = rdp_rank + rdp_size * tp_rank when T is left of D, and so on.
        coords, sizes, result, scale = self._coords(rank), self._sizes(), 0, 1
        for letter in self._spanned(kind):
            result += coords[letter] * scale
            scale *= sizes[letter]
        return result

    def _group_containing(self, rank: int, kind: CommGroup) -> list[int]:
        spanned, sizes = self._spanned(kind), self._sizes()
        members = [dict(self._coords(rank))]
        for letter in spanned:  # enumerate the spanned axes, fastest first
            members = [{**m, letter: i} for i in range(sizes[letter]) for m in members]
        return [self._global(m) for m in members]


def _check_counts(rank: int, size: int, local_rank: int, local_size: int, pp: int, tp: int) -> None:
    if size < 1 or not 0 <= rank < size:
        raise SMPConfigError(f"Invalid rank {rank} of {size} processes.")
    if local_size < 1 or not 0 <= local_rank < local_size:
        raise SMPConfigError(f"Invalid local rank {local_rank} of {local_size} processes.")
    if pp < 1 or tp < 1:
        raise SMPConfigError(
            f"pipeline_parallel_degree ({pp}) and tensor_parallel_degree ({tp}) must be >= 1."
        )
    check_divisible(size, pp, tp)


def check_divisible(size: int, pp: int, tp: int) -> None:
    """Raise SMPConfigError unless ``pp * tp`` processes divide the world of ``size``."""
    if size % (pp * tp):
        raise SMPConfigError(
            f"The number of processes ({size}) must be divisible by pipeline_parallel_degree "
            f"({pp}) * tensor_parallel_degree ({tp}) = {pp * tp}."
        )
