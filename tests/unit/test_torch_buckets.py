"""Gradient bucket planning for the DDP wrapper."""

import pytest
from shoal.dataparallel.torch.parallel.buckets import bucket_cap_bytes, plan_buckets


def test_reverse_order_and_cap():
    assert plan_buckets([4, 4, 4, 4, 4], ["f"] * 5, cap_bytes=8) == [[4, 3], [2, 1], [0]]


def test_every_parameter_in_exactly_one_bucket():
    sizes = [3, 100, 7, 7, 50, 1, 1, 64]
    buckets = plan_buckets(sizes, ["f"] * len(sizes), cap_bytes=60)
    flat = [i for bucket in buckets for i in bucket]
    assert sorted(flat) == list(range(len(sizes)))
    for bucket in buckets:
        assert len(bucket) == 1 or sum(sizes[i] for i in bucket) <= 60


def test_oversized_parameter_gets_its_own_bucket():
    assert plan_buckets([1, 1000, 1], ["f"] * 3, cap_bytes=10) == [[2], [1], [0]]


def test_dtype_change_closes_a_bucket():
    assert plan_buckets([1, 1, 1, 1], ["f", "f", "h", "h"], cap_bytes=100) == [[3, 2], [1, 0]]


def test_empty_and_mismatched():
    assert plan_buckets([], [], cap_bytes=1) == []
    with pytest.raises(ValueError):
        plan_buckets([1], [], cap_bytes=1)


def test_bucket_cap_bytes():
    assert bucket_cap_bytes(None) == 25 * 1024 * 1024
    assert bucket_cap_bytes(0.5) == 512 * 1024
    with pytest.raises(ValueError, match="'bucket_cap_mb' must be > 0 \\(got 0\\)"):
        bucket_cap_bytes(0)
