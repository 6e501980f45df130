"""The backend's host staging (csrc/staging.h) on a machine without a GPU: a fake
accelerator (fake_accelerator/, torch's PrivateUse1 device type backed by host memory)
stands in for CUDA, so every collective and point-to-point operation goes down to pinned host
memory, through the CPU core, and back, with its future on the device (a large allreduce in
chunks whose copies and reductions overlap); the device's own
counters show the staging recorded its events, made the side stream wait and told the
allocator which stream used which tensors. Its copies are synchronous: stream order itself
is the CUDA tests' to check (test_torch_cuda.py)."""

import importlib.util
import os
import sys
import types

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from shoal.launcher.ports import free_port  # noqa: E402
from staged_collectives import (  # noqa: E402
    WORLD,
    assert_trained_alike,
    end_ddp_rank,
    run_collectives,
    train_ddp,
)

torch = pytest.importorskip("torch")

pytestmark = [pytest.mark.torch, pytest.mark.runtime, pytest.mark.slow]

SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fake_accelerator",
                      "fake_accelerator.cpp")
DEVICE = "fakegpu"


@pytest.fixture(scope="module")
def fake_library(tmp_path_factory):
    """The fake accelerator, compiled once for the module's ranks."""
    from torch.utils import cpp_extension

    build = tmp_path_factory.mktemp("fake-accelerator")
    cpp_extension.load(name="shoal_fake_accelerator", sources=[SOURCE],
                       build_directory=str(build))
    return str(build / "shoal_fake_accelerator.so")


def attach_fake_device(library):
    """Load the fake accelerator into this process and name its device type."""
    spec = importlib.util.spec_from_file_location("shoal_fake_accelerator", library)
    fake = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fake)
    fake.register_hooks()
    torch.utils.rename_privateuse1_backend(DEVICE)
    module = types.ModuleType(DEVICE)
    for name, fn in dict(is_available=lambda: True, device_count=lambda: 1,
                         current_device=lambda: 0, is_initialized=lambda: True,
                         _is_in_bad_fork=lambda: False, set_device=lambda index: None,
                         manual_seed_all=lambda seed: None).items():
        setattr(module, name, fn)
    torch._register_device_module(DEVICE, module)
    return fake


# Allreduces above 64 KiB go in chunks (the two larger cases), the others whole.
CHUNK_BYTES = 64 << 10


def rank_main(rank, library, port, dtype_name, size, results):
    os.environ["SHOAL_TORCH_STAGING_CHUNK_BYTES"] = str(CHUNK_BYTES)
    fake = attach_fake_device(library)
    import shoal.dataparallel.torch  # noqa: F401 - registers the backend, the device included
    import torch.distributed as dist

    dist.init_process_group("shoal", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=WORLD)
    failures = run_collectives(dist, torch, torch.device(DEVICE, 0), getattr(torch, dtype_name),
                               size)
    dist.destroy_process_group()
    results.put((rank, failures, fake.counters()))


def spawn(library, dtype, size):
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    results = ctx.SimpleQueue()
    mp.start_processes(rank_main, args=(library, free_port(), dtype, size, results),
                       nprocs=WORLD, start_method="spawn", join=True)
    return {rank: (failures, counters) for rank, failures, counters in
            (results.get() for _ in range(WORLD))}


@pytest.mark.parametrize("dtype,size", [("float32", 1), ("bfloat16", 1000),
                                        ("int64", 100_001), ("uint8", 1 << 20)])
def test_every_operation_is_staged_through_host_memory_and_back(fake_library, dtype, size):
    results = spawn(fake_library, dtype, size)
    nbytes = size * torch.tensor([], dtype=getattr(torch, dtype)).element_size()
    chunks = -(-nbytes // CHUNK_BYTES)  # each waited for on its own, in each of 3 allreduces
    for rank, (failures, counters) in results.items():
        assert counters["events_synchronized"] >= 3 * chunks, counters
        assert failures == [], (rank, failures)
        # every staged call: the caller's stream recorded and the side stream made to wait,
        # the host copies waited for, the tensors recorded on the side stream, the future's
        # completion recorded on it
        assert counters["streams_blocked"] >= 10, counters
        assert counters["events_synchronized"] >= 10, counters
        assert counters["pointers_recorded"] >= 20, counters
        assert counters["events_recorded"] >= 20, counters


def ddp_main(rank, library, port, backend, results):
    if backend == "shoal":
        attach_fake_device(library)
    import shoal.dataparallel.torch  # noqa: F401
    import torch.distributed as dist

    device = torch.device(DEVICE, 0) if backend == "shoal" else torch.device("cpu")
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=WORLD)
    params = train_ddp(torch, device)
    end_ddp_rank(dist, results, (rank, params))


def test_ddp_on_a_device_model_trains_to_gloos_parameters_on_the_cpu(fake_library):
    """DDP's reducer on device buckets: its futures carry the device, its hooks chain on them."""
    import torch.multiprocessing as mp

    trained = {}
    for backend in ("shoal", "gloo"):
        ctx = mp.get_context("spawn")
        results = ctx.SimpleQueue()
        mp.start_processes(ddp_main, args=(fake_library, free_port(), backend, results),
                           nprocs=WORLD, start_method="spawn", join=True)
        trained[backend] = dict(results.get() for _ in range(WORLD))
    assert_trained_alike(torch, trained["shoal"], trained["gloo"])
