"""Tensor parallelism's pure parts, in one process (tp 1, no smp.init): SMP's channel split,
shards of full tensors, the replacement of marked modules (outermost first, weights copied,
tied and undistributable modules kept, the mark's keyword arguments filtered by the
constructor), and the layout that says which parameters are split and which see the TP
group's batch."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="needs torch")

from shoal.modelparallel.torch import nn as smp_nn  # noqa: E402
from shoal.modelparallel.torch.nn.module import Split  # noqa: E402
from shoal.modelparallel.torch.tensorparallel import collectives, registry  # noqa: E402
from shoal.modelparallel.torch.tensorparallel.layout import TensorLayout  # noqa: E402
from torch import nn  # noqa: E402


def mark(module, enabled=True, **kwargs):
    object.__setattr__(module, "_smp_tp", registry.Mark(enabled, kwargs))
    return module


@pytest.mark.parametrize("total,size,expected", [
    (10, 4, [3, 3, 2, 2]), (8, 2, [4, 4]), (3, 4, [1, 1, 1, 0]), (7, 1, [7]),
])
def test_smp_splits_channels_first_ranks_one_more(total, size, expected):
    assert collectives.local_sizes(total, size) == expected
    assert [collectives.local_offset(total, r, size) for r in range(size)] == \
        [sum(expected[:r]) for r in range(size)]


def test_a_split_cuts_the_full_tensor_on_its_axis():
    full = torch.arange(20.0).reshape(2, 10)
    split = Split(1, (3, 3, 2, 2))
    parts = [split.shard(full, r) for r in range(4)]
    assert [p.shape[1] for p in parts] == [3, 3, 2, 2]
    assert torch.equal(torch.cat(parts, 1), full) and split.total == 10


def test_collectives_are_the_identity_at_one_rank():
    x = torch.randn(3, 4, requires_grad=True)
    for op in (collectives.copy_to, collectives.reduce_from, collectives.sum_everywhere):
        assert op(x) is x
    assert collectives.gather(x, 0) is x and collectives.scatter(x, 1) is x
    assert collectives.all_to_all(x, split_dim=1, cat_dim=0) is x


def test_marked_modules_are_replaced_outermost_first_with_their_weights():
    torch.manual_seed(0)
    root = nn.Sequential(mark(nn.Linear(4, 3)), nn.ReLU(), mark(nn.Embedding(5, 4)), nn.Linear(3, 2))
    x = torch.randn(2, 4)
    expected = root[0](x)
    out = registry.distribute(root)
    assert out is root
    assert isinstance(root[0], smp_nn.DistributedLinear)
    assert isinstance(root[2], smp_nn.DistributedEmbedding)
    assert type(root[3]) is nn.Linear  # not marked
    assert torch.allclose(root[0](x), expected)


def test_the_root_itself_may_be_replaced_and_disabled_marks_keep_modules():
    assert isinstance(registry.distribute(mark(nn.Linear(2, 2))), smp_nn.DistributedLinear)
    assert type(registry.distribute(mark(nn.Linear(2, 2), enabled=False))) is nn.Linear


def test_tied_modules_are_kept_with_a_log_line(caplog):
    embed, head = mark(nn.Embedding(6, 4)), mark(nn.Linear(4, 6, bias=False))
    head.weight = embed.weight
    root = nn.ModuleDict({"embed": embed, "head": head, "free": mark(nn.Linear(4, 4))})
    with caplog.at_level("INFO", logger="shoal.modelparallel"):
        registry.distribute(root)
    assert type(root["embed"]) is nn.Embedding and type(root["head"]) is nn.Linear
    assert isinstance(root["free"], smp_nn.DistributedLinear)
    lines = [r.getMessage() for r in caplog.records]
    assert "tensor parallelism: embed (Embedding) is kept as it is: it shares a parameter " \
           "with another module" in lines, lines
    assert "tensor parallelism: free (Linear) -> DistributedLinear" in lines, lines


def test_tp_register_decorates_a_class():
    class Dist(smp_nn.DistributedModule):
        def __init__(self, width):
            super().__init__()
            self.proj = smp_nn.DistributedLinear(width, width)

        def forward(self, x):
            return self.proj(x)

    @registry.tp_register(Dist)
    class Plain(nn.Module):
        def __init__(self, width):
            super().__init__()
            self.proj = nn.Linear(width, width)

        def forward(self, x):
            return self.proj(x)

    assert registry.registration(Plain).dist_module is Dist
    plain = mark(Plain(3))
    assert plain.__dict__["_smp_init_args"] == ((3,), {})  # recorded at creation
    x = torch.randn(2, 3)
    expected = plain(x)
    replaced = registry.distribute(nn.Sequential(plain))[0]
    assert isinstance(replaced, Dist) and torch.allclose(replaced(x), expected)


def test_registered_modules_with_hooks_and_a_refusal():
    class Twice(nn.Module):
        def __init__(self, width, scale=2.0):
            super().__init__()
            self.inner = nn.Linear(width, width)
            self.scale = scale

        def forward(self, x):
            return self.inner(x) * self.scale

    class DistTwice(smp_nn.DistributedModule):
        def __init__(self, width, scale, bias_shift=0.0):
            super().__init__()
            self.inner = smp_nn.DistributedLinear(width, width)
            self.scale, self.bias_shift = scale, bias_shift

        @classmethod
        def can_distribute(cls, width, scale, bias_shift=0.0):
            return width > 1

        def forward(self, x, shift):
            return self.inner(x) * self.scale + shift + self.bias_shift

    registry.tp_register_with_module(
        Twice, DistTwice, init_hook=lambda width, scale=2.0: ((width, scale), {}),
        forward_hook=lambda x: ((x,), {"shift": 1.0}), return_hook=lambda out: -out)
    torch.manual_seed(1)
    root = nn.ModuleList([mark(Twice(3), bias_shift=0.5, unknown=1), mark(Twice(1))])
    x = torch.randn(2, 3)
    expected = -(root[0](x) + 1.5)
    registry.distribute(root)
    assert isinstance(root[0], DistTwice) and root[0].bias_shift == 0.5
    assert not hasattr(root[0], "unknown")
    assert type(root[1]) is Twice  # can_distribute said no
    assert torch.allclose(root[0](x), expected)
    with pytest.raises(Exception, match="^Can only register a sub-class of smp.nn.DistributedModule. "
                                        "Found Linear.$"):
        registry.tp_register_with_module(Twice, nn.Linear)


def test_the_layout_names_split_and_scaled_batch_parameters():
    root = nn.Sequential(mark(nn.Linear(4, 3)), nn.LayerNorm(3))
    registry.distribute(root)
    layout = TensorLayout(root)
    assert layout.splits == {"0.weight": Split(1, (4,))}
    assert id(root[0].weight) in layout.distributed and id(root[0].bias) in layout.scaled_batch
    assert id(root[0].bias) not in layout.distributed
    assert id(root[1].weight) not in layout.scaled_batch
    state = root.state_dict()
    assert set(layout.gather_full(state)) == set(state)
    assert torch.equal(layout.shard("0.weight", state["0.weight"], 0), state["0.weight"])
