"""The fixed gradient buckets of the model-parallel runtime's data-parallel averaging."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from shoal.modelparallel.torch.gradsync import _bucket_indices  # noqa: E402


def params(*specs):
    return [torch.nn.Parameter(torch.zeros(n, dtype=dtype)) for n, dtype in specs]


def test_buckets_run_from_the_last_parameter_and_close_at_the_cap():
    ps = params((10, torch.float32), (10, torch.float32), (30, torch.float32), (5, torch.float32))
    # 40, 40, 120 and 20 bytes; cap 100: [3, 2] would be 140 bytes, so 3 stands alone.
    assert _bucket_indices(ps, 100) == [[3], [2], [1, 0]]


def test_a_parameter_larger_than_the_cap_gets_a_bucket_of_its_own():
    ps = params((1000, torch.float32), (1, torch.float32))
    assert _bucket_indices(ps, 16) == [[1], [0]]


def test_each_bucket_holds_one_dtype():
    ps = params((4, torch.float32), (4, torch.float64), (4, torch.float32), (4, torch.float64))
    buckets = _bucket_indices(ps, 1 << 20)
    assert sorted(map(sorted, buckets)) == [[0, 2], [1, 3]]
    for bucket in buckets:
        assert len({ps[i].dtype for i in bucket}) == 1


def test_every_parameter_is_in_exactly_one_bucket():
    ps = params(*[(n, torch.float32) for n in (7, 1, 300, 2, 2, 64, 9)])
    buckets = _bucket_indices(ps, 256)
    assert sorted(i for b in buckets for i in b) == list(range(len(ps)))
