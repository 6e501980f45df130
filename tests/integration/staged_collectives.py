"""Every collective and point-to-point operation of a two-rank group on tensors of one
device, checked against values computed on the CPU: shared by the CUDA tests and the fake
accelerator's (which stands in for a GPU where there is none). Tensors are made on the CPU
and moved, so that the device needs no kernels but copies."""

from __future__ import annotations

import os
import sys

WORLD = 2


def run_collectives(dist, torch, device, dtype, size: int) -> list[str]:
    """The names of the operations whose results were wrong on this rank."""
    rank = dist.get_rank()
    failures = []

    def values(r):  # small integers: exact in every dtype, sums included
        return (torch.arange(size) % 7 + r + 1).to(dtype)

    def on(tensor):
        return tensor.to(device)

    def empty(n=size):
        return torch.empty(n, dtype=dtype, device=device)

    def check(name, got, want):
        if got.device != device or not torch.equal(got.cpu(), want):
            failures.append(name)

    both = values(0) + values(1)
    t = on(values(rank))
    dist.all_reduce(t)
    check("all_reduce", t, both)
    t = on(values(rank))
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    check("all_reduce max", t, values(1))
    t = on(values(rank))
    dist.broadcast(t, src=1)
    check("broadcast", t, values(1))
    t = on(values(rank))
    dist.reduce(t, dst=0)
    if rank == 0:
        check("reduce", t, both)
    whole = empty(WORLD * size)
    dist.all_gather_into_tensor(whole, on(values(rank)))
    check("all_gather_into_tensor", whole, torch.cat([values(0), values(1)]))
    parts = [empty() for _ in range(WORLD)]
    dist.all_gather(parts, on(values(rank)))
    for r, part in enumerate(parts):
        check(f"all_gather[{r}]", part, values(r))
    out = empty()
    dist.reduce_scatter_tensor(out, on(torch.cat([values(rank), values(rank)])))
    check("reduce_scatter_tensor", out, both)
    outs = empty()
    dist.reduce_scatter(outs, [on(values(rank)), on(values(rank))])
    check("reduce_scatter", outs, both)
    if size % WORLD == 0:
        got = empty()
        dist.all_to_all_single(got, on(values(rank)))
        half = size // WORLD
        check("all_to_all_single", got,
              torch.cat([values(r)[rank * half:(rank + 1) * half] for r in range(WORLD)]))
    got = [empty() for _ in range(WORLD)]
    dist.all_to_all(got, [on(values(rank)) for _ in range(WORLD)])
    for r, part in enumerate(got):
        check(f"all_to_all[{r}]", part, values(r))
    if rank == 0:
        dist.send(on(values(0)), dst=1)
    else:
        got = empty()
        dist.recv(got, src=0)
        check("send/recv", got, values(0))
    gathered = [empty() for _ in range(WORLD)] if rank == 0 else None
    dist.gather(on(values(rank)), gathered, dst=0)
    if rank == 0:
        for r, part in enumerate(gathered):
            check(f"gather[{r}]", part, values(r))
    got = empty()
    dist.scatter(got, [on(values(0)), on(values(1))] if rank == 0 else None, src=0)
    check("scatter", got, values(rank))
    work = dist.all_reduce(on(values(rank)), async_op=True)
    future = work.get_future()
    work.wait()
    if future.wait()[0].device != device:
        failures.append("future's value on its device")
    dist.barrier()
    return failures


def train_ddp(torch, device, device_ids=None, steps: int = 5, bucket_cap_mb: float = 0.002):
    """A small model trained with DDP on `device` (tiny buckets: several per step), each rank
    on data of its own; its parameters as NumPy arrays (they cross process queues without
    shared memory)."""
    import torch.distributed as dist

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(),
                                torch.nn.Linear(64, 4)).to(device)
    ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=device_ids,
                                                    bucket_cap_mb=bucket_cap_mb)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.1)
    generator = torch.Generator().manual_seed(dist.get_rank())
    for _ in range(steps):
        x = torch.randn(8, 16, generator=generator).to(device)
        y = torch.randint(0, 4, (8,), generator=generator).to(device)
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(ddp(x), y).backward()
        optimizer.step()
    return [p.detach().to("cpu").numpy() for p in model.parameters()]


def end_ddp_rank(dist, results, result) -> None:
    """Destroys the group, hands `result` over and ends the rank without finalizing the
    interpreter. DDP's reducer and the autograd hooks on its parameters hold each other in
    C++, out of the collector's reach, so the group's backend outlives
    ``destroy_process_group()`` (gloo's threads are still there after it; without DDP they
    are joined). A gloo worker that drops its last work while the interpreter finalizes
    takes the GIL to release the work's thread-local state and is ended there, and the
    rank aborts ("terminate called without an active exception": 3 runs of the staging
    tests in 27)."""
    dist.destroy_process_group()
    results.put(result)  # written to the pipe before it returns
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def assert_trained_alike(torch, ours: dict, gloos: dict) -> None:
    """Each rank's parameters on shoal close to gloo's; shoal's ranks equal."""
    for rank in range(WORLD):
        for mine, theirs in zip(ours[rank], gloos[rank]):
            assert torch.allclose(torch.from_numpy(mine), torch.from_numpy(theirs),
                                  rtol=1e-5, atol=1e-6)
    for first, second in zip(ours[0], ours[1]):
        assert (first == second).all()
