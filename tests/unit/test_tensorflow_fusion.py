"""The tensor fusion plan (pure) and the packing of grouped reductions it drives."""

from __future__ import annotations

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
pytest.importorskip("shoal.dataparallel._core")
from shoal.dataparallel.tensorflow.fusion import plan_buckets  # noqa: E402

pytestmark = [pytest.mark.tensorflow]


def test_one_bucket_per_dtype_in_order_of_first_appearance():
    dtypes = ["float32", "int64", "float32", "float16", "int64", "float32"]
    assert plan_buckets(dtypes, [4] * 6, None) == [[0, 2, 5], [1, 4], [3]]


def test_buckets_close_at_the_cap_and_a_big_tensor_stands_alone():
    nbytes = [400, 400, 400, 5000, 100, 100]
    assert plan_buckets(["float32"] * 6, nbytes, 1000) == [[0, 1], [2], [3], [4, 5]]
    assert plan_buckets(["float32"] * 3, [1000, 1, 999], 1000) == [[0], [1, 2]]


def test_nothing_to_plan_and_mismatched_lengths():
    assert plan_buckets([], [], 10) == []
    with pytest.raises(ValueError):
        plan_buckets(["float32"], [], 10)


@pytest.mark.runtime
def test_grouped_reduction_packs_per_dtype_bucket_and_cuts_back(sdp, monkeypatch):
    from shoal.dataparallel.tensorflow import wire

    seen = []
    real = wire.reduce_arrays

    def recording(arrays, op, bucket_bytes=None, group=None):
        seen.append([(a.dtype.name, a.shape) for a in arrays])
        return real(arrays, op, bucket_bytes, group)

    monkeypatch.setattr(wire, "reduce_arrays", recording)
    tensors = [tf.reshape(tf.range(6.0), (2, 3)), tf.constant(7, tf.int64), tf.constant([1.5]),
               tf.zeros([0, 4]), tf.constant([[1, 2]], tf.int64)]
    out = sdp.grouped_allreduce(tensors, bucket_bytes=16)
    # float32: 24 bytes alone, then 4 + 0; int64: 8, then 16 (8 + 16 passes the cap).
    assert seen == [[("float32", (6,)), ("float32", (1,)), ("int64", (1,)), ("int64", (2,))]]
    for got, given in zip(out, tensors):
        assert got.dtype == given.dtype and got.shape == given.shape
        assert np.array_equal(got.numpy(), given.numpy())


@pytest.mark.runtime
def test_grouped_reduction_with_shapes_known_only_at_run_time(sdp):
    @tf.function(input_signature=[tf.TensorSpec([None, 2]), tf.TensorSpec([None])])
    def reduce(a, b):
        out = sdp.grouped_allreduce([a, b])
        assert out[0].shape.as_list() == [None, 2] and out[1].shape.as_list() == [None]
        return out

    a, b = tf.reshape(tf.range(6.0), (3, 2)), tf.constant([4.0, 5.0])
    got = reduce(a, b)
    assert np.array_equal(got[0].numpy(), a.numpy()) and np.array_equal(got[1].numpy(), b.numpy())
