"""DistributedGradientTape and the gradient reduction behind it, in one process that plays
rank 0 of two: the peer's contribution is scripted (its values are ours plus one, its
IndexedSlices rows are ours), so the reduced values are known."""

from __future__ import annotations

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
pytest.importorskip("shoal.dataparallel._core")
from shoal.dataparallel import core  # noqa: E402
from shoal.errors import ValidationError  # noqa: E402

pytestmark = [pytest.mark.runtime, pytest.mark.tensorflow]


class ScriptedPeer:
    """Rank 1's side of every collective, as seen by rank 0."""

    def __init__(self):
        self.reductions = []

    def reduce_arrays(self, arrays, op, bucket_bytes=None, group=None):
        self.reductions.append((len(arrays), op, bucket_bytes))
        out = []
        for array in arrays:
            pair = np.stack([np.asarray(array, np.float64), np.asarray(array, np.float64) + 1])
            reduced = {"average": pair.mean(0), "sum": pair.sum(0), "min": pair.min(0), "max": pair.max(0)}[op]
            out.append(reduced.astype(array.dtype))
        return out

    def gather_rows(self, array, group=None):
        return np.concatenate([array, array], axis=0)


@pytest.fixture
def peer(sdp, monkeypatch):
    from shoal.dataparallel.tensorflow import topology, wire

    scripted = ScriptedPeer()
    monkeypatch.setattr(wire, "reduce_arrays", scripted.reduce_arrays)
    monkeypatch.setattr(wire, "gather_rows", scripted.gather_rows)
    two = core.Communicator(rank=0, size=2, local_rank=0, local_size=2, host_index=0, num_hosts=1, host="h")
    monkeypatch.setitem(topology._state, "communicator", two)
    return scripted


def test_tape_returns_averaged_gradients_in_the_sources_structure(sdp, peer):
    w = tf.Variable([1.0, 2.0])
    b = tf.Variable(3.0, dtype=tf.float64)
    unused = tf.Variable(0.0)
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(w * w) + tf.cast(b, tf.float32) * 2.0
    tape = sdp.DistributedGradientTape(tape)
    grads = tape.gradient(loss, {"w": w, "nested": [b, unused]})
    assert grads["w"].numpy().tolist() == [2.5, 4.5]  # (2w + 2w + 1) / 2
    assert grads["nested"][0].dtype == tf.float64 and grads["nested"][0].numpy() == 2.5
    assert grads["nested"][1] is None
    assert peer.reductions == [(2, "average", 25 * 1024 * 1024)]  # one fused call for both


def test_tape_op_compression_and_bucket_are_passed_through(sdp, peer):
    w = tf.Variable([1.0, 2.0])
    with tf.GradientTape(persistent=True) as tape:
        loss = tf.reduce_sum(w * w)
    summed = sdp.DistributedGradientTape(tape, op=sdp.ReduceOp.SUM, bucket_cap_mb=1,
                                         compression=sdp.Compression.fp16)
    grad = summed.gradient(loss, [w])[0]
    assert grad.dtype == tf.float32 and grad.numpy().tolist() == [5.0, 9.0]
    assert peer.reductions[-1] == (1, "sum", 1024 * 1024)


def test_tape_is_usable_as_the_recording_context(sdp, peer):
    w = tf.Variable(2.0)
    x = tf.constant(3.0)
    with sdp.DistributedGradientTape(tf.GradientTape(persistent=True)) as tape:
        tape.watch(x)  # the wrapped tape's own methods
        loss = w * x
    assert tape.gradient(loss, w).numpy() == 3.5
    assert tape.gradient(loss, x).numpy() == 2.5  # a persistent tape answers twice


def test_embedding_gradients_are_gathered_or_densified(sdp, peer):
    table = tf.Variable(np.arange(12, dtype=np.float32).reshape(6, 2))
    ids = tf.constant([1, 4, 1])
    with tf.GradientTape(persistent=True) as tape:
        loss = tf.reduce_sum(tf.gather(table, ids) * 3.0)
    local = tf.convert_to_tensor(tape.gradient(loss, table)).numpy()
    gathered = sdp.DistributedGradientTape(tape).gradient(loss, table)
    assert isinstance(gathered, tf.IndexedSlices)
    assert gathered.indices.numpy().tolist() == [1, 4, 1, 1, 4, 1]  # both ranks' rows
    np.testing.assert_allclose(tf.convert_to_tensor(gathered).numpy(), local)  # the peer's equal ours
    dense = sdp.DistributedGradientTape(tape, sparse_as_dense=True).gradient(loss, table)
    assert isinstance(dense, tf.Tensor)
    np.testing.assert_allclose(dense.numpy(), local + 0.5)


def test_tape_in_a_graph_reduces_all_gradients_with_one_op(sdp):
    layers = [tf.Variable(tf.ones([4, 4])) for _ in range(12)]

    def step(x):
        with tf.GradientTape() as tape:
            for layer in layers:
                x = tf.matmul(x, layer)
            loss = tf.reduce_sum(x)
        return sdp.DistributedGradientTape(tape).gradient(loss, layers)

    graph = tf.function(step).get_concrete_function(tf.TensorSpec([1, 4])).graph
    ops = [op for op in graph.get_operations() if op.type in ("PyFunc", "EagerPyFunc")]
    assert len(ops) == 1 and len(ops[0].inputs) == 1  # one packed float32 buffer
    grads = tf.function(step)(tf.ones([1, 4]))
    assert len(grads) == 12 and all(g.shape == (4, 4) for g in grads)


@pytest.mark.parametrize("argument", ["device_dense", "device_sparse"])
def test_device_arguments_are_not_supported(sdp, argument):
    with pytest.raises(ValidationError, match=f"'{argument}' is not supported"):
        sdp.DistributedGradientTape(tf.GradientTape(), **{argument: "/gpu:0"})


def test_tape_must_wrap_a_gradient_tape(sdp):
    with pytest.raises(TypeError, match="'gradtape' must be a tf.GradientTape"):
        sdp.DistributedGradientTape(object())


def test_reduce_settings_carry_the_limits():
    from shoal.dataparallel.tensorflow.gradients import ReduceSettings

    assert ReduceSettings().bucket_bytes == 25 * 1024 * 1024
    assert ReduceSettings(op=None).op.name == "AVERAGE"
    with pytest.raises(ValidationError, match=r"'bucket_cap_mb' must be > 0 \(got 0\)"):
        ReduceSettings(bucket_cap_mb=0)
    with pytest.raises(ValidationError, match="multiple of 128 bytes"):
        ReduceSettings(bucket_cap_mb=1e-6)
    with pytest.raises(TypeError, match="'sparse_as_dense' must be"):
        ReduceSettings(sparse_as_dense="yes")
