"""TensorFlow collectives in one process (world size 1): argument checks with the
closed library's signatures, dtypes and static shapes kept eagerly and in tf.function,
fp16 compression, IndexedSlices and one fused op per group."""

from __future__ import annotations

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
pytest.importorskip("shoal.dataparallel._core")
from shoal.errors import ValidationError  # noqa: E402

pytestmark = [
    pytest.mark.runtime,
    pytest.mark.tensorflow,
    # TensorFlow's own conversion of bfloat16 and Keras tensors under numpy 2.
    pytest.mark.filterwarnings("ignore:__array__ implementation doesn't accept a copy keyword"),
]


DTYPES = ["float16", "bfloat16", "float32", "float64", "int32", "int64"]


@pytest.mark.parametrize("dtype", DTYPES)
def test_allreduce_keeps_dtype_shape_and_values_eagerly_and_in_graphs(sdp, dtype):
    value = tf.cast(tf.reshape(tf.range(12), (3, 4)), dtype)

    @tf.function
    def graph(t):
        out = sdp.allreduce(t, 0, 1, op=sdp.ReduceOp.SUM)
        assert out.shape == (3, 4)  # static shape known while tracing
        return out

    for run in (lambda t: sdp.allreduce(t, 0, 1), graph):
        out = run(value)
        assert out.dtype == value.dtype and out.shape == value.shape
        assert np.array_equal(out.numpy(), value.numpy())


@pytest.mark.parametrize("dtype", [tf.bool, tf.uint8, tf.complex64])
def test_allreduce_refuses_dtypes_the_core_cannot_reduce(sdp, dtype):
    with pytest.raises(ValidationError, match=f"got {dtype.name}"):
        sdp.allreduce(tf.zeros([2], dtype), 0, 1)


@pytest.mark.parametrize(
    "index, count, message",
    [(1, 1, r"'param_index' must be in \[0, 1\) \(got 1\)"),
     (-1, 3, r"'param_index' must be in \[0, 3\) \(got -1\)"),
     (0, 0, r"'num_params' must be >= 1 \(got 0\)"),
     (0.0, 1, r"'param_index' must be an int \(got 0.0\)"),
     (0, True, r"'num_params' must be an int \(got True\)"),
     (np.int32(2), np.int64(2), r"'param_index' must be in \[0, 2\) \(got 2\)")],
)
def test_allreduce_checks_param_index_and_num_params(sdp, index, count, message):
    with pytest.raises(ValidationError, match=message):
        sdp.allreduce(tf.constant([1.0]), index, count)


def test_op_must_be_a_reduce_op_and_none_means_average(sdp):
    with pytest.raises(ValidationError, match="'op' must be one of ReduceOp.AVERAGE"):
        sdp.allreduce(tf.constant([1.0]), 0, 1, op="sum")
    assert sdp.oob_allreduce(tf.constant([3]), op=None).numpy().tolist() == [3]


def test_compression_must_compress_and_decompress(sdp):
    with pytest.raises(ValidationError, match="'compression' must be"):
        sdp.allreduce(tf.constant([1.0]), 0, 1, compression="fp16")


def test_fp16_compression_travels_as_float16_and_returns_the_input_dtype(sdp):
    value = tf.constant([1.0 + 2**-20, 3.0], tf.float32)  # 1 + 2**-20 does not fit in float16
    for dtype in (tf.float32, tf.float64, tf.bfloat16):
        out = sdp.allreduce(tf.cast(value, dtype), 0, 1, compression=sdp.Compression.fp16)
        assert out.dtype == dtype
        assert out.numpy().astype(np.float64).tolist() == [1.0, 3.0]
    exact = sdp.allreduce(value, 0, 1, compression=sdp.Compression.none)
    assert exact.numpy()[0] == np.float32(1.0 + 2**-20)
    ints = sdp.allreduce(tf.constant([70000], tf.int32), 0, 1, compression=sdp.Compression.fp16)
    assert ints.dtype == tf.int32 and ints.numpy().tolist() == [70000]


def count_collective_ops(function, *args):
    graph = tf.function(function).get_concrete_function(*args).graph
    return sum(op.type in ("PyFunc", "EagerPyFunc", "PyFuncStateless") for op in graph.get_operations())


def test_a_group_of_tensors_is_one_collective_op(sdp):
    specs = [tf.TensorSpec([3], tf.float32), tf.TensorSpec([2, 2], tf.float64),
             tf.TensorSpec([], tf.int64), tf.TensorSpec([5], tf.float16)] * 10
    assert count_collective_ops(lambda *ts: sdp.grouped_allreduce(ts), *specs) == 1
    assert count_collective_ops(lambda *ts: [sdp.allreduce(t, 0, 1) for t in ts], *specs) == len(specs)
    assert count_collective_ops(lambda *ts: sdp.grouped_broadcast(ts, 0), *specs) == 1
    assert sdp.grouped_allreduce([]) == []


def test_broadcast_checks_the_root_and_keeps_any_fixed_size_dtype(sdp):
    for root in (1, -1, "0", True):
        with pytest.raises(ValidationError, match=r"'root_rank' must be an int in \[0, 1\)"):
            sdp.broadcast(tf.constant([1.0]), root)
    assert sdp.broadcast(tf.constant([2.0]), np.int64(0)).numpy().tolist() == [2.0]
    flags = sdp.broadcast(tf.constant([[True, False]]), 0)
    assert flags.dtype == tf.bool and flags.numpy().tolist() == [[True, False]]
    with pytest.raises(ValidationError, match="cannot send a string tensor"):
        sdp.broadcast(tf.constant(["a"]), 0)


def test_allgather_has_an_unknown_first_dimension_in_graphs(sdp):
    @tf.function(input_signature=[tf.TensorSpec([None, 3], tf.float32)])
    def gather(t):
        out = sdp.allgather(t)
        assert out.shape.as_list() == [None, 3]
        return out

    assert gather(tf.ones([2, 3])).shape == (2, 3)
    assert sdp.allgather(tf.constant(5)).numpy().tolist() == [5]


def test_indexed_slices_are_gathered_and_keep_their_dense_shape(sdp):
    slices = tf.IndexedSlices(tf.constant([[1.0, 2.0]]), tf.constant([3]), tf.constant([5, 2]))
    out = sdp.allreduce(slices, 0, 1)
    assert isinstance(out, tf.IndexedSlices)
    assert out.indices.numpy().tolist() == [3]
    assert tf.convert_to_tensor(out).numpy().tolist() == tf.convert_to_tensor(slices).numpy().tolist()
    with pytest.raises(ValidationError, match="SUM or AVERAGE only"):
        sdp.allreduce(slices, 0, 1, op=sdp.ReduceOp.MAX)


def test_overlap_is_the_identity(sdp):
    value = tf.constant([1.5, 2.5])
    assert sdp.overlap(value).numpy().tolist() == [1.5, 2.5]


def test_sum_and_average_pass_gradients_back_min_and_max_do_not(sdp):
    x = tf.Variable([1.0, 2.0])
    for op, want in ((sdp.ReduceOp.SUM, [3.0, 3.0]), (sdp.ReduceOp.AVERAGE, [3.0, 3.0])):
        with tf.GradientTape() as tape:
            y = tf.reduce_sum(sdp.allreduce(x, 0, 1, op=op) * 3.0)
        assert tape.gradient(y, x).numpy().tolist() == want
    with tf.GradientTape() as tape:
        y = tf.reduce_sum(sdp.oob_allreduce(x, op=sdp.ReduceOp.MAX))
    assert tape.gradient(y, x) is None

    @tf.function
    def in_graph():
        with tf.GradientTape() as tape:
            y = tf.reduce_sum(sdp.grouped_allreduce([x, x * 2.0], op=sdp.ReduceOp.SUM)[1])
        return tape.gradient(y, x)

    assert in_graph().numpy().tolist() == [2.0, 2.0]


def test_a_failed_collective_raises_shoals_error_eagerly_and_names_it_in_graphs(sdp, monkeypatch):
    from shoal.dataparallel.tensorflow import wire
    from shoal.errors import CollectiveTimeoutError

    def timed_out(arrays, op, bucket_bytes=None, group=None):
        raise CollectiveTimeoutError("peers did not reach allreduce within 20 s")

    monkeypatch.setattr(wire, "reduce_arrays", timed_out)
    with pytest.raises(CollectiveTimeoutError, match="within 20 s"):
        sdp.allreduce(tf.constant([1.0]), 0, 1)
    with pytest.raises(tf.errors.OpError, match="CollectiveTimeoutError: peers did not reach"):
        tf.function(lambda t: sdp.allreduce(t, 0, 1))(tf.constant([1.0]))
