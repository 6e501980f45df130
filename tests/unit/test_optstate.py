"""Optimizer-state sharding's pure logic: who owns which parameter, the buckets of a sharded
gradient sync, SMP's refusals with their messages, and the bytes an optimizer holds."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from shoal.modelparallel.config import resolve  # noqa: E402
from shoal.modelparallel.errors import SMPConfigError, SMPUsageError  # noqa: E402
from shoal.modelparallel.torch.gradsync import _bucket_indices  # noqa: E402
from shoal.modelparallel.torch.optstate import (  # noqa: E402
    assign,
    check_dtypes,
    check_model,
    state_bytes,
)


def loads(sizes, owners, parts):
    out = [0] * parts
    for size, owner in zip(sizes, owners):
        out[owner] += size
    return out


def test_assign_is_largest_first_to_the_least_loaded():
    assert assign([10, 40, 30, 20], 2) == [0, 0, 1, 1]  # 40 then 10 | 30 then 20: 50 / 50
    assert assign([5, 5, 5, 5], 4) == [0, 1, 2, 3]  # ties to the lower rank, in order
    assert assign([7, 3], 1) == [0, 0]
    assert assign([], 3) == []


@pytest.mark.parametrize("parts", [2, 3, 4, 8])
def test_assign_balances_within_the_largest_tensor(parts):
    sizes = [(i * 7919) % 1000 + 1 for i in range(200)]
    shares = loads(sizes, assign(sizes, parts), parts)
    assert max(shares) <= sum(sizes) / parts + max(sizes)
    assert max(shares) - min(shares) <= max(sizes)


def test_assign_is_deterministic():
    sizes = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5]
    assert all(assign(sizes, 3) == assign(list(sizes), 3) for _ in range(5))


def test_sharded_buckets_hold_one_owner_each():
    params = [torch.nn.Parameter(torch.zeros(n)) for n in (4, 4, 4, 4, 4)]
    owners = [0, 1, 0, 1, 0]
    buckets = _bucket_indices(params, limit=10**6, owners=owners)
    assert sorted(i for b in buckets for i in b) == list(range(5))
    assert all(len({owners[i] for i in b}) == 1 for b in buckets)
    assert _bucket_indices(params, limit=10**6) == [[4, 3, 2, 1, 0]]  # unsharded: one


def test_one_dtype_is_required():
    check_dtypes([torch.zeros(2), torch.zeros(3)])
    with pytest.raises(SMPUsageError) as info:
        check_dtypes([torch.zeros(2), torch.zeros(2, dtype=torch.float16),
                      torch.zeros(2, dtype=torch.bfloat16)])
    assert str(info.value) == (
        "Currently shard_optimizer_state is supported only when all parameters in the model "
        "have the same dtype. Found torch.bfloat16, torch.float16, torch.float32.")


def test_the_model_conditions():
    check_model(resolve({}, {}), gradient_as_bucket_view=False)  # not asked for: no rule
    sharded = resolve({"shard_optimizer_state": True, "ddp": True}, {})
    check_model(sharded, gradient_as_bucket_view=True)
    with pytest.raises(SMPUsageError) as info:
        check_model(sharded, gradient_as_bucket_view=False)
    assert str(info.value) == ("gradient_as_bucket_view must be True when "
                               "shard_optimizer_state is True.")
    with pytest.raises(SMPConfigError) as info:
        check_model(resolve({"shard_optimizer_state": True}, {}), gradient_as_bucket_view=True)
    assert str(info.value) == ("Setting config parameter shard_optimizer_state to non-default "
                               "value True requires ddp to be set to True. Found: False")


def test_state_bytes_counts_state_and_masters():
    params = [torch.nn.Parameter(torch.ones(10)), torch.nn.Parameter(torch.ones(6))]
    adam = torch.optim.Adam(params, lr=0.1)
    assert state_bytes(adam) == 0
    params[0].grad = torch.ones(10)  # only the first is stepped: state for it alone
    adam.step()
    assert state_bytes(adam) == 2 * 10 * 4 + 4  # two moments and the step count

    class Wrapper:  # what Bit16Optimizer exposes: .optimizer and (param, master) pairs
        optimizer = adam
        _pairs = [(params[0], torch.zeros(10)), (params[1], torch.zeros(0))]

    assert state_bytes(Wrapper()) == 2 * 10 * 4 + 4 + 10 * 4
