"""DistributedOptimizer for Keras and TF1 optimizers, in one process that plays rank 0 of
two (the peer's gradients are ours plus one, so averaged gradients are ours plus 0.5)."""

from __future__ import annotations

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")
pytest.importorskip("shoal.dataparallel._core")
from shoal.dataparallel import core  # noqa: E402
from shoal.errors import ValidationError  # noqa: E402

pytestmark = [
    pytest.mark.runtime,
    pytest.mark.tensorflow,
    # TensorFlow's own conversion of bfloat16 and Keras tensors under numpy 2.
    pytest.mark.filterwarnings("ignore:__array__ implementation doesn't accept a copy keyword"),
]


@pytest.fixture
def peer(sdp, monkeypatch):
    from shoal.dataparallel.tensorflow import topology, wire

    calls = []

    def reduce_arrays(arrays, op, bucket_bytes=None, group=None):
        calls.append((len(arrays), op, bucket_bytes))
        assert op == "average"
        return [(np.asarray(a, np.float64) + 0.5).astype(a.dtype) for a in arrays]

    monkeypatch.setattr(wire, "reduce_arrays", reduce_arrays)
    two = core.Communicator(rank=0, size=2, local_rank=0, local_size=2, host_index=0, num_hosts=1, host="h")
    monkeypatch.setitem(topology._state, "communicator", two)
    return calls


def test_keras_optimizer_applies_averaged_gradients_and_keeps_its_identity(sdp, peer):
    plain = keras.optimizers.SGD(learning_rate=1.0)
    config = plain.get_config()
    opt = sdp.DistributedOptimizer(plain, bucket_cap_mb=2)
    assert opt is plain and isinstance(opt, keras.optimizers.SGD)
    assert type(opt).__name__ == "SGD" and type(opt).__module__ == keras.optimizers.SGD.__module__
    assert opt.get_config() == config
    w = tf.Variable([1.0, 2.0])
    opt.apply_gradients([(tf.constant([1.0, 1.0]), w)])
    assert w.numpy().tolist() == [-0.5, 0.5]
    assert peer == [(1, "average", 2 * 1024 * 1024)]


def test_keras_fit_reduces_every_step(sdp, peer, tmp_path):
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    model.compile(optimizer=sdp.DistributedOptimizer(keras.optimizers.SGD(0.1)), loss="mse")
    model.fit(np.ones((8, 3), np.float32), np.ones((8, 2), np.float32), batch_size=4, verbose=0)
    assert len(peer) == 2 and peer[0][0] == 1  # kernel and bias in one buffer, once per step
    # A saved model names the original optimizer: it loads without Shoal.
    path = tmp_path / "model.keras"
    model.save(path)
    loaded = keras.models.load_model(path)
    assert type(loaded.optimizer) is keras.optimizers.SGD


def test_wrapping_twice_or_wrapping_something_else_is_an_error(sdp):
    opt = sdp.DistributedOptimizer(keras.optimizers.Adam())
    with pytest.raises(ValidationError, match="already a DistributedOptimizer"):
        sdp.DistributedOptimizer(opt)
    with pytest.raises(ValidationError, match="'optimizer' must be a keras.optimizers.Optimizer"):
        sdp.DistributedOptimizer(object())
    with pytest.raises(ValidationError, match="'device_sparse' is not supported"):
        sdp.DistributedOptimizer(keras.optimizers.Adam(), device_sparse="/cpu:0")
    with pytest.raises(ValidationError, match="'bucket_cap_mb' must be > 0"):
        sdp.DistributedOptimizer(keras.optimizers.Adam(), bucket_cap_mb=-1)


def test_tf1_optimizer_in_a_graph_session(sdp, peer):
    with tf.Graph().as_default():
        v = tf.compat.v1.Variable(1.0)
        plain = tf.compat.v1.train.GradientDescentOptimizer(0.1)
        opt = sdp.DistributedOptimizer(plain)
        train = opt.minimize(v * v)
        assert opt.get_name() == "DistributedGradientDescentOptimizer"
        with tf.compat.v1.Session() as session:
            session.run(tf.compat.v1.global_variables_initializer())
            session.run(train)
            assert session.run(v) == pytest.approx(1.0 - 0.1 * 2.5)
