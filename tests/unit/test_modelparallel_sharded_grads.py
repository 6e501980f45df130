"""The sharded gradient reducer: what a step holds and what its shards end up with."""

import pytest

torch = pytest.importorskip("torch")

from shoal.modelparallel.torch.sharded.grads import GradientReducer  # noqa: E402
from shoal.modelparallel.torch.sharded.groups import SOLO, ShardGroups  # noqa: E402
from shoal.modelparallel.torch.sharded.params import shard_parameter  # noqa: E402


def reducer_of(params, bucket):
    groups = ShardGroups(degree=1, rank=0, members=(0,), replicas=(0,), gather=SOLO,
                         prefetch=SOLO, reduce=SOLO, control=SOLO, replica=SOLO)
    for p in params:
        shard_parameter(p, 1, 0, threshold=0)
    reducer = GradientReducer(groups, bucket)
    reducer.attach(params)
    return reducer


def test_microbatches_add_into_one_waiting_gradient_per_parameter():
    a, b = torch.nn.Parameter(torch.zeros(6)), torch.nn.Parameter(torch.zeros(4))
    reducer = reducer_of([a, b], bucket=1000)
    grads = [(torch.arange(6.0), torch.ones(4)), (torch.full((6,), 2.0), torch.full((4,), 3.0))]
    for ga, gb in grads:  # two microbatches' backwards
        reducer.add(a, ga.clone())
        reducer.add(b, gb.clone())
    assert len(reducer._pending) == 2  # not one entry per microbatch
    assert reducer._pending_elements == 10
    reducer.finish_step()
    assert torch.equal(reducer.views[id(a)], torch.arange(6.0) + 2.0)
    assert torch.equal(reducer.views[id(b)], torch.full((4,), 4.0))
    assert reducer._pending == {}


def test_a_gradient_after_its_bucket_left_starts_a_new_entry():
    a, b = torch.nn.Parameter(torch.zeros(6)), torch.nn.Parameter(torch.zeros(4))
    reducer = reducer_of([a, b], bucket=6)  # a alone fills a bucket
    reducer.add(a, torch.ones(6))  # flushed at once
    assert reducer._pending == {}
    reducer.add(b, torch.ones(4))
    reducer.add(a, torch.ones(6))  # the next microbatch's: a bucket of its own again
    reducer.finish_step()
    assert torch.equal(reducer.views[id(a)], torch.full((6,), 2.0))
    assert torch.equal(reducer.views[id(b)], torch.ones(4))


def test_16_bit_gradients_are_summed_in_float32():
    a = torch.nn.Parameter(torch.zeros(3, dtype=torch.bfloat16))
    reducer = reducer_of([a], bucket=1000)
    big, small = torch.full((3,), 256.0, dtype=torch.bfloat16), torch.ones(3, dtype=torch.bfloat16)
    reducer.add(a, big)
    reducer.add(a, small)  # 257 is not a bfloat16: its sum would round back to 256
    reducer.finish_step()
    assert torch.equal(reducer.views[id(a)], torch.full((3,), 257.0))
