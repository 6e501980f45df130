"""torch.distributed collectives on backend ``shoal`` under the real mpirun, checked against
numpy for every dtype and op the backend supports.

This file is also the rank program: ``python test_torch_backend.py <mode>`` runs one rank.
"""

import atexit
import os
import subprocess
import sys

import numpy as np
import pytest
from shoal.launcher.ports import free_port

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


@pytest.mark.parametrize("ranks", [2, 4])
def test_collectives_match_numpy(ranks):
    out = mpirun(ranks, HERE, "collectives", env={"MASTER_PORT": str(free_port())})
    assert out.count("collectives ok") == ranks


@pytest.mark.parametrize("ranks", [2, 3])
def test_gather_scatter_reduce_scatter_alltoall_match_numpy_and_gloo(ranks):
    out = mpirun(ranks, HERE, "more-collectives", env={"MASTER_PORT": str(free_port())})
    assert out.count("more collectives ok") == ranks


def test_subgroups_and_world_sized_groups_work():
    out = mpirun(3, HERE, "subgroups", env={"MASTER_PORT": str(free_port())})
    assert out.count("subgroups ok") == 3


def test_module_api_bootstraps_under_plain_mpirun():
    """No MASTER_PORT at all: the core bootstraps itself and publishes torch's store."""
    env = {k: v for k, v in os.environ.items() if k != "MASTER_PORT"}
    out = mpirun(3, HERE, "module-api", env=env)
    assert out.count("module api ok") == 3
    # The script never destroys its groups: the module API does, before the interpreter ends.
    assert out.count("torn down at exit") == 3, out


def test_profiling_records_every_operation_with_how_it_ran(tmp_path):
    """With SHOAL_PROFILER_DIR set the backend records each operation (csrc/activity.h)."""
    env = {"MASTER_PORT": str(free_port()), "SHOAL_PROFILER_DIR": str(tmp_path)}
    out = mpirun(2, HERE, "activity", env=env)
    assert out.count("activity ok") == 2


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


def values(rank, tag, shape=(3, 4), dtype="float32"):
    """A tensor that names its origin (rank, tag), the same on every rank."""
    import torch

    return (torch.arange(int(np.prod(shape)), dtype=torch.float64).reshape(shape)
            + 100 * rank + 1000 * tag).to(torch_dtype(dtype))


def check_gather_scatter(dist, rank, world):
    import torch

    for tag, dtype in enumerate(("float32", "int64", "bfloat16", "uint8")):
        for root in range(world):
            mine = values(rank, tag, (4, 3), dtype).t()  # non-contiguous input
            outputs = None
            if rank == root:
                outputs = [torch.empty(3, 4, dtype=mine.dtype) for _ in range(world)]
            dist.gather(mine, outputs, dst=root)
            if rank == root:
                for r, got in enumerate(outputs):
                    assert torch.equal(got, values(r, tag, (4, 3), dtype).t()), (dtype, root, r)
            parts = [values(r, tag, (2, 5), dtype) for r in range(world)] if rank == root else None
            base = torch.zeros(5, 2, dtype=mine.dtype)
            dist.scatter(base.t(), parts, src=root)  # non-contiguous output
            assert torch.equal(base.t(), values(rank, tag, (2, 5), dtype)), (dtype, root)


def check_gather_coalesced(dist, rank, world):
    """all_gather_coalesced: lists[r][i] receives rank r's i-th tensor."""
    import torch

    mine = [torch.full((2,), float(rank)), torch.arange(3.0) * (rank + 1)]  # torch: one dtype
    lists = [[torch.empty(2), torch.empty(3)] for _ in range(world)]
    dist.all_gather_coalesced(lists, mine)
    for r, (first, second) in enumerate(lists):
        assert torch.equal(first, torch.full((2,), float(r))), (r, first)
        assert torch.equal(second, torch.arange(3.0) * (r + 1)), (r, second)


def check_reduce_scatter(dist, rank, world):
    import torch

    for seed, op in enumerate(("SUM", "AVG", "MAX", "PRODUCT")):
        inputs = [[rank_input(r, 6, "float64", op, 50 + seed * world + d) for d in range(world)]
                  for r in range(world)]
        want = expected([inputs[r][rank] for r in range(world)], "float64", op, world)
        out = torch.empty(2, 3, dtype=torch.float64)
        chunks = [torch.from_numpy(inputs[rank][d].copy()).reshape(2, 3) for d in range(world)]
        dist.reduce_scatter(out, chunks, op=getattr(dist.ReduceOp, op))
        torch.testing.assert_close(out.reshape(-1), torch.from_numpy(want), rtol=1e-12, atol=1e-12)
        single = torch.empty(6, dtype=torch.float64)
        dist.reduce_scatter_tensor(single, torch.cat([c.reshape(-1) for c in chunks]),
                                   op=getattr(dist.ReduceOp, op))
        assert torch.equal(single, out.reshape(-1)), op
    # two reduce_scatter_tensor and two all_gather_into_tensor calls, coalesced
    outs = [torch.empty(2), torch.empty(3, dtype=torch.int64)]
    ins = [torch.arange(2.0 * world) + rank, torch.arange(3 * world) * (rank + 1)]
    with dist._coalescing_manager(async_ops=True) as manager:
        for out, tensor in zip(outs, ins):
            dist.reduce_scatter_tensor(out, tensor)
    manager.wait()
    total = sum(range(world))
    assert torch.equal(outs[0], torch.arange(2.0 * rank, 2.0 * rank + 2) * world + total)
    assert torch.equal(outs[1], torch.arange(3 * rank, 3 * rank + 3) * (total + world))
    gathered = [torch.empty(2 * world), torch.empty(3 * world, dtype=torch.int64)]
    with dist._coalescing_manager(async_ops=True) as manager:
        for out, tensor in zip(gathered, outs):
            dist.all_gather_into_tensor(out, tensor)
    manager.wait()
    assert torch.equal(gathered[0], torch.arange(2.0 * world) * world + total)
    assert torch.equal(gathered[1], torch.arange(3 * world) * (total + world))


def rows(source, target, count, width=3):
    """Rows ``source`` sends to ``target`` in the all-to-all tests, naming both."""
    import torch

    base = torch.arange(count * width, dtype=torch.float32).reshape(count, width)
    return base + 100 * source + 10 * target


def check_alltoall(dist, rank, world, gloo):
    import torch

    # equal splits, against numpy's transposition and against gloo
    mine = torch.arange(world * 2 * 3, dtype=torch.float64).reshape(world * 2, 3) + 1000 * rank
    out = torch.empty_like(mine)
    dist.all_to_all_single(out, mine)
    sent = [np.arange(world * 6).reshape(world * 2, 3) + 1000 * s for s in range(world)]
    want = np.concatenate([rows_of[rank * 2:rank * 2 + 2] for rows_of in sent])
    assert np.array_equal(out.numpy(), want)
    reference = torch.empty_like(mine)
    dist.all_to_all_single(reference, mine, group=gloo)
    assert torch.equal(out, reference)
    # uneven splits: rank s sends s + d + 1 rows to rank d
    sends = torch.cat([rows(rank, d, rank + d + 1) for d in range(world)])
    out_splits = [s + rank + 1 for s in range(world)]
    out = torch.empty(sum(out_splits), 3)
    in_splits = [rank + d + 1 for d in range(world)]
    dist.all_to_all_single(out, sends, out_splits, in_splits)
    assert torch.equal(out, torch.cat([rows(s, rank, s + rank + 1) for s in range(world)]))
    reference = torch.empty_like(out)
    dist.all_to_all_single(reference, sends, out_splits, in_splits, group=gloo)
    assert torch.equal(out, reference)
    # list form, asynchronously, with a non-contiguous output
    outputs = [torch.empty(s + rank + 1, 3) for s in range(world)]
    outputs[-1] = torch.empty(3, world + rank).t()
    inputs = [rows(rank, d, rank + d + 1) for d in range(world)]
    work = dist.all_to_all(outputs, inputs, async_op=True)
    work.wait()
    for s, got in enumerate(outputs):
        assert torch.equal(got, rows(s, rank, s + rank + 1)), s
    # a rank expecting other sizes than were sent fails, naming them; the others go on
    out = torch.empty(world * 2, 3)
    wrong = [1, 3] + [2] * (world - 2) if rank == 0 else None
    try:
        dist.all_to_all_single(out, torch.zeros(world * 2, 3), wrong)
    except RuntimeError as error:
        assert rank == 0, error
        assert "rank 0 sent 24 bytes to rank 0, which expected 12" in str(error), error
    else:
        assert rank != 0, "a mismatched all_to_all_single succeeded"
    tensor = torch.ones(2)
    dist.all_reduce(tensor)
    assert torch.equal(tensor, torch.full((2,), float(world)))


def check_point_to_point(dist, rank, world, gloo):
    """send/recv (every size class), isend/irecv rings with batch_isend_irecv, a receive
    from any source and object send/recv: the same results as on gloo."""
    import torch

    nxt, prev = (rank + 1) % world, (rank - 1) % world
    for group in (None, gloo):
        for n in (1, 4096, 5000, 300_001):
            out = torch.arange(n, dtype=torch.float64) + 1000 * rank
            into = torch.empty(n, dtype=torch.float64)
            ops = [dist.P2POp(dist.isend, out, nxt, group=group, tag=3),
                   dist.P2POp(dist.irecv, into, prev, group=group, tag=3)]
            for work in dist.batch_isend_irecv(ops):
                work.wait()
            assert torch.equal(into, torch.arange(n, dtype=torch.float64) + 1000 * prev), n
        if rank == 0:
            sources = set()
            for _ in range(world - 1):
                into = torch.empty(2, dtype=torch.int64)
                source = dist.recv(into, group=group, tag=7)
                assert torch.equal(into, torch.full((2,), source)), (source, into)
                sources.add(source)
            assert sources == set(range(1, world))
        else:
            dist.send(torch.full((2,), rank, dtype=torch.int64), 0, group=group, tag=7)
        objects = [{"from": rank, "list": list(range(rank))}] if rank == 0 else [None]
        if rank == 0:
            for peer in range(1, world):
                dist.send_object_list(objects, dst=peer, group=group)
        else:
            dist.recv_object_list(objects, src=0, group=group)
        assert objects[0] == {"from": 0, "list": []}
    # On a group of the first and last ranks: peers are global ranks, as torch has them.
    ends = dist.new_group([0, world - 1], backend="shoal")
    if rank in (0, world - 1):
        other = world - 1 - rank
        into = torch.empty(70_000)
        works = [dist.isend(torch.full((70_000,), float(rank)), other, group=ends),
                 dist.irecv(into, other, group=ends)]
        for work in works:
            work.wait()
        assert torch.equal(into, torch.full((70_000,), float(other)))


def main_more_collectives():
    import shoal.dataparallel.torch  # noqa: F401 - registers the backend
    import torch.distributed as dist

    setup_env_like_shoal_rank()
    dist.init_process_group(backend="shoal")
    gloo = dist.new_group(backend="gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    check_gather_scatter(dist, rank, world)
    check_gather_coalesced(dist, rank, world)
    check_reduce_scatter(dist, rank, world)
    check_alltoall(dist, rank, world, gloo)
    check_point_to_point(dist, rank, world, gloo)
    dist.barrier()
    dist.destroy_process_group()
    print(f"rank {rank}: more collectives ok", flush=True)


def main_subgroups():
    import shoal.dataparallel.torch  # noqa: F401 - registers the backend
    import torch
    import torch.distributed as dist

    setup_env_like_shoal_rank()
    dist.init_process_group(backend="shoal")
    rank, world = dist.get_rank(), dist.get_world_size()
    pair = dist.new_group([0, 2])  # every rank takes part in creating every group
    pair_gloo = dist.new_group([0, 2], backend="gloo")
    everyone = dist.new_group(list(range(world)))
    if rank in (0, 2):
        assert dist.get_backend(pair) == "shoal"
        assert dist.get_rank(pair) == rank // 2 and dist.get_world_size(pair) == 2
        for group in (pair, pair_gloo):
            tensor = torch.full((2,), float(rank))
            dist.all_reduce(tensor, group=group)
            assert torch.equal(tensor, torch.full((2,), 2.0))
            tensor = torch.full((2,), float(rank))
            dist.broadcast(tensor, src=2, group=group)  # src is a global rank
            assert torch.equal(tensor, torch.full((2,), 2.0))
            dist.barrier(group=group)
    tensor = torch.full((3,), float(rank + 1))
    dist.all_reduce(tensor, group=everyone)
    assert torch.equal(tensor, torch.full((3,), world * (world + 1) / 2))
    gathered = [torch.empty(1) for _ in range(world)]
    dist.all_gather(gathered, torch.tensor([float(rank)]), group=everyone)
    assert [g.item() for g in gathered] == [float(r) for r in range(world)]
    dist.barrier()
    dist.destroy_process_group()
    print(f"rank {rank}: subgroups ok", flush=True)


def main_module_api():
    import smdistributed.dataparallel.torch.distributed as sdist
    import torch
    import torch.distributed as torch_dist

    def report_teardown():  # runs after the module API's own exit handler (LIFO)
        state = "still initialized" if torch_dist.is_initialized() else "torn down"
        print(f"rank {os.environ['OMPI_COMM_WORLD_RANK']}: {state} at exit", flush=True)

    atexit.register(report_teardown)
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
    # A gloo group left alive at exit, as scripts written for the closed library do.
    gloo = torch_dist.new_group(backend="gloo")
    torch_dist.all_reduce(torch.ones(1), group=gloo)
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


def main_activity():
    import gc

    import shoal.dataparallel.torch  # noqa: F401 - registers the backend
    import torch
    import torch.distributed as dist
    from shoal.dataparallel.torch.backend import take_activity

    setup_env_like_shoal_rank()
    dist.init_process_group(backend="shoal")
    rank = dist.get_rank()
    take_activity()  # what setting up the group issued
    dist.all_reduce(torch.ones(16))                       # eager: on this thread
    dist.all_reduce(torch.ones(1 << 20))                  # queued, and waited on
    work = dist.all_reduce(torch.ones(1 << 20), async_op=True)
    work.get_future().wait()                              # queued, waited on as a future
    del work
    if rank == 0:
        dist.send(torch.ones(1000), 1)
    else:
        dist.recv(torch.empty(1000), 0)
    dist.barrier()
    gc.collect()
    records, dropped = take_activity()
    records.sort(key=lambda r: r[2])  # recorded when each work goes: in issue order here
    got = [(name, mode, nbytes, exposed >= 0) for name, mode, _, _, _, exposed, nbytes, _, _
           in records]
    p2p = ("send" if rank == 0 else "recv", "transfer", 4000, True)
    assert got == [("allreduce", "eager", 64, True), ("allreduce", "queued", 4 << 20, True),
                   ("allreduce", "queued", 4 << 20, False), p2p,
                   ("barrier", "eager", 0, True)], got
    for _, mode, issued, started, ended, exposed, _nbytes, across, ok in records:
        assert issued <= started <= ended and ok and not across, records
        assert exposed <= ended - issued
        if mode == "eager":
            assert exposed == ended - issued
    assert dropped == 0
    dist.destroy_process_group()
    print(f"rank {rank}: activity ok", flush=True)


if __name__ == "__main__":
    modes = {
        "activity": main_activity,
        "collectives": main_collectives,
        "more-collectives": main_more_collectives,
        "subgroups": main_subgroups,
        "module-api": main_module_api,
        "peer-lost": main_peer_lost,
    }
    modes[sys.argv[1]]()
