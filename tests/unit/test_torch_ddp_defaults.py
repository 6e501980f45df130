"""torch's DDP on a Shoal process group defaults to gradient_as_bucket_view=True and to the
core's average as its communication hook (in a world of one: the core as a single rank); an
explicit choice, a user's hook and other backends' groups take precedence or are left alone."""

import os
import pickle
import uuid

import pytest
import shoal.dataparallel.torch  # noqa: F401 - registers the backend and the DDP default
import torch
import torch.distributed as torch_dist
from shoal.dataparallel.torch.ddp_defaults import default_hook_state
from torch.nn.parallel import DistributedDataParallel as DDP


@pytest.fixture
def shoal_world_of_one(monkeypatch):
    from shoal.dataparallel import core

    for key in list(os.environ):  # one process, no launcher: a world of one
        if key.startswith(("OMPI_", "PMI", "SHOAL_")) or key in ("RANK", "WORLD_SIZE",
                                                                  "MASTER_PORT"):
            monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("SHOAL_JOB_ID", uuid.uuid4().hex[:12])
    core.shutdown()
    torch_dist.init_process_group("shoal", store=torch_dist.HashStore(), rank=0, world_size=1)
    yield
    torch_dist.destroy_process_group()
    core.shutdown()


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.Tanh(), torch.nn.Linear(7, 2))


def _backward(wrapped, x):
    wrapped.zero_grad(set_to_none=False)
    wrapped(x).square().sum().backward()
    return [p.grad for p in wrapped.module.parameters()]


def test_ddp_on_shoal_keeps_gradients_in_its_buckets(shoal_world_of_one, monkeypatch):
    assert torch_dist.get_backend() == "shoal"
    reductions = []
    all_reduce = torch_dist.all_reduce

    def recording_all_reduce(tensor, op=torch_dist.ReduceOp.SUM, **kwargs):
        reductions.append(op)
        return all_reduce(tensor, op=op, **kwargs)

    monkeypatch.setattr(torch_dist, "all_reduce", recording_all_reduce)
    plain, wrapped = _model(), DDP(_model())
    assert wrapped.gradient_as_bucket_view
    assert default_hook_state(wrapped) is not None
    x = torch.randn(4, 5)
    for _ in range(2):  # the second step runs on the rebuilt buckets
        plain.zero_grad()
        plain(x).square().sum().backward()
        grads = _backward(wrapped, x)
        for expected, got in zip((p.grad for p in plain.parameters()), grads):
            assert torch.equal(got, expected)
    # One bucket here: every gradient is a view of the same flat buffer, averaged by the
    # core through the default hook, once per step.
    assert len({g.untyped_storage().data_ptr() for g in grads}) == 1
    assert reductions == [torch_dist.ReduceOp.AVG] * 2
    # The DDP still pickles (torch.save of a whole DDP module).
    copy = pickle.loads(pickle.dumps(wrapped))
    assert isinstance(copy, DDP)


def test_an_explicit_choice_wins(shoal_world_of_one):
    assert not DDP(_model(), gradient_as_bucket_view=False).gradient_as_bucket_view
    assert DDP(_model(), gradient_as_bucket_view=True).gradient_as_bucket_view
    grads = _backward(DDP(_model(), gradient_as_bucket_view=False), torch.randn(4, 5))
    assert len({g.untyped_storage().data_ptr() for g in grads}) == len(grads)


def test_other_backends_keep_torchs_default(shoal_world_of_one):
    gloo = torch_dist.new_group(backend="gloo")
    wrapped = DDP(_model(), process_group=gloo)
    assert not wrapped.gradient_as_bucket_view
    assert default_hook_state(wrapped) is None


def test_the_defaults_can_be_turned_off(shoal_world_of_one, monkeypatch):
    monkeypatch.setenv("SHOAL_TORCH_DDP_DEFAULTS", "0")
    wrapped = DDP(_model())
    assert not wrapped.gradient_as_bucket_view
    assert default_hook_state(wrapped) is None
    wrapped.register_comm_hook(None, lambda state, bucket: torch.futures.Future())


def test_a_users_hook_takes_the_default_hooks_place(shoal_world_of_one):
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    calls = []

    def counting_hook(state, bucket):
        calls.append(state)
        return default_hooks.allreduce_hook(None, bucket)

    plain, wrapped = _model(), DDP(_model())
    wrapped.register_comm_hook("mine", counting_hook)
    x = torch.randn(4, 5)
    plain(x).square().sum().backward()
    for expected, got in zip((p.grad for p in plain.parameters()), _backward(wrapped, x)):
        assert torch.equal(got, expected)
    assert calls == ["mine"]
    # As with torch's own reducer, a second hook is refused.
    with pytest.raises(RuntimeError, match="can only be called once"):
        wrapped.register_comm_hook(None, counting_hook)


def test_a_builtin_hook_takes_the_default_hooks_place(shoal_world_of_one):
    plain, wrapped = _model(), DDP(_model())
    wrapped._register_builtin_comm_hook(torch_dist.BuiltinCommHookType.FP16_COMPRESS)
    assert default_hook_state(wrapped).replacement is not None
    x = torch.randn(4, 5)
    plain(x).square().sum().backward()
    for expected, got in zip((p.grad for p in plain.parameters()), _backward(wrapped, x)):
        torch.testing.assert_close(got, expected, rtol=1e-3, atol=1e-3)  # through float16


def test_the_default_is_installed_once():
    from shoal.dataparallel.torch import ddp_defaults

    wrapped = DDP.__init__
    ddp_defaults.install()
    assert DDP.__init__ is wrapped
    assert wrapped.__wrapped__.__qualname__ == "DistributedDataParallel.__init__"
