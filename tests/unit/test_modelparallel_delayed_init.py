"""``smp.delay_param_initialization`` in one process: parameters on ``meta`` until
materialised, then initialised as the module would have been (``reset_parameters`` or the
recorded ``torch.nn.init`` calls), in place, with ``requires_grad`` kept; the CPU-only
error; ``smp.model_creation`` under ``delayed_parameter_initialization``; and
``offload_activations``' hooks as a no-op on the CPU."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from shoal.modelparallel.errors import SMPUsageError  # noqa: E402
from shoal.modelparallel.torch import delayed, offload  # noqa: E402
from shoal.modelparallel.torch import state as smp_state  # noqa: E402
from torch import nn  # noqa: E402

pytestmark = pytest.mark.torch


class Custom(nn.Module):
    """Initialises its parameters in its constructor, with no reset_parameters."""

    def __init__(self):
        super().__init__()
        self.scale = nn.Parameter(torch.empty(5))
        self.frozen = nn.Parameter(torch.empty(3, 2), requires_grad=False)
        self.register_buffer("steps", torch.arange(4))
        nn.init.constant_(self.scale, 2.5)
        nn.init.normal_(self.frozen, mean=1.0, std=0.1)


def build():
    return nn.Sequential(nn.Linear(6, 7), nn.LayerNorm(7), nn.Embedding(9, 4), Custom())


def test_parameters_hold_no_memory_until_materialised():
    with delayed.delay_param_initialization():
        net = build()
    params = list(net.parameters())
    assert params and all(p.is_meta for p in params)
    assert net[3].steps.device.type == "cpu" and net[3].steps.tolist() == [0, 1, 2, 3]
    assert not net[3].frozen.requires_grad and net[0].weight.requires_grad
    assert delayed.is_delayed(net)
    ids = [id(p) for p in net.parameters()]
    names = delayed.materialise(net)
    assert [id(p) for p in net.parameters()] == ids  # the same Parameter objects
    assert not delayed.is_delayed(net) and all(p.device.type == "cpu" for p in params)
    assert set(names) == {n for n, _ in net.named_parameters()}
    assert not net[3].frozen.requires_grad and net[0].weight.requires_grad


def test_materialised_values_are_the_modules_initialisation():
    torch.manual_seed(5)
    eager = build()
    with delayed.delay_param_initialization():
        net = build()
    torch.manual_seed(5)
    delayed.materialise(net)
    # nn.Linear's reset_parameters with the same seed draws the same values.
    assert net[0].weight.equal(eager[0].weight) and net[0].bias.equal(eager[0].bias)
    assert net[1].weight.equal(torch.ones(7)) and net[1].bias.equal(torch.zeros(7))
    assert net[2].weight.shape == (9, 4) and abs(net[2].weight.std().item() - 1) < 0.5
    assert net[3].scale.equal(torch.full((5,), 2.5))  # the recorded torch.nn.init calls
    assert abs(net[3].frozen.mean().item() - 1.0) < 0.2 and net[3].frozen.std() > 0


def test_only_the_owned_modules_are_materialised():
    with delayed.delay_param_initialization():
        net = build()
    names = delayed.materialise(net, owns=lambda name: name in ("0", "3"))
    assert sorted(names) == ["0.bias", "0.weight", "3.frozen", "3.scale"]
    assert net[1].weight.numel() == 0 and not net[1].weight.is_meta  # released
    assert net[0].weight.shape == (7, 6)


def test_disabled_and_nested_contexts():
    with delayed.delay_param_initialization(enabled=False):
        assert not nn.Linear(2, 2).weight.is_meta
    with delayed.delay_param_initialization():
        with delayed.delay_param_initialization():
            assert nn.Linear(2, 2).weight.is_meta
        assert nn.Linear(2, 2).weight.is_meta
    assert not nn.Linear(2, 2).weight.is_meta
    assert nn.init.normal_ is delayed._patched.get("normal_", nn.init.normal_)  # restored


def test_an_uninitialised_parameter_is_zero_with_a_warning(caplog):
    class Late(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.empty(3))
            self.w.data.fill_(4.0)  # through .data: not recorded

    with delayed.delay_param_initialization():
        late = Late()
    with caplog.at_level("WARNING", logger="shoal.modelparallel"):
        delayed.materialise(late)
    assert late.w.equal(torch.zeros(3)) and "w" in caplog.text


def test_parameter_must_be_on_cpu():
    with delayed.delay_param_initialization():
        module = nn.Module()
        meta = nn.Parameter(torch.empty(2, device="meta"))
        assert delayed._to_meta(module, "x", meta) is None  # already meta: kept
        with pytest.raises(SMPUsageError, match=r"^Parameter must be on CPU for delayed "
                           r"initialization\.$"):
            delayed._to_meta(module, "x", _OnAccelerator())


class _OnAccelerator:
    """A parameter that says it lives on an accelerator (none here to put one on)."""

    is_meta = False
    device = torch.device("cuda", 0)


@pytest.fixture
def smp():
    import shoal.modelparallel.torch as smp

    smp_state.shutdown()
    yield smp
    smp_state.shutdown()


def test_model_creation_delays_under_the_configuration(smp):
    with smp.model_creation():  # before smp.init: nothing delayed
        assert not nn.Linear(2, 3).weight.is_meta
    smp.init({"delayed_parameter_initialization": True})
    with smp.model_creation(dtype=torch.float64):
        linear = nn.Linear(2, 3)
    assert linear.weight.is_meta and linear.weight.dtype == torch.float64
    smp_state.shutdown()
    smp.init({})
    with smp.model_creation():
        assert not nn.Linear(2, 3).weight.is_meta


def test_distributed_model_materialises_at_the_first_step(smp):
    smp.init({"delayed_parameter_initialization": True})
    with smp.model_creation():
        net = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
    reference = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
    model = smp.DistributedModel(net)
    optimizer = smp.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1))
    model.load_state_dict(reference.state_dict())
    assert all(p.is_meta for p in net.parameters())

    @smp.step
    def step(model, x):
        loss = model(x).square().mean()
        model.backward(loss)
        return loss

    x = torch.randn(6, 4)
    loss = step(model, x).reduce_mean()
    assert not any(p.is_meta for p in net.parameters())
    assert loss.item() == pytest.approx(reference(x).square().mean().item(), rel=1e-6)
    optimizer.step()  # the optimizer built on meta parameters steps the materialised ones
    assert not net[0].weight.equal(reference[0].weight)


def checkpointed_losses(smp, config, checkpoint=True, steps=3):
    smp_state.shutdown()
    smp.init(config)
    torch.manual_seed(0)
    net = nn.Sequential(*[nn.Sequential(nn.Linear(6, 6), nn.Tanh()) for _ in range(4)])
    model = smp.DistributedModel(net)
    if checkpoint:
        for block in net:
            smp.set_activation_checkpointing(block)
    optimizer = smp.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1))

    @smp.step
    def step(model, x):
        loss = model(x).square().mean()
        model.backward(loss)
        return loss

    generator = torch.Generator().manual_seed(1)
    losses = []
    for _ in range(steps):
        optimizer.zero_grad()
        losses.append(step(model, torch.randn(5, 6, generator=generator)).reduce_mean().item())
        optimizer.step()
    return losses


def test_offloading_on_cpu_is_a_no_op(smp):
    plain = checkpointed_losses(smp, {})
    before = (offload.stats.packed, offload.stats.unpacked)
    offloaded = checkpointed_losses(smp, {"offload_activations": True,
                                          "activation_loading_horizon": 2})
    assert offloaded == plain
    # A checkpointed Sequential checkpoints each child ("each"): 8 calls a step, 3 steps.
    assert offload.stats.packed - before[0] == 24
    assert offload.stats.unpacked - before[1] == 24 and offload.stats.moved == 0


def test_offloading_without_checkpointing_says_so(smp, caplog, monkeypatch):
    monkeypatch.setattr(offload, "_warned", False)
    with caplog.at_level("INFO", logger="shoal.modelparallel"):
        checkpointed_losses(smp, {"offload_activations": True}, checkpoint=False, steps=2)
    assert caplog.text.count("no module is checkpointed") == 1


def test_bf16_masters_made_before_materialisation(smp):
    smp.init({"delayed_parameter_initialization": True, "bf16": True})
    with smp.model_creation():
        net = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
    model = smp.DistributedModel(net)
    optimizer = smp.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1))

    @smp.step
    def step(model, x):
        loss = model(x).float().square().mean()
        model.backward(loss)
        return loss

    step(model, torch.randn(3, 4))
    masters = [m for group in optimizer.optimizer.param_groups for m in group["params"]]
    assert masters and not any(m.is_meta for m in masters)
    assert masters[0].dtype == torch.float32 and masters[0].equal(net[0].weight.float())
    optimizer.step()
    assert net[0].weight.dtype == torch.bfloat16 and not net[0].weight.is_meta
