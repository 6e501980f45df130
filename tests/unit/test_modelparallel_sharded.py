"""Sharded data parallelism's pure parts: where a parameter's elements live (layout.py)
and which ranks shard together (groups.py)."""

from __future__ import annotations

import pytest
import torch
from shoal.modelparallel.errors import SMPConfigError
from shoal.modelparallel.topology import Topology
from shoal.modelparallel.torch.sharded import groups, layout


@pytest.mark.parametrize("numel,parts,chunk", [(10, 4, 3), (8, 4, 2), (1, 4, 1), (0, 2, 0),
                                              (7, 1, 7)])
def test_chunks_cover_the_tensor_with_zero_padding(numel, parts, chunk):
    flat = torch.arange(1, numel + 1, dtype=torch.float32)
    assert layout.chunk_numel(numel, parts) == chunk
    chunks = [layout.chunk_of(flat, parts, r) for r in range(parts)]
    assert all(c.numel() == chunk for c in chunks)
    joined = torch.cat(chunks) if chunks else flat
    assert joined[:numel].equal(flat) and not joined[numel:].any()
    rows = layout.padded_rows(flat, parts)
    assert rows.shape == (parts, chunk) and rows.reshape(-1).equal(joined)
    assert layout.unpad(rows, numel, (numel,)).equal(flat)


def test_chunks_are_new_storage_and_rows_a_view_when_nothing_is_padded():
    flat = torch.arange(8.0)
    chunk = layout.chunk_of(flat, 4, 1)
    chunk.add_(100)
    assert flat[2] == 2  # the chunk is a copy
    assert layout.padded_rows(flat, 4).data_ptr() == flat.data_ptr()


def test_offsets_are_where_scripts_find_each_chunk():
    # SMP's scripts: offset of a parameter in fp32_partitioned_groups_flat[i] is the sum of
    # the ds_numel of the parameters before it in the group.
    assert layout.offsets([3, 0, 5, 2]) == [0, 3, 3, 8]


def _topology(size, tp=1, placement="cluster"):
    return Topology.build(0, size, 0, size, pp=1, tp=tp, placement_strategy=placement)


def test_sharding_groups_are_consecutive_ranks_and_replicas_the_same_position():
    shards, replicas = groups.blocks(_topology(8), 4)
    assert shards == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert replicas == [[0, 4], [1, 5], [2, 6], [3, 7]]


def test_with_tensor_parallelism_sharding_stays_within_a_tp_rank():
    shards, replicas = groups.blocks(_topology(8, tp=2), 2)
    # cluster (DPT): tp varies fastest, so the RDP groups are [0, 2, 4, 6] and [1, 3, 5, 7]
    assert shards == [[0, 2], [4, 6], [1, 3], [5, 7]]
    assert replicas == [[0, 4], [2, 6], [1, 5], [3, 7]]


def test_the_degree_must_fit_and_divide_the_data_parallel_group():
    with pytest.raises(SMPConfigError, match=r"^ZeRO-2D sharding degree \(8\) cannot be larger "
                                             r"than the data parallelism degree \(4\)\.$"):
        groups.check_degree(8, _topology(4))
    with pytest.raises(SMPConfigError, match=r"must evenly divide the data parallelism degree"):
        groups.check_degree(4, _topology(6))
    groups.check_degree(2, _topology(8, tp=2))  # rdp 4
