"""torch.distributed collectives on backend ``shoal`` under the real mpirun, checked against
numpy for every dtype and op the backend supports.

This file is also the rank program: ``python test_torch_backend.py <mode>`` runs one rank.
"""

import os
import subprocess
import sys

import numpy as np
import pytest

pytestmark = [pytest.mark.mpi, pytest.mark.torch, pytest.mark.runtime, pytest.mark.slow]

HERE = os.path.abspath(__file__)
SIZES = (1, 7, 1000, 65537)
OPS = ("SUM", "AVG", "MIN", "MAX", "PRODUCT")
DTYPES = ("float32", "float64", "float16", "bfloat16", "int32", "int64")


def run_ranks(n, argv, env=None, timeout=600):
    """Run ``argv`` as ``n`` ranks under mpirun; fail with the ranks' output."""
    command = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", str(n), *argv]
    merged = {**os.environ, "SHOAL_COLLECTIVE_TIMEOUT": "120", **(env or {})}
    done = subprocess.run(command, env=merged, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"stdout:\n{done.stdout[-6000:]}\nstderr:\n{done.stderr[-6000:]}"
    return done.stdout


def mpirun(n, *args, env=None, timeout=600):
    """Run a Python rank program (``args``: script and its arguments) on ``n`` ranks."""
    return run_ranks(n, [sys.executable, *args], env=env, timeout=timeout)


def free_port():
    import socket

    with socket.socket() as probe:
        probe.bind(("", 0))
        return probe.getsockname()[1]


@pytest.mark.parametrize("ranks", [2, 4])
def test_collectives_match_numpy(ranks):
    out = mpirun(ranks, HERE, "collectives", env={"MASTER_PORT": str(free_port())})
    assert out.count("collectives ok") == ranks


def test_module_api_bootstraps_under_plain_mpirun():
    """No MASTER_PORT at all: the core bootstraps itself and publishes torch's store."""
    env = {k: v for k, v in os.environ.items() if k != "MASTER_PORT"}
    out = mpirun(3, HERE, "module-api", env=env)
    assert out.count("module api ok") == 3


def test_a_dead_rank_fails_the_others_with_shoal_errors():
    """Rank 1 vanishes after init: rank 0's collectives fail with PeerLostError (or a
    timeout) through the module API and torch's own API, and nobody hangs."""
    env = {"SHOAL_COLLECTIVE_TIMEOUT": "20"}
    out = mpirun(2, HERE, "peer-lost", env=env, timeout=300)
    assert "rank 0: caught PeerLostError" in out or "rank 0: caught CollectiveTimeoutError" in out


# ---- rank program ---------------------------------------------------------------------


def torch_dtype(name):
    import torch

    return getattr(torch, name)


def rank_input(rank, size, dtype, op, seed):
    """Rank ``rank``'s input, reproducible on every rank (so each can compute the answer)."""
    rng = np.random.default_rng(seed * 1000 + rank)
    if dtype.startswith("int"):
        low, high = (-2, 3) if op == "PRODUCT" else (-1000, 1000)
        return rng.integers(low, high, size=size).astype(dtype)
    if op == "PRODUCT":
        return rng.uniform(0.5, 1.5, size=size)
    return rng.standard_normal(size)


def expected(inputs, dtype, op, world):
    stack = np.stack(inputs)
    if dtype.startswith("int"):
        total = stack.astype(np.int64)
        if op == "SUM":
            return total.sum(0)
        if op == "AVG":
            summed = total.sum(0)
            return np.sign(summed) * (np.abs(summed) // world)
        if op == "PRODUCT":
            return total.prod(0)
        return total.min(0) if op == "MIN" else total.max(0)
    reducer = {"SUM": np.sum, "AVG": np.mean, "MIN": np.min, "MAX": np.max, "PRODUCT": np.prod}
    return reducer[op](stack, axis=0)


def as_tensor(array, dtype):
    import torch

    return torch.from_numpy(np.array(array)).to(torch_dtype(dtype))  # a copy: ops are in place


def tolerance(dtype, world):
    return {
        "float32": (1e-5, 1e-5),
        "float64": (1e-12, 1e-12),
        "float16": (2e-3 * world, 2e-3 * world),
        "bfloat16": (1.6e-2 * world, 1.6e-2 * world),
    }.get(dtype, (0, 0))


def check_allreduce(dist, rank, world):
    import torch

    seed = 0
    for dtype in DTYPES:
        for op in OPS:
            for size in SIZES:
                seed += 1
                # Inputs are first rounded to the dtype, as the ranks hold them.
                inputs = [
                    as_tensor(rank_input(r, size, dtype, op, seed), dtype).double().numpy()
                    for r in range(world)
                ]
                tensor = as_tensor(inputs[rank], dtype)
                dist.all_reduce(tensor, op=getattr(dist.ReduceOp, op))
                want = torch.from_numpy(expected(inputs, dtype, op, world))
                rtol, atol = tolerance(dtype, world)
                torch.testing.assert_close(
                    tensor.double(), want.double(), rtol=rtol, atol=atol,
                    msg=lambda m, d=dtype, o=op, s=size: f"{d} {o} {s}: {m}",
                )
                gathered = [torch.empty_like(tensor) for _ in range(world)]
                dist.all_gather(gathered, tensor)
                for other in gathered:
                    assert torch.equal(other, tensor), f"{dtype} {op}: ranks differ"


def check_others(dist, rank, world):
    import torch

    # broadcast from every root, every dtype, uint8 payloads too
    for dtype in (*DTYPES, "uint8"):
        for root in range(world):
            values = torch.arange(1001, dtype=torch.float64).mul(root + 1).to(torch_dtype(dtype))
            tensor = values.clone() if rank == root else torch.zeros_like(values)
            dist.broadcast(tensor, src=root)
            assert torch.equal(tensor, values), (dtype, root)
    # allgather, list and flat forms
    mine = torch.full((5, 3), float(rank))
    gathered = [torch.empty(5, 3) for _ in range(world)]
    dist.all_gather(gathered, mine)
    assert all(torch.equal(g, torch.full((5, 3), float(r))) for r, g in enumerate(gathered))
    flat = torch.empty(world * 5, 3)
    dist.all_gather_into_tensor(flat, mine)
    assert torch.equal(flat, torch.cat(gathered))
    # reduce to every root: only the root's tensor changes
    for root in range(world):
        tensor = torch.tensor([rank + 1.0, 2.0])
        dist.reduce(tensor, dst=root, op=dist.ReduceOp.SUM)
        want = torch.tensor([world * (world + 1) / 2, 2.0 * world]) if rank == root else torch.tensor([rank + 1.0, 2.0])
        assert torch.equal(tensor, want), (root, tensor)
    # reduce_scatter: rank r gets the sum of everyone's r-th chunk
    chunks = [torch.full((4,), float(rank * 10 + r)) for r in range(world)]
    out = torch.empty(4)
    dist.reduce_scatter(out, chunks)
    assert torch.equal(out, torch.full((4,), float(sum(q * 10 + rank for q in range(world)))))
    out2 = torch.empty(4)
    dist.reduce_scatter_tensor(out2, torch.cat(chunks))
    assert torch.equal(out2, out)
    # non-contiguous tensors are reduced in place
    base = torch.arange(12.0).reshape(3, 4)
    view = base.t()
    dist.all_reduce(view)
    assert torch.equal(base, torch.arange(12.0).reshape(3, 4) * world)
    # async handles and their futures
    tensors = [torch.full((100,), float(rank)) for _ in range(8)]
    works = [dist.all_reduce(t, async_op=True) for t in tensors]
    futures = [w.get_future() for w in works[:4]]
    for future in futures:
        future.wait()
    for work in works:
        work.wait()
    total = float(sum(range(world)))
    assert all(torch.equal(t, torch.full((100,), total)) for t in tensors)
    # coalesced allreduce of mixed sizes
    group = [torch.ones(3), torch.ones(1000) * 2]
    dist.all_reduce_coalesced(group)
    assert torch.equal(group[0], torch.full((3,), float(world)))
    assert torch.equal(group[1], torch.full((1000,), 2.0 * world))
    # unsupported dtypes fail on every rank before anything is sent
    try:
        dist.all_reduce(torch.ones(3, dtype=torch.int8))
    except Exception as error:  # noqa: BLE001 - the message is what matters
        assert "unsupported dtype" in str(error)
    else:
        raise AssertionError("int8 allreduce should fail")
    dist.barrier()


def setup_env_like_shoal_rank():
    os.environ.setdefault("RANK", os.environ["OMPI_COMM_WORLD_RANK"])
    os.environ.setdefault("WORLD_SIZE", os.environ["OMPI_COMM_WORLD_SIZE"])
    os.environ.setdefault("LOCAL_RANK", os.environ["OMPI_COMM_WORLD_LOCAL_RANK"])
    os.environ.setdefault("LOCAL_WORLD_SIZE", os.environ["OMPI_COMM_WORLD_LOCAL_SIZE"])
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")


def main_collectives():
    import shoal.dataparallel.torch  # noqa: F401 - registers the backend
    import torch.distributed as dist

    setup_env_like_shoal_rank()
    dist.init_process_group(backend="shoal")
    rank, world = dist.get_rank(), dist.get_world_size()
    assert dist.get_backend() == "shoal"
    check_allreduce(dist, rank, world)
    check_others(dist, rank, world)
    dist.destroy_process_group()
    print(f"rank {rank}: collectives ok", flush=True)


def main_module_api():
    import smdistributed.dataparallel.torch.distributed as sdist
    import torch

    assert sdist.is_available()
    sdist.init_process_group()
    sdist.init_process_group()  # idempotent
    rank, world = sdist.get_rank(), sdist.get_world_size()
    assert rank == int(os.environ["OMPI_COMM_WORLD_RANK"])
    assert world == int(os.environ["OMPI_COMM_WORLD_SIZE"])
    assert (sdist.get_local_rank(), sdist.get_local_size()) == (rank, world)
    tensor = torch.tensor([float(rank), 1.0])
    sdist.all_reduce(tensor, op=sdist.ReduceOp.AVERAGE)
    assert torch.allclose(tensor, torch.tensor([sum(range(world)) / world, 1.0]))
    tensor = torch.tensor([float(rank)])
    sdist.all_reduce(tensor, op=sdist.ReduceOp.MAX, group=sdist.group.WORLD)
    assert tensor.item() == world - 1
    tensor = torch.tensor([7.0 if rank == 1 else 0.0])
    sdist.broadcast(tensor, src=1)
    assert tensor.item() == 7.0
    gathered = [torch.zeros(2) for _ in range(world)]
    sdist.all_gather(gathered, torch.tensor([float(rank), -1.0]))
    assert [g[0].item() for g in gathered] == [float(r) for r in range(world)]
    tensor = torch.tensor([1.0])
    work = sdist.reduce(tensor, dst=0, async_op=True)
    work.wait()
    assert tensor.item() == (float(world) if rank == 0 else 1.0)
    sdist.barrier()
    print(f"rank {rank}: module api ok", flush=True)


def main_peer_lost():
    import smdistributed.dataparallel.torch.distributed as sdist
    import torch
    from shoal.errors import CollectiveError

    sdist.init_process_group()
    sdist.barrier()
    if sdist.get_rank() == 1:
        os._exit(0)  # gone without a word, mid-job
    try:
        sdist.all_reduce(torch.ones(1 << 20))
    except CollectiveError as error:
        print(f"rank 0: caught {type(error).__name__}: {error}", flush=True)
    else:
        raise AssertionError("the allreduce with a dead peer succeeded")
    os._exit(0)  # the process group cannot be torn down cleanly without its peer


if __name__ == "__main__":
    modes = {"collectives": main_collectives, "module-api": main_module_api, "peer-lost": main_peer_lost}
    modes[sys.argv[1]]()
