"""The Python API of the collective core in a single process (world size 1):
topology, argument checking, the environment's validation, async handles and
the link information framework glue uses."""

from __future__ import annotations

import os
import uuid

import numpy as np
import pytest
from shoal.errors import ValidationError

core = pytest.importorskip("shoal.dataparallel.core")
pytest.importorskip("shoal.dataparallel._core")

pytestmark = pytest.mark.runtime


@pytest.fixture
def single(monkeypatch):
    for key in list(os.environ):
        if key.startswith(("OMPI_", "PMI", "SHOAL_")) or key in (
            "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"
        ):
            monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("SHOAL_JOB_ID", uuid.uuid4().hex[:12])
    core.shutdown()
    yield
    core.shutdown()


def test_init_reports_a_single_rank_and_is_idempotent(single):
    comm = core.init()
    assert (comm.rank, comm.size, comm.local_rank, comm.local_size) == (0, 1, 0, 1)
    assert (comm.host_index, comm.num_hosts) == (0, 1)
    assert core.is_initialized()
    assert core.init() == comm


def test_shoal_host_names_the_host(single, monkeypatch):
    monkeypatch.setenv("SHOAL_HOST", "algo-7")
    assert core.init().host == "algo-7"


def test_collectives_before_init_fail_clearly(single):
    with pytest.raises(ValidationError, match="not initialized"):
        core.allreduce(np.ones(3, np.float32))


@pytest.mark.parametrize("op", ["sum", "average", "min", "max", "product"])
def test_one_rank_allreduce_is_the_identity(single, op):
    core.init()
    data = np.array([1.5, -2.0, 3.25], dtype=np.float32)
    assert np.array_equal(core.allreduce(data.copy(), op=op), data)


def test_async_handles_return_their_arrays(single):
    core.init()
    arrays = [np.arange(n, dtype=np.float64) for n in (1, 10, 1000)]
    handles = [core.allreduce_async(a, op="average") for a in arrays]
    for a, h in zip(arrays, handles):
        assert h.wait() is a
        assert h.test()
        assert np.array_equal(a, np.arange(len(a), dtype=np.float64))


def test_broadcast_allgather_reduce_barrier_on_one_rank(single):
    core.init()
    data = np.arange(6, dtype=np.int32).reshape(2, 3)
    assert np.array_equal(core.broadcast(data.copy(), root=0), data)
    gathered = core.allgather(data)
    assert gathered.shape == (1, 2, 3) and np.array_equal(gathered[0], data)
    assert np.array_equal(core.reduce(data.copy(), op="max", root=0), data)
    core.barrier()


def test_root_outside_the_job_is_rejected(single):
    core.init()
    with pytest.raises(ValidationError, match=r"root must be in \[0, 0\] \(got 3\)"):
        core.broadcast(np.ones(2), root=3)


def test_bad_arguments_say_what_was_wrong(single):
    core.init()
    with pytest.raises(ValidationError, match="'op' must be one of"):
        core.allreduce(np.ones(2, np.float32), op="median")
    with pytest.raises(ValidationError, match="'dtype' must be one of"):
        core.allreduce(np.ones(2, np.uint32))
    with pytest.raises(ValidationError, match="C-contiguous"):
        core.allreduce(np.ones((4, 4), np.float32)[:, 1])
    with pytest.raises(ValidationError, match="bfloat16 needs a uint16"):
        core.allreduce(np.ones(2, np.float32), dtype="bfloat16")
    with pytest.raises(ValidationError, match="numpy array"):
        core.allreduce([1.0, 2.0])
    with pytest.raises(ValidationError, match=r"native byte order \(got >f4\)"):
        core.allreduce(np.ones(2, ">f4"))
    # An explicit dtype that names the array's own still takes the checked path.
    assert (core.allreduce(np.ones(2, np.float64), dtype="float64") == 1).all()


def test_bfloat16_bits_in_uint16(single):
    core.init()
    bits = np.array([0x3F80, 0xC000], dtype=np.uint16)  # 1.0, -2.0
    assert np.array_equal(core.allreduce(bits.copy(), dtype="bfloat16"), bits)


@pytest.mark.parametrize(
    "name, value, message",
    [
        ("SHOAL_COLLECTIVE_TIMEOUT", "soon", r"'SHOAL_COLLECTIVE_TIMEOUT' must be an integer \(got 'soon'\)"),
        ("SHOAL_COLLECTIVE_TIMEOUT", "0", r"'SHOAL_COLLECTIVE_TIMEOUT' must be in \[1, 86400\] \(got 0\)"),
        ("SHOAL_FUSION_THRESHOLD_BYTES", "-1", r"'SHOAL_FUSION_THRESHOLD_BYTES' must be in"),
        ("MASTER_PORT", "70000", r"'MASTER_PORT' must be in \[1, 65535\] \(got 70000\)"),
    ],
)
def test_environment_is_validated(single, monkeypatch, name, value, message):
    monkeypatch.setenv(name, value)
    with pytest.raises(ValidationError, match=message):
        core.init()
    assert not core.is_initialized()


def test_rank_must_be_below_world_size(single, monkeypatch):
    monkeypatch.setenv("RANK", "2")
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(ValidationError, match="rank 2 must be < world size 2"):
        core.init()


def test_link_information_points_at_the_built_core():
    assert os.path.isfile(core.library_path())
    assert os.path.isfile(os.path.join(core.include_dir(), "shoal", "core.h"))
    flags = core.link_flags()
    assert f"-l:{os.path.basename(core.library_path())}" in flags
    assert any(f.startswith("-Wl,-rpath,") for f in flags)
