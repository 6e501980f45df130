"""init/size/rank/shutdown of the TensorFlow API in one process, and the
``smdistributed.dataparallel.tensorflow`` name resolving to it."""

from __future__ import annotations

import importlib
import os
import uuid

import pytest

pytest.importorskip("shoal.dataparallel._core")
pytest.importorskip("tensorflow")
from shoal.errors import RuntimeFailure  # noqa: E402

pytestmark = [pytest.mark.runtime, pytest.mark.tensorflow]


@pytest.fixture
def sdp(monkeypatch):
    for key in list(os.environ):
        if key.startswith(("OMPI_", "PMI", "SHOAL_")) or key in ("RANK", "WORLD_SIZE", "MASTER_PORT"):
            monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("SHOAL_JOB_ID", uuid.uuid4().hex[:12])
    module = importlib.import_module("shoal.dataparallel.tensorflow")
    module.shutdown()
    yield module
    module.shutdown()


def test_topology_of_a_single_process(sdp):
    assert not sdp.is_initialized()
    sdp.init()
    assert sdp.is_initialized()
    assert (sdp.size(), sdp.rank(), sdp.local_size(), sdp.local_rank()) == (1, 0, 1, 0)


@pytest.mark.parametrize("name", ["size", "rank", "local_size", "local_rank"])
def test_topology_before_init_is_an_error(sdp, name):
    with pytest.raises(RuntimeFailure, match="call init"):
        getattr(sdp, name)()


def test_a_second_init_is_an_error_as_in_the_closed_library(sdp):
    sdp.init()
    with pytest.raises(RuntimeFailure, match="more than once"):
        sdp.init()


def test_init_after_shutdown_joins_again(sdp):
    sdp.init()
    sdp.shutdown()
    assert not sdp.is_initialized()
    sdp.init()
    assert sdp.size() == 1


def test_collectives_before_init_are_an_error(sdp):
    import tensorflow as tf

    with pytest.raises(RuntimeFailure, match="call init"):
        sdp.allreduce(tf.constant([1.0]), 0, 1)
    with pytest.raises(RuntimeFailure, match="call init"):
        sdp.broadcast(tf.constant([1.0]), 0)


def test_smdistributed_name_is_the_same_module(sdp):
    import smdistributed.dataparallel.tensorflow as closed_name

    assert closed_name is sdp
    for name in ("init", "size", "local_size", "rank", "local_rank", "allreduce", "oob_allreduce",
                 "broadcast", "broadcast_variables", "broadcast_global_variables", "overlap",
                 "DistributedGradientTape", "DistributedOptimizer", "BroadcastGlobalVariablesHook",
                 "ReduceOp", "Compression", "shutdown"):
        assert callable(getattr(closed_name, name)) or hasattr(closed_name, name), name
    assert {op.name for op in closed_name.ReduceOp} == {"SUM", "AVERAGE", "MIN", "MAX"}
