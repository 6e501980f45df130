"""The collective core's reduction kernels, run on local buffers through the
binding's test hook and compared bit for bit with numpy."""

from __future__ import annotations

import numpy as np
import pytest

core_binding = pytest.importorskip("shoal.dataparallel._core")
ml_dtypes = pytest.importorskip("ml_dtypes")

from shoal.dataparallel.core import DTYPES, OPS  # noqa: E402

pytestmark = pytest.mark.runtime

STORAGE = {"float32": np.float32, "float64": np.float64, "float16": np.float16,
           "bfloat16": ml_dtypes.bfloat16, "int32": np.int32, "int64": np.int64}
ACC = {"float16": np.float32, "bfloat16": np.float32}


def model(sources, dtype, op, divisor):
    acc_t = ACC.get(dtype, STORAGE[dtype])
    acc = sources[0].astype(acc_t)
    with np.errstate(over="ignore", invalid="ignore"):
        for s in sources[1:]:
            v = s.astype(acc_t)
            acc = {"sum": acc + v, "average": acc + v, "min": np.where(v < acc, v, acc),
                   "max": np.where(v > acc, v, acc), "product": acc * v}[op]
        if divisor > 1:
            if np.issubdtype(acc.dtype, np.integer):
                acc = np.where(acc < 0, -((-acc) // divisor), acc // divisor)
            else:
                acc = acc / acc.dtype.type(divisor)
        return acc.astype(STORAGE[dtype])


def run(sources, dtype, op, divisor=1):
    out = np.empty_like(sources[0])
    raw = [s.view(np.uint8) for s in sources]
    core_binding._reduce_local(out.view(np.uint8), raw, DTYPES[dtype], OPS[op], divisor)
    return out


def random_sources(rng, dtype, n, count):
    if dtype.startswith("int"):
        return [rng.integers(-(1 << 20), 1 << 20, n).astype(dtype) for _ in range(count)]
    return [(rng.standard_normal(n) * 100).astype(np.float32).astype(STORAGE[dtype])
            for _ in range(count)]


@pytest.mark.parametrize("dtype", list(STORAGE))
@pytest.mark.parametrize("op", ["sum", "min", "max", "product"])
def test_kernel_matches_numpy_in_fixed_order(dtype, op):
    rng = np.random.default_rng(5)
    for count in (1, 2, 3, 5):
        for n in (1, 7, 2049, 5003):
            sources = random_sources(rng, dtype, n, count)
            got = run(sources, dtype, op)
            assert got.tobytes() == model(sources, dtype, op, 1).tobytes(), (count, n)


@pytest.mark.parametrize("dtype", list(STORAGE))
def test_average_divides_once_at_the_end(dtype):
    rng = np.random.default_rng(6)
    sources = random_sources(rng, dtype, 3001, 3)
    got = run(sources, dtype, "average", divisor=3)
    assert got.tobytes() == model(sources, dtype, "average", 3).tobytes()
    if dtype.startswith("int"):  # truncates toward zero, like C++
        assert run([np.array([-7], dtype), np.array([0], dtype)], dtype, "average", 2)[0] == -3


def test_integer_sum_wraps_around():
    big = np.array([np.iinfo(np.int32).max], dtype=np.int32)
    assert run([big, np.ones(1, np.int32)], "int32", "sum")[0] == np.iinfo(np.int32).min


def test_output_may_alias_a_source():
    a = np.arange(10000, dtype=np.float32)
    b = np.ones(10000, dtype=np.float32)
    core_binding._reduce_local(a.view(np.uint8), [b.view(np.uint8), a.view(np.uint8)],
                               DTYPES["float32"], OPS["sum"], 1)
    assert np.array_equal(a, np.arange(10000, dtype=np.float32) + 1)


def test_every_fp16_value_survives_the_fp32_round_trip():
    bits = np.arange(1 << 16, dtype=np.uint16)
    values = bits.view(np.float16)
    got = run([values], "float16", "sum").view(np.uint16)
    finite = ~np.isnan(values)
    assert np.array_equal(got[finite], bits[finite])
    assert np.isnan(got.view(np.float16)[~finite]).all()


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_sums_round_to_nearest_even(dtype):
    rng = np.random.default_rng(7)
    store = STORAGE[dtype]
    # Random bit patterns cover subnormals, overflow to infinity and ties.
    a = rng.integers(0, 1 << 16, 200000, dtype=np.uint16).view(store)
    b = rng.integers(0, 1 << 16, 200000, dtype=np.uint16).view(store)
    keep = ~(np.isnan(a.astype(np.float32)) | np.isnan(b.astype(np.float32)))
    a, b = a[keep], b[keep]
    got = run([a, b], dtype, "sum")
    with np.errstate(invalid="ignore", over="ignore"):
        want = (a.astype(np.float32) + b.astype(np.float32)).astype(store)
    same = (got.view(np.uint16) == want.view(np.uint16)) | (
        np.isnan(got.astype(np.float32)) & np.isnan(want.astype(np.float32)))
    assert same.all()
