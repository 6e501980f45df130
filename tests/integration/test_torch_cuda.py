"""CUDA tensors on the shoal backend (host-staged through pinned memory, csrc/staging.h):
every collective and point-to-point operation, several dtypes and sizes, two ranks sharing
one GPU (the host-staged path allows it, NCCL does not); stream order (a kernel queued right
after a collective sees its result); DDP on a GPU model trains to gloo's parameters.

Needs a CUDA device; skipped, saying so, where torch sees none.
"""

import os
import sys

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

pytestmark = [
    pytest.mark.torch, pytest.mark.runtime, pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(),
                       reason="needs a CUDA device: torch.cuda.is_available() is False here"),
]

DTYPES = ["float32", "float64", "float16", "bfloat16", "int32", "int64", "uint8"]
SIZES = [1, 1000, 16 << 20]  # elements: up to 64 MiB of float32


def spawn(target, *args):
    """`target(rank, queue, *args)` in WORLD spawned ranks; their results, by rank."""
    import torch.multiprocessing as mp

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    ctx = mp.get_context("spawn")
    results = ctx.SimpleQueue()
    mp.start_processes(target, args=(results, *args), nprocs=WORLD, start_method="spawn",
                       join=True)
    return dict(results.get() for _ in range(WORLD))


def _init(rank, backend):
    import shoal.dataparallel.torch  # noqa: F401 - registers the backend
    import torch.distributed as dist

    torch.cuda.set_device(rank % torch.cuda.device_count())  # two ranks may share one GPU
    dist.init_process_group(backend, rank=rank, world_size=WORLD)
    return dist, torch.device("cuda", torch.cuda.current_device())


def collectives_main(rank, results, dtype_name, size):
    dist, device = _init(rank, "shoal")
    failures = run_collectives(dist, torch, device, getattr(torch, dtype_name), size)
    dist.destroy_process_group()
    results.put((rank, failures))


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_every_operation_on_cuda_tensors_of_two_ranks_sharing_a_gpu(dtype, size):
    results = spawn(collectives_main, dtype, size)
    assert results == {0: [], 1: []}


def stream_order_main(rank, results):
    dist, device = _init(rank, "shoal")
    seen = []
    for _ in range(20):
        t = torch.full((4 << 20,), float(rank + 1), device=device)
        torch.cuda._sleep(1_000_000)  # the caller's stream is busy when the collective is issued
        t.add_(1)  # queued behind the sleep: the collective must wait for it
        work = dist.all_reduce(t, async_op=True)
        work.wait()
        doubled = t * 2  # a kernel queued right after: sees the reduced values
        seen.append(float(doubled[-1].item()))
    dist.destroy_process_group()
    results.put((rank, seen))


def test_the_callers_stream_is_ordered_around_the_collective():
    results = spawn(stream_order_main)
    assert results == {rank: [2 * (2 + 3)] * 20 for rank in range(WORLD)}


def ddp_main(rank, results, backend):
    dist, device = _init(rank, backend)
    params = train_ddp(torch, device, device_ids=[device.index], steps=10)
    end_ddp_rank(dist, results, (rank, params))


def test_ddp_on_a_gpu_model_trains_to_gloos_parameters():
    assert_trained_alike(torch, spawn(ddp_main, "shoal"), spawn(ddp_main, "gloo"))
