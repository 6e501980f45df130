"""Rank arithmetic: SMP's documented layouts, identities over every placement, group lists."""

from __future__ import annotations

import pytest
from shoal.modelparallel.errors import SMPConfigError
from shoal.modelparallel.topology import (
    DP_GROUP,
    MP_GROUP,
    PP_GROUP,
    RDP_GROUP,
    TP_GROUP,
    WORLD,
    CommGroup,
    RankType,
    Topology,
    placement_order,
)

PLACEMENTS = ["cluster", "spread", "DPT", "DTP", "PDT", "PTD", "TDP", "TPD"]


def world(size, pp, tp=1, placement="cluster", local_size=None):
    local_size = local_size or size
    return [
        Topology.build(r, size, r % local_size, local_size, pp, tp, placement) for r in range(size)
    ]


def layouts():
    """Every (size, pp, tp, placement) with size 1..16 and pp * tp dividing size."""
    for size in range(1, 17):
        for pp in range(1, size + 1):
            for tp in range(1, size // pp + 1):
                if size % (pp * tp) == 0:
                    for placement in PLACEMENTS:
                        yield size, pp, tp, placement


ALL = list(layouts())


# ---------------------------------------------------------------- the enums


def test_enums():
    assert [(g.name, g.value) for g in CommGroup] == [
        ("WORLD", 0), ("PP_GROUP", 1), ("TP_GROUP", 2), ("RDP_GROUP", 3), ("DP_GROUP", 4),
        ("MP_GROUP", 5),
    ]  # fmt: skip
    assert [(r.name, r.value) for r in RankType] == [
        ("WORLD_RANK", 0), ("PP_RANK", 1), ("TP_RANK", 2), ("RDP_RANK", 3), ("DP_RANK", 4),
        ("MP_RANK", 5),
    ]  # fmt: skip
    assert (WORLD, PP_GROUP, TP_GROUP, RDP_GROUP, DP_GROUP, MP_GROUP) == tuple(CommGroup)


# ---------------------------------------------------------------- documented examples


def test_doc_example_spread():
    # 8 processes, 2 partitions: smd_model_parallel_general.rst, "Ranking Basics".
    topo = world(8, 2, placement="spread")
    assert topo[0].all_groups(MP_GROUP) == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert topo[0].all_groups(DP_GROUP) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert [t.mp_rank for t in topo] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert topo[6].dp_rank == 2


def test_doc_example_cluster():
    topo = world(8, 2, placement="cluster")
    assert topo[0].all_groups(MP_GROUP) == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert topo[0].all_groups(DP_GROUP) == [[0, 2, 4, 6], [1, 3, 5, 7]]


@pytest.mark.parametrize("placement,table", [
    ("DPT", [(0, 0, 0), (0, 0, 1), (0, 1, 0), (0, 1, 1), (1, 0, 0), (1, 0, 1), (1, 1, 0),
             (1, 1, 1)]),
    ("PTD", [(0, 0, 0), (1, 0, 0), (0, 0, 1), (1, 0, 1), (0, 1, 0), (1, 1, 0), (0, 1, 1),
             (1, 1, 1)]),
])  # fmt: skip
def test_doc_tensor_parallel_tables(placement, table):
    # (rdp_rank, pp_rank, tp_rank) of ranks 0..7, tp 2, pp 2, rdp 2.
    assert [(t.rdp_rank, t.pp_rank, t.tp_rank) for t in world(8, 2, 2, placement)] == table


def test_dpt_groups_from_smps_description():
    topo = world(8, 2, 2, "DPT")[0]
    assert topo.all_groups(TP_GROUP) == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert topo.all_groups(PP_GROUP) == [[0, 2], [1, 3], [4, 6], [5, 7]]
    assert topo.all_groups(RDP_GROUP) == [[0, 4], [1, 5], [2, 6], [3, 7]]


def test_named_placements():
    assert placement_order("cluster") == "DPT"
    assert placement_order("spread") == "TPD"
    for size, pp, tp, _ in ALL[:40]:
        cluster, dpt = world(size, pp, tp, "cluster"), world(size, pp, tp, "DPT")
        assert [t.all_groups(MP_GROUP) for t in cluster] == [t.all_groups(MP_GROUP) for t in dpt]


# ---------------------------------------------------------------- identities everywhere


@pytest.mark.parametrize("size,pp,tp,placement", ALL)
def test_identities(size, pp, tp, placement):
    order = placement_order(placement)
    seen = set()
    for t in world(size, pp, tp, placement):
        assert (t.pp_size, t.tp_size) == (pp, tp)
        assert t.pp_size * t.dp_size == size
        assert t.pp_size * t.tp_size * t.rdp_size == size
        assert t.mp_size == pp * tp and t.mp_size * t.rdp_size == size
        if order.index("T") < order.index("D"):
            assert t.dp_rank == t.rdp_rank + t.rdp_size * t.tp_rank
        else:
            assert t.dp_rank == t.tp_rank + t.tp_size * t.rdp_rank
        if order.index("T") < order.index("P"):
            assert t.mp_rank == t.pp_rank + t.pp_size * t.tp_rank
        else:
            assert t.mp_rank == t.tp_rank + t.tp_size * t.pp_rank
        if tp == 1:
            assert (t.mp_rank, t.mp_size, t.dp_rank, t.dp_size) == (
                t.pp_rank,
                t.pp_size,
                t.rdp_rank,
                t.rdp_size,
            )
        coords = (t.rdp_rank, t.pp_rank, t.tp_rank)
        assert coords not in seen  # each process has its own place in the grid
        seen.add(coords)


@pytest.mark.parametrize("size,pp,tp,placement", ALL)
def test_groups(size, pp, tp, placement):
    topo = world(size, pp, tp, placement)
    rank_of = {
        WORLD: "rank", PP_GROUP: "pp_rank", TP_GROUP: "tp_rank", RDP_GROUP: "rdp_rank",
        DP_GROUP: "dp_rank", MP_GROUP: "mp_rank",
    }  # fmt: skip
    size_of = {
        WORLD: size, PP_GROUP: pp, TP_GROUP: tp, RDP_GROUP: size // (pp * tp),
        DP_GROUP: size // pp, MP_GROUP: pp * tp,
    }  # fmt: skip
    for kind in CommGroup:
        groups = topo[0].all_groups(kind)
        # The same list on every process, and a partition of the world.
        assert all(t.all_groups(kind) == groups for t in topo)
        assert sorted(r for g in groups for r in g) == list(range(size))
        assert all(len(g) == size_of[kind] for g in groups)
        assert [g[0] for g in groups] == sorted(g[0] for g in groups)
        for t in topo:
            group = t.group_of(kind)
            assert group in groups and t.rank in group
            # Ordered by the rank inside the group.
            assert [getattr(topo[r], rank_of[kind]) for r in group] == list(range(len(group)))
            assert group.index(t.rank) == getattr(t, rank_of[kind]) == t.rank_in(kind)


@pytest.mark.parametrize("size,pp,tp,placement", ALL[::3])
def test_group_properties(size, pp, tp, placement):
    for t in world(size, pp, tp, placement):
        assert t.world == list(range(size)) == t.group_of(WORLD)
        assert t.pp_group == t.group_of(PP_GROUP)
        assert t.tp_group == t.group_of(TP_GROUP)
        assert t.rdp_group == t.group_of(RDP_GROUP)
        assert t.dp_group == t.group_of(DP_GROUP)
        assert t.mp_group == t.group_of(MP_GROUP)


@pytest.mark.parametrize("size,pp,tp,placement", ALL[::2])
def test_to_global_round_trips(size, pp, tp, placement):
    topo = world(size, pp, tp, placement)
    rank_of = ["rank", "pp_rank", "tp_rank", "rdp_rank", "dp_rank", "mp_rank"]
    for t in topo:
        for rank_type in RankType:
            group = t.group_of(CommGroup(rank_type.value))
            for i, member in enumerate(group):
                assert t.to_global(rank_type, i) == member
                assert getattr(topo[member], rank_of[rank_type.value]) == i
            assert t.to_global(rank_type, getattr(t, rank_of[rank_type.value])) == t.rank


def test_to_global_out_of_range():
    t = world(4, 2)[0]
    with pytest.raises(ValueError, match="PP_RANK 2 is out of range"):
        t.to_global(RankType.PP_RANK, 2)
    with pytest.raises(ValueError):
        t.to_global(RankType.PP_RANK, -1)


def test_groups_are_fresh_lists():
    t = world(4, 2)[0]
    t.pp_group.append(99)
    assert t.pp_group == [0, 1]


def test_local_ranks_are_kept():
    t = Topology.build(5, 8, 1, 4, 2)
    assert (t.rank, t.size, t.local_rank, t.local_size) == (5, 8, 1, 4)


def test_ints_work_as_groups():
    t = world(8, 2)[3]
    assert t.group_of(5) == t.mp_group and t.all_groups(1) == t.all_groups(PP_GROUP)


# ---------------------------------------------------------------- refusals


@pytest.mark.parametrize("placement", ["", "DPP", "dpt", "CLUSTER", "DP", "DPTX"])
def test_invalid_placements(placement):
    with pytest.raises(SMPConfigError, match="placement_strategy must be one of"):
        Topology.build(0, 4, 0, 4, 2, placement_strategy=placement)


@pytest.mark.parametrize("size,pp,tp", [(3, 2, 1), (4, 3, 1), (8, 2, 3), (2, 4, 1)])
def test_sizes_not_divisible(size, pp, tp):
    with pytest.raises(SMPConfigError) as info:
        Topology.build(0, size, 0, size, pp, tp)
    assert str(info.value) == (
        f"The number of processes ({size}) must be divisible by pipeline_parallel_degree "
        f"({pp}) * tensor_parallel_degree ({tp}) = {pp * tp}."
    )


@pytest.mark.parametrize("args", [
    (4, 4, 0, 4, 1), (-1, 4, 0, 4, 1), (0, 0, 0, 1, 1), (0, 4, 4, 4, 1), (0, 4, 0, 0, 1),
    (0, 4, 0, 4, 0),
])  # fmt: skip
def test_invalid_counts(args):
    with pytest.raises(SMPConfigError):
        Topology.build(*args)
