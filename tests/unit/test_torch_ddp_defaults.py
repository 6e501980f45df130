"""torch's DDP on a Shoal process group defaults to gradient_as_bucket_view=True (in a
world of one: the core as a single rank); an explicit choice and other backends' groups are
left alone."""

import os
import uuid

import pytest
import torch
import torch.distributed as torch_dist
from torch.nn.parallel import DistributedDataParallel as DDP

import shoal.dataparallel.torch  # noqa: F401 - registers the backend and the DDP default


@pytest.fixture
def shoal_world_of_one(monkeypatch):
    from shoal.dataparallel import core

    for key in list(os.environ):
        if key.startswith(("OMPI_", "PMI", "SHOAL_")) or key in ("RANK", "WORLD_SIZE", "MASTER_PORT"):
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


def test_ddp_on_shoal_keeps_gradients_in_its_buckets(shoal_world_of_one):
    assert torch_dist.get_backend() == "shoal"
    plain, wrapped = _model(), DDP(_model())
    assert wrapped.gradient_as_bucket_view
    x = torch.randn(4, 5)
    for _ in range(2):  # the second step runs on the rebuilt buckets
        plain.zero_grad()
        plain(x).square().sum().backward()
        grads = _backward(wrapped, x)
        for expected, got in zip((p.grad for p in plain.parameters()), grads):
            assert torch.equal(got, expected)
    # One bucket here: every gradient is a view of the same flat buffer.
    assert len({g.untyped_storage().data_ptr() for g in grads}) == 1


def test_an_explicit_choice_wins(shoal_world_of_one):
    assert not DDP(_model(), gradient_as_bucket_view=False).gradient_as_bucket_view
    assert DDP(_model(), gradient_as_bucket_view=True).gradient_as_bucket_view
    grads = _backward(DDP(_model(), gradient_as_bucket_view=False), torch.randn(4, 5))
    assert len({g.untyped_storage().data_ptr() for g in grads}) == len(grads)


def test_other_backends_keep_torchs_default(shoal_world_of_one):
    gloo = torch_dist.new_group(backend="gloo")
    assert not DDP(_model(), process_group=gloo).gradient_as_bucket_view


def test_the_default_is_installed_once():
    from shoal.dataparallel.torch import ddp_defaults

    wrapped = DDP.__init__
    ddp_defaults.install()
    assert DDP.__init__ is wrapped
    assert wrapped.__wrapped__.__qualname__ == "DistributedDataParallel.__init__"
