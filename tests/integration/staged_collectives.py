"""Every collective and point-to-point operation of a two-rank group on tensors of one
device, checked against values computed on the CPU: shared by the CUDA tests and the fake
accelerator's (which stands in for a GPU where there is none). Tensors are made on the CPU
and moved, so that the device needs no kernels but copies."""

from __future__ import annotations

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
