"""broadcast_variables, broadcast_global_variables and BroadcastGlobalVariablesHook in one
process that plays a non-root rank of two: root's values are scripted (ours plus 100)."""

from __future__ import annotations

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")
pytest.importorskip("shoal.dataparallel._core")
from shoal.dataparallel import core  # noqa: E402

pytestmark = [pytest.mark.runtime, pytest.mark.tensorflow]


@pytest.fixture
def root(sdp, monkeypatch):
    from shoal.dataparallel.tensorflow import topology, wire

    calls = []

    def broadcast_arrays(arrays, root_rank, group=None):
        calls.append((len(arrays), root_rank))
        return [(np.asarray(a) + 100).astype(a.dtype) for a in arrays]

    monkeypatch.setattr(wire, "broadcast_arrays", broadcast_arrays)
    two = core.Communicator(rank=1, size=2, local_rank=1, local_size=2, host_index=0, num_hosts=1, host="h")
    monkeypatch.setitem(topology._state, "communicator", two)
    return calls


def test_broadcast_variables_assigns_roots_values_in_one_collective(sdp, root):
    variables = [tf.Variable([1.0, 2.0]), tf.Variable(3, dtype=tf.int64), tf.Variable([[0.5]], dtype=tf.float16)]
    assert sdp.broadcast_variables(variables, root_rank=0) is None
    assert variables[0].numpy().tolist() == [101.0, 102.0]
    assert variables[1].numpy() == 103 and variables[1].dtype == tf.int64
    assert variables[2].numpy().tolist() == [[100.5]]
    assert root == [(3, 0)]


def test_broadcast_variables_in_a_tf_function(sdp, root):
    v = tf.Variable([1.0])

    @tf.function
    def sync():
        sdp.broadcast_variables([v], root_rank=0)
        return v.read_value()

    assert sync().numpy().tolist() == [101.0]


def test_keras_model_and_optimizer_variables(sdp, root):
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    opt = keras.optimizers.Adam()
    opt.build(model.trainable_variables)
    before = [v.numpy().copy() for v in model.variables]
    sdp.broadcast_variables(model.variables, root_rank=0)
    sdp.broadcast_variables(opt.variables, root_rank=0)
    for variable, old in zip(model.variables, before):
        np.testing.assert_allclose(variable.numpy(), old + 100)
    assert int(opt.iterations.numpy()) == 100
    assert root == [(2, 0), (len(opt.variables), 0)]


def test_broadcast_global_variables_eagerly_has_nothing_to_move(sdp):
    assert sdp.broadcast_global_variables(0) is None


def test_hook_broadcasts_global_variables_once_the_session_exists(sdp, root):
    with tf.Graph().as_default():
        v = tf.compat.v1.Variable([1.0, 2.0])
        hook = sdp.BroadcastGlobalVariablesHook(root_rank=0)
        with tf.compat.v1.train.MonitoredSession(hooks=[hook]) as session:
            assert session.run(v).tolist() == [101.0, 102.0]
    assert root == [(1, 0)]
