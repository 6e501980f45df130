"""The tensor-parallel group's collectives, as autograd operations.

Every distributed module (``smp.nn``) moves activations between the ranks of its TP group
with these, and each has the backward its forward implies:

    gather(x, dim)           every rank's x, concatenated on ``dim``  |  own slice of the grad
    scatter(x, dim)          own slice of ``dim``                     |  grads gathered
    reduce_scatter(x, dim)   sum over ranks, own slice of ``dim``     |  grads gathered
    all_to_all(x, s, c)      split ``s`` over ranks, concat on ``c``  |  the inverse
    copy_to(x)               identity                                 |  grads summed
    reduce_from(x)           sum over ranks                           |  identity
    sum_everywhere(x)        sum over ranks                           |  grads summed

A tensor split over the group ("sharded on dim") gives rank r ``local_size(total, r)``
entries of it: the first ``total % tp`` ranks one more, as SMP splits channels.

Three ways to run them, chosen per call:

- **direct**: the core's collectives on the TP communicator. Used where every rank of the
  group issues its TP operations in one order: outside a pipeline, or with one stage.
- **tagged**: inside a pipeline task with more than one stage, the order in which a rank
  runs its microbatches depends on when its peers' messages arrive, and TP peers belong to
  different pipelines. So each operation is an exchange of point-to-point messages tagged
  by (microbatch, phase, index within them), on a communicator of its own, and the task
  gives its turn up while it waits: a peer still on another microbatch is never blocked
  on this one. Sums are added in rank order, so every rank gets the same bits.
- **tracing**: while world rank 0 traces the model alone to partition it, nothing is sent;
  each operation returns a tensor of the right shape from this rank's data.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

import numpy as np
import torch
from shoal.dataparallel import core
from shoal.modelparallel.topology import CommGroup
from shoal.modelparallel.torch import state as _state
from shoal.modelparallel.torch.scheduler import BACKWARD, current_task


def local_size(total: int, rank: int, size: int) -> int:
    """How many of ``total`` channels rank ``rank`` of ``size`` holds."""
    return total // size + (1 if rank < total % size else 0)


def local_sizes(total: int, size: int) -> list[int]:
    return [local_size(total, r, size) for r in range(size)]


def local_offset(total: int, rank: int, size: int) -> int:
    return sum(local_sizes(total, size)[:rank])


# -- the group ------------------------------------------------------------------------


class _Group:
    """This rank's TP group as the collectives see it."""

    def __init__(self) -> None:
        st = _state.require()
        self.rank = st.topology.tp_rank
        self.size = st.topology.tp_size
        self.core = st.core_group(CommGroup.TP_GROUP)
        self.tagged = st.tp_p2p
        self.tracing = st.tracing
        self.scheduler = st.engine.scheduler if st.engine is not None else None
        self.pipelined = st.topology.pp_size > 1


def group() -> _Group:
    return _Group()


def tp_size() -> int:
    st = _state.current()
    return st.topology.tp_size if st is not None else 1


def tp_rank() -> int:
    st = _state.current()
    return st.topology.tp_rank if st is not None else 0


# -- raw exchanges (no autograd) ------------------------------------------------------

_TAG_BITS = 20  # operations per (microbatch, phase) before the index wraps around
_counters: dict[tuple[int, int], int] = {}
_counters_lock = threading.Lock()
_steps = 0


def reset_tags() -> None:
    """Called as a step begins: the tags of the step before are all consumed."""
    global _steps
    with _counters_lock:
        _counters.clear()
        _steps += 1


def step_index() -> int:
    """How many ``smp.step`` calls have begun in this process (the same on every rank)."""
    return _steps


def _next_tag(task) -> int:
    phase = 1 if task.phase == BACKWARD else 0
    key = (task.microbatch, phase)
    with _counters_lock:
        index = _counters.get(key, 0)
        _counters[key] = index + 1
    return (((task.microbatch % 1024) * 2 + phase) << _TAG_BITS) | (index % (1 << _TAG_BITS))


def _np(t: torch.Tensor) -> np.ndarray:
    return t.detach().contiguous().view(-1).view(torch.uint8).numpy()


def _exchange(g: _Group, outgoing: Sequence[torch.Tensor | None],
              incoming: Sequence[torch.Tensor | None]) -> None:
    """Sends ``outgoing[r]`` to rank r and receives ``incoming[r]`` from it (None: nothing),
    tagged for the running task, which gives its turn up while it waits."""
    task = current_task()
    tag = _next_tag(task)
    handles = []
    for r in range(g.size):
        if r != g.rank and incoming[r] is not None and incoming[r].numel():
            handles.append(core.irecv(_np(incoming[r]), r, tag, group=g.tagged))
    sends = []
    for r in range(g.size):
        if r != g.rank and outgoing[r] is not None and outgoing[r].numel():
            blob = outgoing[r].detach().contiguous()
            sends.append(blob)
            handles.append(core.isend(_np(blob), r, tag, group=g.tagged))
    with g.scheduler.off_turn(task):
        for handle in handles:
            handle.wait()


def _use_tagged(g: _Group) -> bool:
    return g.pipelined and g.tagged is not None and current_task() is not None


def _all_gather_list(g: _Group, x: torch.Tensor, shapes: Sequence[torch.Size]) -> list[torch.Tensor]:
    """Every rank's tensor (rank r's of shape ``shapes[r]``), this rank's being ``x``."""
    x = x.contiguous()
    if g.tracing:
        return [x if r == g.rank else x.new_zeros(shapes[r]) for r in range(g.size)]
    if _use_tagged(g):
        parts = [x if r == g.rank else x.new_empty(shapes[r]) for r in range(g.size)]
        _exchange(g, [x] * g.size, parts)
        return parts
    if all(s == x.shape for s in shapes):
        out = torch.empty((g.size, *x.shape), dtype=x.dtype)
        gathered = core.allgather(_np(x), group=g.core)
        out.view(-1).view(torch.uint8).copy_(torch.from_numpy(gathered.reshape(-1)))
        return list(out.unbind(0))
    width = max(s.numel() for s in shapes)
    padded = x.new_zeros(width)
    padded[: x.numel()] = x.reshape(-1)
    rows = _all_gather_list(g, padded, [padded.shape] * g.size)
    return [rows[r][: shapes[r].numel()].view(shapes[r]) for r in range(g.size)]


def _all_to_all_list(g: _Group, pieces: Sequence[torch.Tensor],
                     shapes: Sequence[torch.Size]) -> list[torch.Tensor]:
    """``pieces[r]`` goes to rank r; returns what each rank sent here (shapes given)."""
    pieces = [p.contiguous() for p in pieces]
    if g.tracing:
        return [pieces[g.rank] if r == g.rank else pieces[g.rank].new_zeros(shapes[r])
                for r in range(g.size)]
    if _use_tagged(g):
        received = [pieces[r] if r == g.rank else pieces[g.rank].new_empty(shapes[r])
                    for r in range(g.size)]
        _exchange(g, pieces, received)
        return received
    dtype = pieces[0].dtype
    flat = torch.cat([p.reshape(-1) for p in pieces]).view(torch.uint8).numpy()
    item = pieces[0].element_size()
    sends = [p.numel() * item for p in pieces]
    recvs = [int(np.prod(s)) * item for s in shapes]
    got = core.alltoall(flat, send_splits=sends, recv_splits=recvs, group=g.core)
    out = torch.from_numpy(got).view(dtype)
    sizes = [int(np.prod(s)) for s in shapes]
    return [chunk.view(s) for chunk, s in zip(out.split(sizes), shapes)]


def _all_reduce(g: _Group, x: torch.Tensor) -> torch.Tensor:
    """The sum over ranks, the same bits on every rank."""
    x = x.contiguous()
    if g.tracing:
        return x.clone()
    if _use_tagged(g):
        parts = _all_gather_list(g, x, [x.shape] * g.size)
        return _ordered_sum(parts)
    out = x.clone()
    array, dtype = _typed(out)
    core.allreduce(array, op="sum", dtype=dtype, group=g.core)
    return out


def _ordered_sum(parts: Sequence[torch.Tensor]) -> torch.Tensor:
    total = parts[0].clone()
    for part in parts[1:]:
        total += part
    return total


def _typed(t: torch.Tensor) -> tuple[np.ndarray, str | None]:
    """``t``'s memory as the core reduces it (bfloat16: its bits, named)."""
    if t.dtype == torch.bfloat16:
        return t.view(-1).view(torch.int16).numpy().view(np.uint16), "bfloat16"
    return t.view(-1).numpy(), None


def _reduce_scatter_dim0(g: _Group, x: torch.Tensor, sizes: Sequence[int]) -> torch.Tensor:
    """Rank r's rows ``sizes[r]`` of the sum over ranks of ``x`` (rows on dim 0)."""
    x = x.contiguous()
    me = sum(sizes[: g.rank])
    if g.tracing:
        return x[me: me + sizes[g.rank]].clone()
    if not _use_tagged(g) and len(set(sizes)) == 1 and x.dtype == torch.float32:
        got = core.reduce_scatter(x.numpy(), op="sum", group=g.core)
        return torch.from_numpy(got)
    pieces = list(x.split(list(sizes)))
    mine = pieces[g.rank].shape
    received = _all_to_all_list(g, pieces, [mine] * g.size)
    return _ordered_sum(received)


# -- autograd operations ----------------------------------------------------------------


def _sizes_on(x: torch.Tensor, dim: int, g: _Group, sizes) -> list[int]:
    return list(sizes) if sizes is not None else [x.shape[dim]] * g.size


def _gather_dim(g: _Group, x: torch.Tensor, dim: int, sizes) -> torch.Tensor:
    sizes = _sizes_on(x, dim, g, sizes)
    shapes = []
    for n in sizes:
        shape = list(x.shape)
        shape[dim] = n
        shapes.append(torch.Size(shape))
    moved = x.movedim(dim, 0)
    parts = _all_gather_list(g, moved, [torch.Size((s[dim], *moved.shape[1:])) for s in shapes])
    return torch.cat(parts, 0).movedim(0, dim)


def _scatter_dim(g: _Group, x: torch.Tensor, dim: int, sizes) -> torch.Tensor:
    sizes = list(sizes) if sizes is not None else local_sizes(x.shape[dim], g.size)
    return x.narrow(dim, sum(sizes[: g.rank]), sizes[g.rank]).contiguous()


class _Gather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, dim, sizes, g):
        ctx.dim, ctx.sizes, ctx.g = dim, _sizes_on(x, dim, g, sizes), g
        return _gather_dim(g, x, dim, ctx.sizes)

    @staticmethod
    def backward(ctx, grad):
        return _scatter_dim(ctx.g, grad, ctx.dim, ctx.sizes), None, None, None


class _Scatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, dim, sizes, g):
        ctx.dim, ctx.g = dim, g
        ctx.sizes = list(sizes) if sizes is not None else local_sizes(x.shape[dim], g.size)
        return _scatter_dim(g, x, dim, ctx.sizes)

    @staticmethod
    def backward(ctx, grad):
        return _gather_dim(ctx.g, grad, ctx.dim, ctx.sizes), None, None, None


class _ReduceScatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, dim, sizes, g):
        ctx.dim, ctx.g = dim, g
        ctx.sizes = list(sizes) if sizes is not None else local_sizes(x.shape[dim], g.size)
        moved = x.movedim(dim, 0)
        return _reduce_scatter_dim0(g, moved, ctx.sizes).movedim(0, dim)

    @staticmethod
    def backward(ctx, grad):
        return _gather_dim(ctx.g, grad, ctx.dim, ctx.sizes), None, None, None


def _all_to_all(g: _Group, x: torch.Tensor, split_dim: int, cat_dim: int,
                split_sizes: Sequence[int], cat_sizes: Sequence[int]) -> torch.Tensor:
    """Splits ``x`` on ``split_dim`` (``split_sizes``), piece r to rank r; concatenates what
    comes back on ``cat_dim`` (rank r sends ``cat_sizes[r]`` there)."""
    pieces = list(x.split(list(split_sizes), dim=split_dim))
    shapes = []
    for r in range(g.size):
        shape = list(x.shape)
        shape[split_dim] = split_sizes[g.rank]
        shape[cat_dim] = cat_sizes[r]
        shapes.append(torch.Size(shape))
    return torch.cat(_all_to_all_list(g, pieces, shapes), dim=cat_dim)


class _AllToAll(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, split_dim, cat_dim, split_sizes, cat_sizes, g):
        splits = list(split_sizes) if split_sizes is not None else \
            local_sizes(x.shape[split_dim], g.size)
        cats = list(cat_sizes) if cat_sizes is not None else [x.shape[cat_dim]] * g.size
        ctx.split_dim, ctx.cat_dim, ctx.splits, ctx.cats, ctx.g = \
            split_dim, cat_dim, splits, cats, g
        return _all_to_all(g, x, split_dim, cat_dim, splits, cats)

    @staticmethod
    def backward(ctx, grad):
        # The inverse: chunk r of the concatenated dim goes back to rank r, which gets the
        # gradient of each piece it sent.
        inverse = _all_to_all(ctx.g, grad, ctx.cat_dim, ctx.split_dim, ctx.cats, ctx.splits)
        return inverse, None, None, None, None, None


class _CopyTo(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, g):
        ctx.g = g
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return _all_reduce(ctx.g, grad), None


class _ReduceFrom(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, g):
        return _all_reduce(g, x)

    @staticmethod
    def backward(ctx, grad):
        return grad, None


class _SumEverywhere(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, g):
        ctx.g = g
        return _all_reduce(g, x)

    @staticmethod
    def backward(ctx, grad):
        return _all_reduce(ctx.g, grad), None


def _solo() -> bool:
    return tp_size() == 1


def gather(x: torch.Tensor, dim: int = 0, sizes: Sequence[int] | None = None) -> torch.Tensor:
    """Every rank's ``x`` concatenated on ``dim`` (``sizes``: each rank's extent there,
    default all equal to this rank's); the backward keeps this rank's slice."""
    return x if _solo() else _Gather.apply(x, dim % x.dim(), sizes, group())


def scatter(x: torch.Tensor, dim: int = 0, sizes: Sequence[int] | None = None) -> torch.Tensor:
    """This rank's slice of ``dim`` (``sizes`` default: SMP's split); the backward gathers."""
    return x if _solo() else _Scatter.apply(x, dim % x.dim(), sizes, group())


def reduce_scatter(x: torch.Tensor, dim: int = 0, sizes: Sequence[int] | None = None) -> torch.Tensor:
    """This rank's slice of ``dim`` of the sum over ranks; the backward gathers."""
    return x if _solo() else _ReduceScatter.apply(x, dim % x.dim(), sizes, group())


def all_to_all(x: torch.Tensor, split_dim: int, cat_dim: int,
               split_sizes: Sequence[int] | None = None,
               cat_sizes: Sequence[int] | None = None) -> torch.Tensor:
    """Piece r of ``split_dim`` (``split_sizes``, default SMP's split) to rank r; what
    arrives, concatenated on ``cat_dim`` (``cat_sizes[r]`` from rank r, default this
    rank's extent from every rank)."""
    if _solo():
        return x
    return _AllToAll.apply(x, split_dim % x.dim(), cat_dim % x.dim(), split_sizes, cat_sizes,
                           group())


def copy_to(x: torch.Tensor) -> torch.Tensor:
    """Identity; the backward sums the gradients over ranks."""
    return x if _solo() else _CopyTo.apply(x, group())


def reduce_from(x: torch.Tensor) -> torch.Tensor:
    """The sum over ranks; the backward passes the gradient through."""
    return x if _solo() else _ReduceFrom.apply(x, group())


def sum_everywhere(x: torch.Tensor) -> torch.Tensor:
    """The sum over ranks, for each rank's own use of it (statistics of a split dimension):
    the backward sums the gradients too."""
    return x if _solo() else _SumEverywhere.apply(x, group())


def all_gather_objects_free(x: torch.Tensor, shapes: Sequence[torch.Size]) -> list[torch.Tensor]:
    """Every rank's tensor, without autograd (state dicts)."""
    if _solo():
        return [x]
    return _all_gather_list(group(), x.detach(), shapes)
