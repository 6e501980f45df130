"""init/size/rank/shutdown of the TensorFlow API in one process, and the
``smdistributed.dataparallel.tensorflow`` name resolving to it."""

from __future__ import annotations

import pytest

pytest.importorskip("shoal.dataparallel._core")
pytest.importorskip("tensorflow")
from shoal.errors import RuntimeFailure  # noqa: E402

pytestmark = [pytest.mark.runtime, pytest.mark.tensorflow]


def test_topology_of_a_single_process(sdp_module):
    assert not sdp_module.is_initialized()
    sdp_module.init()
    assert sdp_module.is_initialized()
    assert (sdp_module.size(), sdp_module.rank(), sdp_module.local_size(), sdp_module.local_rank()) == (1, 0, 1, 0)


@pytest.mark.parametrize("name", ["size", "rank", "local_size", "local_rank"])
def test_topology_before_init_is_an_error(sdp_module, name):
    with pytest.raises(RuntimeFailure, match="call init"):
        getattr(sdp_module, name)()


def test_a_second_init_is_an_error_as_in_the_closed_library(sdp_module):
    sdp_module.init()
    with pytest.raises(RuntimeFailure, match="more than once"):
        sdp_module.init()


def test_init_after_shutdown_joins_again(sdp_module):
    sdp_module.init()
    sdp_module.shutdown()
    assert not sdp_module.is_initialized()
    sdp_module.init()
    assert sdp_module.size() == 1


def test_collectives_before_init_are_an_error(sdp_module):
    import tensorflow as tf

    with pytest.raises(RuntimeFailure, match="call init"):
        sdp_module.allreduce(tf.constant([1.0]), 0, 1)
    with pytest.raises(RuntimeFailure, match="call init"):
        sdp_module.broadcast(tf.constant([1.0]), 0)


def test_smdistributed_name_is_the_same_module(sdp_module):
    import smdistributed.dataparallel.tensorflow as closed_name

    assert closed_name is sdp_module
    for name in ("init", "size", "local_size", "rank", "local_rank", "allreduce", "oob_allreduce",
                 "broadcast", "broadcast_variables", "broadcast_global_variables", "overlap",
                 "DistributedGradientTape", "DistributedOptimizer", "BroadcastGlobalVariablesHook",
                 "ReduceOp", "Compression", "shutdown"):
        assert callable(getattr(closed_name, name)) or hasattr(closed_name, name), name
    assert {op.name for op in closed_name.ReduceOp} == {"SUM", "AVERAGE", "MIN", "MAX"}
