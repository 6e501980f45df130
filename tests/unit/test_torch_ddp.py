"""Shoal's DDP wrapper and module API in a world of one (gloo on a local store): the local
semantics (forward, no_sync accumulation, gradient views, errors). Multi-rank behaviour is
tested under mpirun in tests/integration/test_torch_ddp.py."""

import pytest
import torch
import torch.distributed as torch_dist
from shoal.dataparallel.torch import distributed as sdist
from shoal.dataparallel.torch.parallel.distributed import DistributedDataParallel
from shoal.errors import RuntimeFailure, ValidationError


@pytest.fixture
def world_of_one():
    torch_dist.init_process_group("gloo", store=torch_dist.HashStore(), rank=0, world_size=1)
    sdist.group.WORLD = torch_dist.group.WORLD
    yield
    sdist.destroy_process_group()


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.Tanh(), torch.nn.Linear(7, 2))


def _grads(model):
    return [p.grad.clone() for p in model.parameters()]


def test_wrapper_needs_an_initialized_group():
    assert not torch_dist.is_initialized()
    with pytest.raises(RuntimeFailure, match="init_process_group"):
        DistributedDataParallel(_model())


def test_module_api_needs_initialization():
    with pytest.raises(RuntimeFailure, match="init_process_group"):
        sdist.get_rank()
    assert not sdist.is_initialized()


def test_gradients_match_the_plain_model(world_of_one):
    plain, wrapped = _model(), DistributedDataParallel(_model(), bucket_cap_mb=0.0001)
    assert len(wrapped._buckets) > 1
    x = torch.randn(4, 5)
    plain(x).square().sum().backward()
    wrapped(x).square().sum().backward()
    for expected, got in zip(_grads(plain), _grads(wrapped.module)):
        torch.testing.assert_close(got, expected)
    # Gradients now live in the buckets' flat buffers.
    bucket = wrapped._buckets[0]
    assert bucket.params[0].grad.data_ptr() == bucket.views[0].data_ptr()


def test_no_sync_accumulates_like_two_backwards(world_of_one):
    plain, wrapped = _model(), DistributedDataParallel(_model())
    x1, x2 = torch.randn(4, 5), torch.randn(4, 5)
    plain(x1).sum().backward()
    plain(x2).sum().backward()
    with wrapped.no_sync():
        assert not wrapped.require_backward_grad_sync
        wrapped(x1).sum().backward()
    assert wrapped.require_backward_grad_sync
    wrapped(x2).sum().backward()
    for expected, got in zip(_grads(plain), _grads(wrapped.module)):
        torch.testing.assert_close(got, expected)


def test_zero_grad_to_none_and_unused_parameters(world_of_one):
    class WithUnused(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.net = _model()
            self.extra = torch.nn.Linear(3, 3)  # never used in forward

        def forward(self, x):
            return self.net(x)

    model = WithUnused()
    wrapped = DistributedDataParallel(model)
    optimizer = torch.optim.SGD(wrapped.parameters(), lr=0.1)
    for _ in range(3):
        optimizer.zero_grad(set_to_none=True)
        wrapped(torch.randn(2, 5)).sum().backward()
        optimizer.step()
    assert model.extra.weight.grad is None
    assert model.net[0].weight.grad is not None


def test_state_dict_is_prefixed_like_torch_ddp(world_of_one):
    wrapped = DistributedDataParallel(_model())
    assert all(key.startswith("module.") for key in wrapped.state_dict())


def test_module_api_in_a_world_of_one(world_of_one):
    assert sdist.is_initialized()
    assert (sdist.get_rank(), sdist.get_world_size()) == (0, 1)
    assert sdist.get_rank(sdist.group.WORLD) == 0
    tensor = torch.arange(4.0)
    sdist.all_reduce(tensor, op=sdist.ReduceOp.SUM)
    torch.testing.assert_close(tensor, torch.arange(4.0))
    assert sdist.new_group() is sdist.group.WORLD
    with pytest.raises(ValidationError, match="only the world group"):
        sdist.new_group([1, 2])


def test_core_failures_become_shoal_errors():
    from shoal.dataparallel.torch.backend import shoal_error_from
    from shoal.errors import CollectiveError, CollectiveTimeoutError, PeerLostError

    lost = shoal_error_from(RuntimeError("PeerLostError: allreduce: rank 1 (pid 9) exited"))
    assert isinstance(lost, PeerLostError)
    assert str(lost) == "allreduce: rank 1 (pid 9) exited"
    late = shoal_error_from(RuntimeError("[rank0] CollectiveTimeoutError: barrier: ranks 2, 3"))
    assert isinstance(late, CollectiveTimeoutError)
    assert isinstance(shoal_error_from(RuntimeError("CollectiveError: bad root")), CollectiveError)
    assert shoal_error_from(RuntimeError("mat1 and mat2 shapes cannot be multiplied")) is None


def test_async_handles_translate_errors():
    from shoal.errors import PeerLostError

    class FailingWork:
        def wait(self):
            raise RuntimeError("PeerLostError: broadcast: rank 3 exited")

    with pytest.raises(PeerLostError, match="broadcast: rank 3 exited"):
        sdist.Work(FailingWork()).wait()


def test_async_op_returns_a_handle(world_of_one):
    tensor = torch.ones(3)
    handle = sdist.all_reduce(tensor, async_op=True)
    assert isinstance(handle, sdist.Work)
    assert handle.wait()
    assert handle.is_completed()
    assert sdist.barrier() is None


def test_local_view_without_a_core(world_of_one, monkeypatch):
    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
    sdist.init_process_group()  # already initialized by torch: adopts the group
    assert sdist.group.WORLD is torch_dist.group.WORLD
    assert (sdist.get_local_rank(), sdist.get_local_size()) == (0, 1)
