"""The numpy side of the TensorFlow collectives (``shoal.dataparallel.tensorflow.wire``):
on the real core with one rank, and on a scripted core that plays the other ranks."""

from __future__ import annotations

import os
import uuid

import ml_dtypes
import numpy as np
import pytest

pytest.importorskip("shoal.dataparallel._core")
pytest.importorskip("tensorflow")
from shoal.dataparallel import core  # noqa: E402
from shoal.dataparallel.tensorflow import wire  # noqa: E402

pytestmark = [pytest.mark.runtime, pytest.mark.tensorflow]


@pytest.fixture
def single(monkeypatch):
    for key in list(os.environ):
        if key.startswith(("OMPI_", "PMI", "SHOAL_")) or key in ("RANK", "WORLD_SIZE", "MASTER_PORT"):
            monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("SHOAL_JOB_ID", uuid.uuid4().hex[:12])
    core.shutdown()
    core.init()
    yield
    core.shutdown()


class ScriptedCore:
    """Plays a job where every peer holds this rank's values (SUM doubles them) and
    records the order of calls."""

    def __init__(self, root_payload=None, rows=None):
        self.calls = []
        self.root_payload = root_payload
        self.rows = rows

    def allreduce_async(self, array, op, group=None):
        self.calls.append(("queue", array.nbytes, op))
        return self

    def wait(self):
        self.calls.append(("wait",))

    def flush(self, group=None):
        self.calls.append(("flush",))

    def broadcast(self, packed, root, group=None):
        self.calls.append(("broadcast", packed.nbytes, root))
        packed[:] = self.root_payload

    def allgather(self, array, group=None):
        self.calls.append(("allgather", array.shape))
        if array.shape == (1,):  # the row counts
            return np.array([[len(r)] for r in self.rows], dtype=np.int64)
        longest = array.shape[0]
        out = np.zeros((len(self.rows), *array.shape), dtype=array.dtype)
        for index, rows in enumerate(self.rows):
            out[index, : len(rows)] = rows
        assert longest == max(len(r) for r in self.rows)
        return out


def read_only(array):
    array = np.array(array)
    array.flags.writeable = False  # as TensorFlow hands tensors to numpy_function
    return array


def test_reduce_arrays_queues_everything_before_waiting_and_flushes_per_bucket(monkeypatch):
    scripted = ScriptedCore()
    monkeypatch.setattr(wire, "core", scripted)
    arrays = [read_only(np.ones(100, np.float32)) for _ in range(5)]  # 400 bytes each
    out = wire.reduce_arrays(arrays, "average", bucket_bytes=1000)
    kinds = [c[0] for c in scripted.calls]
    assert kinds == ["queue", "queue", "queue", "flush", "queue", "queue", "wait", "wait", "wait", "wait", "wait"]
    assert all(c[2] == "average" for c in scripted.calls if c[0] == "queue")
    assert all(o is not a and o.flags.writeable for o, a in zip(out, arrays))


def test_reduce_arrays_without_a_bucket_leaves_fusion_to_the_core(monkeypatch):
    scripted = ScriptedCore()
    monkeypatch.setattr(wire, "core", scripted)
    wire.reduce_arrays([np.ones(10**6, np.float32)] * 3, "sum")
    assert "flush" not in [c[0] for c in scripted.calls]


def test_reduce_arrays_on_one_rank_keeps_values_dtypes_and_shapes(single):
    arrays = [read_only(np.arange(6, dtype=d).reshape(2, 3)) for d in ("float32", "float64", "int32", "int64", "float16")]
    arrays.append(read_only(np.arange(4).astype(ml_dtypes.bfloat16)))
    arrays.append(read_only(np.float32(2.5)))  # 0-d
    for op in ("average", "sum", "min", "max"):
        out = wire.reduce_arrays(arrays, op)
        for got, given in zip(out, arrays):
            assert got.dtype == given.dtype and got.shape == given.shape
            assert np.array_equal(got, given)


def test_broadcast_arrays_moves_everything_in_one_packed_collective(monkeypatch):
    roots = [np.arange(6, dtype=np.float32).reshape(2, 3), np.array(7, dtype=np.int64),
             np.array([True, False, True]), np.arange(5).astype(ml_dtypes.bfloat16),
             np.zeros((0, 4), np.float64)]
    payload = np.concatenate([r.reshape(-1).view(np.uint8) for r in roots])
    scripted = ScriptedCore(root_payload=payload)
    monkeypatch.setattr(wire, "core", scripted)
    mine = [read_only(np.zeros_like(r)) for r in roots]
    out = wire.broadcast_arrays(mine, root=1)
    assert scripted.calls == [("broadcast", payload.nbytes, 1)]
    for got, want in zip(out, roots):
        assert got.dtype == want.dtype and got.shape == want.shape
        assert got.tobytes() == want.tobytes()


def test_broadcast_arrays_on_one_rank_and_with_nothing_to_send(single):
    out = wire.broadcast_arrays([read_only(np.float16(3)), read_only(np.arange(3))], root=0)
    assert out[0].shape == () and out[0] == np.float16(3)
    assert np.array_equal(out[1], np.arange(3))
    assert wire.broadcast_arrays([np.zeros(0, np.int32)], root=0)[0].shape == (0,)


def test_gather_rows_concatenates_uneven_ranks_in_rank_order(monkeypatch):
    rows = [np.array([[1, 1]]), np.array([[2, 2], [2, 3], [2, 4]]), np.zeros((0, 2), np.int64)]
    scripted = ScriptedCore(rows=rows)
    monkeypatch.setattr(wire, "core", scripted)
    out = wire.gather_rows(read_only(rows[1]))
    assert out.tolist() == [[1, 1], [2, 2], [2, 3], [2, 4]]
    assert [c[0] for c in scripted.calls] == ["allgather", "allgather"]


def test_gather_rows_on_one_rank(single):
    assert wire.gather_rows(np.float64(4.0)).tolist() == [4.0]
    assert wire.gather_rows(np.zeros((0, 3), np.float32)).shape == (0, 3)
    assert wire.gather_rows(np.arange(6).reshape(3, 2)).tolist() == [[0, 1], [2, 3], [4, 5]]
