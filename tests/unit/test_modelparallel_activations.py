"""Activation checkpointing in one process: the strategies' groups of children, SMP's refusals
with its messages, checkpointed runs giving the outputs and gradients of plain ones (tensor
parallelism's dropout included), and the memory it saves: the bytes a 12-layer MLP keeps for
its backward, with and without each layer checkpointed."""

from __future__ import annotations

import logging
import types

import pytest

torch = pytest.importorskip("torch", reason="needs torch")

from shoal.modelparallel.errors import (  # noqa: E402
    CheckpointingError,
    SMPConfigError,
    SMPUsageError,
)
from shoal.modelparallel.torch import activations  # noqa: E402
from shoal.modelparallel.torch import state as smp_state  # noqa: E402
from torch import nn  # noqa: E402


@pytest.fixture
def smp():
    import shoal.modelparallel.torch as smp

    smp_state.shutdown()
    smp.init({})
    yield smp
    smp_state.shutdown()


def mlp(layers=4, width=8, hidden=16, seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(*[nn.Sequential(nn.Linear(width, hidden), nn.GELU(), nn.Dropout(0.3),
                                         nn.Linear(hidden, width)) for _ in range(layers)])


def test_strategies_group_children():
    assert activations.strategy_groups(4, "each") == [(0, 1), (1, 2), (2, 3), (3, 4)]
    assert activations.strategy_groups(4, "contiguous") == [(0, 4)]
    assert activations.strategy_groups(7, "group_3") == [(0, 3), (3, 6), (6, 7)]
    assert activations.strategy_groups(0, "contiguous") == []


def test_groups_are_cut_where_the_owner_changes():
    owner = {"s": 0, "s.0": 0, "s.1": 0, "s.2": 1, "s.3": 1, "s.3.a": 0}
    keys = ["s.0", "s.1", "s.2", "s.3"]
    # s.3 is spread over two ranks: a run of its own, which cannot be checkpointed
    assert activations._cut_by_owner(owner, keys, 0, 4) == [(0, 2, 0), (2, 3, 1), (3, 4, None)]
    assert activations._ranks_of(owner, "s.3") == {0, 1}
    assert activations._ranks_of(owner, "") == {0, 1}


def test_split_checkpoint_warns_with_auto_partition_and_raises_with_manual(caplog):
    auto = types.SimpleNamespace(cfg=types.SimpleNamespace(auto_partition=True))
    with caplog.at_level(logging.WARNING, logger="shoal.modelparallel"):
        activations._split(auto, "blocks")
    assert "runs without activation checkpointing" in caplog.text
    manual = types.SimpleNamespace(cfg=types.SimpleNamespace(auto_partition=False))
    with pytest.raises(CheckpointingError, match="'blocks' is checkpointed, but its modules "
                       "are placed on more than one pipeline partition"):
        activations._split(manual, "blocks")
    assert issubclass(CheckpointingError, SMPUsageError)


def test_refusals_and_messages(smp):
    net = mlp()
    with pytest.raises(SMPUsageError, match="^The model needs to be wrapped with "
                       "smp.DistributedModel before set_activation_checkpointing can be "
                       "called on a module$"):
        smp.set_activation_checkpointing(net[0])
    smp.DistributedModel(net)
    with pytest.raises(SMPUsageError, match="^strategy can only be used when checkpointing "
                       "Sequential modules$"):
        smp.set_activation_checkpointing(net[0][0], strategy="contiguous")
    with pytest.raises(SMPUsageError, match="'group_0'.*'each', 'contiguous' and 'group_<n>'"):
        smp.set_activation_checkpointing(net, strategy="group_0")
    with pytest.raises(SMPUsageError, match="module of the model"):
        smp.set_activation_checkpointing(nn.Linear(2, 2))
    with pytest.warns(DeprecationWarning, match="pack_args_as_tuple is deprecated"):
        smp.set_activation_checkpointing(net[1], pack_args_as_tuple=True)


def test_dict_or_set_outputs_are_refused():
    class Named(nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = nn.Linear(3, 3)

        def forward(self, x):
            return {"out": self.proj(x)}

    x = torch.randn(2, 3, requires_grad=True)
    with pytest.raises(CheckpointingError, match="returned a dict; a checkpointed module's "
                       "output must be a tensor or a tuple/list of them"):
        smp_patches().checkpoint(Named(), x)


def smp_patches():
    from smdistributed.modelparallel.torch.patches import checkpoint

    return checkpoint


def outputs_and_grads(net, run, seed=5):
    torch.manual_seed(seed)
    x = torch.randn(6, 8, requires_grad=True)
    out = run(net, x)
    out.pow(2).sum().backward()
    grads = [p.grad.clone() for p in net.parameters()] + [x.grad.clone()]
    net.zero_grad()
    return out.detach(), grads


@pytest.mark.parametrize("strategy", ["each", "contiguous", "group_3"])
def test_patches_match_the_plain_run(strategy):
    patches = smp_patches()
    net = mlp(layers=5)  # dropout on: the recomputation must draw the forward's masks
    want = outputs_and_grads(net, lambda n, x: n(x))
    got = outputs_and_grads(net, lambda n, x: patches.checkpoint_sequential(
        n, x, strategy=strategy))
    assert got[0].equal(want[0])
    assert all(g.equal(w) for g, w in zip(got[1], want[1]))
    one = outputs_and_grads(net, lambda n, x: patches.checkpoint(n, x))
    assert one[0].equal(want[0]) and all(g.equal(w) for g, w in zip(one[1], want[1]))


@pytest.mark.parametrize("strategy", ["each", "contiguous", "group_2"])
def test_set_activation_checkpointing_matches_the_plain_step(smp, strategy):
    net = mlp()
    want = outputs_and_grads(net, lambda n, x: n(x))
    model = smp.DistributedModel(net)
    smp.set_activation_checkpointing(net, strategy=strategy)
    smp.set_activation_checkpointing(net[0][3])  # nested in a checkpointed group
    calls = []
    net[1].register_forward_pre_hook(lambda *_: calls.append(1))
    kept = {}

    @smp.step
    def train(model, x):
        out = model(x)
        kept["out"] = out.detach()
        model.backward(out.pow(2).sum())

    torch.manual_seed(5)
    x = torch.randn(6, 8)
    train(model, x)
    assert kept["out"].equal(want[0])
    assert all(p.grad.equal(w) for p, w in zip(net.parameters(), want[1]))
    assert len(calls) == 2  # the forward, and its recomputation in the backward


def test_tensor_parallel_dropout_masks_are_recomputed_alike():
    from shoal.modelparallel.torch.nn.dropout import ParallelDropout

    drop = ParallelDropout(0.5)
    drop._tp_size = 2  # draws from its own generator, as at tensor-parallel degree 2
    net = nn.Sequential(nn.Linear(8, 8), drop, nn.Linear(8, 8))
    start = drop._generator.get_state()
    want = outputs_and_grads(net, lambda n, x: n(x))
    after = drop._generator.get_state()
    drop._generator.set_state(start)
    got = outputs_and_grads(net, lambda n, x: smp_patches().checkpoint(n, x))
    assert got[0].equal(want[0]) and all(g.equal(w) for g, w in zip(got[1], want[1]))
    assert drop._generator.get_state().equal(after)  # the next call draws new masks


def saved_bytes(net, x, checkpointed: bool) -> int:
    """Bytes of the distinct storages the backward keeps: what autograd saves, and the
    inputs each checkpoint keeps to recompute from (the weights, kept either way, apart)."""
    storages: dict[int, int] = {}
    weights = {p.untyped_storage().data_ptr() for p in net.parameters()}

    def keep(t):
        storage = t.untyped_storage()
        if storage.data_ptr() not in weights:
            storages[storage.data_ptr()] = storage.nbytes()

    def pack(t):
        keep(t)
        return t

    hooks = []
    if checkpointed:
        for layer in net:
            hooks.append(layer.register_forward_pre_hook(lambda _m, args: keep(args[0])))
    patches = smp_patches()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = patches.checkpoint_sequential(net, x) if checkpointed else net(x)
    out.sum().backward()
    for h in hooks:
        h.remove()
    return sum(storages.values())


def test_checkpointing_each_layer_at_least_halves_the_saved_activations():
    torch.manual_seed(0)
    net = nn.Sequential(*[nn.Sequential(nn.Linear(128, 512), nn.GELU(), nn.Linear(512, 128))
                          for _ in range(12)])
    x = torch.randn(64, 128, requires_grad=True)
    plain = saved_bytes(net, x, checkpointed=False)
    checkpointed = saved_bytes(net, x, checkpointed=True)
    print(f"12-layer MLP, batch 64: saved for backward {plain} bytes plain, "
          f"{checkpointed} bytes with each layer checkpointed ({plain / checkpointed:.1f}x less)")
    assert checkpointed * 2 <= plain


# -- SHOAL_ACTIVATION_CHECKPOINTING --------------------------------------------------------
class Block(nn.Module):
    calls = 0  # forwards run, recomputations included

    def __init__(self, width=8):
        super().__init__()
        self.fc1, self.drop, self.fc2 = nn.Linear(width, 16), nn.Dropout(0.2), nn.Linear(16, width)

    def forward(self, x):
        Block.calls += 1
        return x + self.fc2(self.drop(torch.relu(self.fc1(x))))


class Head(nn.Linear):
    calls = 0

    def forward(self, x):
        Head.calls += 1
        return super().forward(x)


class Net(nn.Module):
    def __init__(self, seed=0):
        torch.manual_seed(seed)
        super().__init__()
        self.embed = nn.Linear(8, 8)
        self.norms = nn.ModuleList([nn.LayerNorm(8) for _ in range(3)])  # a smaller stack
        self.blocks = nn.ModuleList([Block() for _ in range(4)])
        self.mixed = nn.Sequential(nn.Linear(8, 64), nn.ReLU(), nn.Linear(64, 64))  # bigger
        self.head = Head(64, 1)

    def forward(self, x):
        x = self.embed(x)
        for norm in self.norms:
            x = norm(x)
        for block in self.blocks:
            x = block(x)
        return self.head(self.mixed(x))


@pytest.fixture
def planned_smp(monkeypatch):
    import shoal.modelparallel.torch as smp

    def start(value):
        if value is None:
            monkeypatch.delenv(activations.PLANNED_VARIABLE, raising=False)
        else:
            monkeypatch.setenv(activations.PLANNED_VARIABLE, value)
        smp.init({})
        return smp

    smp_state.shutdown()
    yield start
    smp_state.shutdown()


def train_once(smp, net, seed=5):
    """One smp.step of ``net`` wrapped (seeded alike for every run); the loss, the
    gradients, and the forwards each class ran."""
    model = smp.DistributedModel(net) if smp is not None else net
    Block.calls = Head.calls = 0
    torch.manual_seed(seed)
    x = torch.randn(6, 8)
    if smp is None:
        loss = net(x).pow(2).sum()
        loss.backward()
    else:
        @smp.step
        def train(model, x):
            loss = model(x).pow(2).sum()
            model.backward(loss)
            return loss

        loss = train(model, x).reduce_mean()
    grads = [p.grad.clone() for p in net.parameters()]
    return loss.detach(), grads, (Block.calls, Head.calls)


def test_planned_value_is_parsed_once_with_the_accepted_values():
    parse = activations.parse_planned
    assert parse(None) is None and parse("") is None and parse(" off ") is None
    assert parse("blocks") == activations.Planned(blocks=True)
    assert parse("types:Block, Head,Block").types == ("Block", "Head")
    for bad in ("on", "Blocks", "types:", "types:A,,B", "types:a-b"):
        with pytest.raises(SMPConfigError, match=f"SHOAL_ACTIVATION_CHECKPOINTING={bad!r} "
                           "is not understood; the accepted values are 'off' .*'blocks', "
                           r"or 'types:<ClassName>\[,<ClassName>...\]'"):
            parse(bad)


def test_a_bad_value_fails_smp_init(planned_smp):
    with pytest.raises(SMPConfigError, match="SHOAL_ACTIVATION_CHECKPOINTING='every' is not "
                       "understood; the accepted values are"):
        planned_smp("every")
    assert smp_state.current() is None


def test_blocks_checkpoints_each_block_of_the_main_stack(planned_smp, caplog):
    want = train_once(None, Net())
    assert want[2] == (4, 1)
    smp = planned_smp("blocks")
    net = Net()
    with caplog.at_level(logging.INFO, logger="shoal.modelparallel"):
        got = train_once(smp, net)
    assert got[2] == (8, 1)  # each block's forward runs again in the backward; the head once
    assert got[0].equal(want[0]) and all(g.equal(w) for g, w in zip(got[1], want[1]))
    assert [m for m in net.modules() if m in activations._specs] == list(net.blocks)
    assert ("SHOAL_ACTIVATION_CHECKPOINTING=blocks: 4 modules (Block) checkpointed, from the "
            "stack 'blocks'") in caplog.text


def test_blocks_of_a_sequential_stack_are_checkpointed_whole(planned_smp):
    smp = planned_smp("blocks")
    net = mlp(layers=3)
    calls = []
    for block in net:
        block[0].register_forward_pre_hook(lambda *_: calls.append(1))
    model = smp.DistributedModel(net)

    @smp.step
    def train(model, x):
        model.backward(model(x).sum())

    train(model, torch.randn(4, 8))
    assert len(calls) == 6
    assert [activations._specs[b].strategy for b in net] == ["contiguous"] * 3


def test_types_selects_by_class(planned_smp):
    smp = planned_smp("types:Head,LayerNorm")
    net = Net()
    got = train_once(smp, net)
    assert got[2] == (4, 2)
    assert [m for m in net.modules() if m in activations._specs] == [*net.norms, net.head]


def test_unset_checkpoints_nothing(planned_smp):
    smp = planned_smp(None)
    net = Net()
    assert train_once(smp, net)[2] == (4, 1)
    assert not any(m in activations._specs for m in net.modules())


def test_the_scripts_own_calls_are_not_doubled(planned_smp, caplog):
    smp = planned_smp("blocks")
    net = Net()
    model = smp.DistributedModel(net)
    smp.set_activation_checkpointing(net.blocks[1])  # before partitioning: left as it is
    calls = []
    net.blocks[2].fc1.register_forward_pre_hook(lambda *_: calls.append(1))

    @smp.step
    def train(model, x):
        model.backward(model(x).pow(2).sum())

    Block.calls = 0
    with caplog.at_level(logging.INFO, logger="shoal.modelparallel"):
        train(model, torch.randn(6, 8))
    assert Block.calls == 8 and len(calls) == 2
    assert "3 modules (Block) checkpointed" in caplog.text
    assert "1 left to the script's own set_activation_checkpointing" in caplog.text
    # after partitioning, a call on a module inside a block takes the block's back
    smp.set_activation_checkpointing(net.blocks[2].fc1)
    assert net.blocks[2] not in activations._specs and "forward" not in vars(net.blocks[2])
    Block.calls, calls[:] = 0, []
    train(model, torch.randn(6, 8))
    assert Block.calls == 7  # block 2 once, now that the script checkpoints its fc1
    assert net.blocks[2].fc1 in activations._specs and net.blocks[0] in activations._specs
