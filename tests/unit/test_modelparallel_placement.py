"""Module placement: manual contexts and set_partition, tied parameters, auto-partition."""

import pytest
import torch
from shoal.modelparallel.errors import SMPPartitionError
from shoal.modelparallel.torch import placement as P
from torch import nn


class Tied(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(10, 4)
        self.body = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))
        self.head = nn.Linear(4, 10, bias=False)
        self.head.weight = self.embed.weight


def test_modules_created_inside_partition_go_there_innermost_wins():
    with P.partition(1):
        outer = nn.Linear(2, 2)
        with P.partition(2):
            inner = nn.Linear(2, 2)
        after = nn.Linear(2, 2)
    free = nn.Linear(2, 2)
    root = nn.Sequential(outer, inner, after, free)
    owners = P.manual_assignment(root, pp=3, default=0)
    assert owners == {"": 0, "0": 1, "1": 2, "2": 1, "3": 0}
    assert nn.Module.__init__ is P._original_init  # the recording hook is gone afterwards


def test_set_partition_places_a_module_and_its_children():
    root = nn.Sequential(nn.Linear(2, 2), nn.Sequential(nn.Linear(2, 2), nn.ReLU()))
    P.set_partition(root[1], 1)
    assert P.manual_assignment(root, pp=2, default=0) == {"": 0, "0": 0, "1": 1, "1.0": 1, "1.1": 1}


def test_a_partition_beyond_the_pipeline_is_refused():
    root = nn.Sequential(nn.Linear(2, 2))
    P.set_partition(root[0], 3)
    with pytest.raises(SMPPartitionError, match="only 2 partitions"):
        P.manual_assignment(root, pp=2, default=0)


def test_splitting_a_tied_parameter_names_both_modules_and_the_parameter():
    model = Tied()
    P.set_partition(model.head, 1)
    with pytest.raises(SMPPartitionError) as err:
        P.manual_assignment(model, pp=2, default=0)
    text = str(err.value)
    assert "'embed'" in text and "'head'" in text and "embed.weight" in text


def test_bad_indices_are_refused():
    with pytest.raises(ValueError):
        with P.partition(-1):
            pass
    with pytest.raises(TypeError):
        P.set_partition("not a module", 0)


def traces_for(model, order):
    return {name: P.ModuleTrace(order=i) for i, name in enumerate(order)}


def test_auto_partition_balances_contiguous_layers_and_keeps_the_root_first():
    model = nn.Sequential(*[nn.Linear(16, 16) for _ in range(8)])
    traces = traces_for(model, [""] + [str(i) for i in range(8)])
    owners = P.auto_assignment(model, traces, pp=4, memory_weight=0.8, use_times=False)
    assert [owners[str(i)] for i in range(8)] == [0, 0, 1, 1, 2, 2, 3, 3]
    assert owners[""] == 0


class Stack(nn.Module):
    """The usual GPT layout: the blocks in a ModuleList the forward loops over."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(64, 16)
        self.blocks = nn.ModuleList(nn.Linear(16, 16) for _ in range(4))
        self.norm = nn.LayerNorm(16)
        self.head = nn.Linear(16, 64)

    def forward(self, x):
        x = self.embed(x)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def test_auto_partition_follows_the_forward_through_a_module_list():
    model = Stack()
    # the ModuleList itself never runs: it has no trace of its own
    order = ["", "embed", "blocks.0", "blocks.1", "blocks.2", "blocks.3", "norm", "head"]
    owners = P.auto_assignment(model, traces_for(model, order), pp=4, memory_weight=0.8,
                               use_times=False)
    ranks = [owners[name] for name in order[1:]]
    assert ranks == sorted(ranks) and set(ranks) == {0, 1, 2, 3}, owners
    assert owners["embed"] == 0 and owners["head"] == 3


def test_auto_partition_keeps_tied_modules_together():
    model = Tied()
    order = ["", "embed", "body", "body.0", "body.1", "head"]
    owners = P.auto_assignment(model, traces_for(model, order), pp=2, memory_weight=0.8,
                               use_times=False)
    assert owners["embed"] == owners["head"]
    assert set(owners.values()) == {0, 1}


def test_a_model_too_small_to_split_says_so():
    with pytest.raises(SMPPartitionError, match="too small to split into 3 partitions"):
        P.auto_assignment(nn.Linear(2, 2), {"": P.ModuleTrace(order=0)}, pp=3,
                          memory_weight=0.8, use_times=False)


def test_balanced_segments_minimise_the_largest_segment():
    assert P._balanced_segments([1, 1, 1, 1], 2) == [0, 0, 1, 1]
    assert P._balanced_segments([3, 1, 1, 1], 2) == [0, 1, 1, 1]
    assert P._balanced_segments([1, 1, 1, 5], 2) == [0, 0, 0, 1]


def test_shared_parameters_lists_each_tied_parameter_once():
    assert P.shared_parameters(Tied()) == [("embed.weight", ["embed", "head"])]
    assert P.shared_parameters(nn.Linear(2, 2)) == []


def test_memory_weight_moves_the_cut_towards_the_heavy_layer():
    model = nn.Sequential(nn.Linear(256, 256), nn.ReLU(), nn.ReLU(), nn.ReLU())
    traces = traces_for(model, ["", "0", "1", "2", "3"])
    by_memory = P.auto_assignment(model, traces, pp=2, memory_weight=1.0, use_times=False)
    assert by_memory["0"] == 0 and by_memory["1"] == by_memory["2"] == by_memory["3"] == 1
    torch.manual_seed(0)
