"""Gradients under sharded data parallelism: reduce-scattered as the backward makes them.

Each parameter's whole gradient, as soon as it is complete, joins a bucket (a later
microbatch's is added to the one waiting there, so that a step holds at most one whole
gradient per parameter and reduces it once); a bucket of
``sdp_reduce_bucket_size`` elements (or the last, at the step's end) is reduce-scattered
(averaged) over the sharding group on a thread of its own while the backward goes on, and
each rank adds the chunks it owns into its float32 gradient shards: one flat buffer, a
view per parameter (layout.py's chunks). The whole gradients are dropped as soon as their
bucket is reduced.

At the end of every ``backward_passes_per_step``-th step the shards are averaged over the
replicas (the other sharding groups), and the shards of parameters that tensor
parallelism replicates and whose batch differs per tensor-parallel rank over the TP group,
so that the optimizer sees the gradient of the whole global batch.
"""

from __future__ import annotations

import math
import queue
import threading

import numpy as np
import torch
from shoal.dataparallel import core
from shoal.modelparallel.torch.sharded import layout
from shoal.modelparallel.torch.sharded.groups import SOLO, ShardGroups


class GradientReducer:
    """The gradient shards of one rank and the reductions that fill them."""

    def __init__(self, groups: ShardGroups, bucket_elements: int, every: int = 1,
                 tp_group=SOLO, tp_averaged: frozenset[int] = frozenset(),
                 overlap: bool = True) -> None:
        self.groups = groups
        self.parts = groups.degree
        self.bucket_elements = max(1, int(bucket_elements))
        self.every = every
        self.tp_group = tp_group
        self.tp_averaged = tp_averaged  # ids of parameters averaged over the TP group too
        self.params: list[torch.nn.Parameter] = []
        self.flat = torch.zeros(0)
        self.views: dict[int, torch.Tensor] = {}
        # the bucket: parameter id -> (parameter, its whole gradient), in arrival order
        self._pending: dict[int, tuple[torch.nn.Parameter, torch.Tensor]] = {}
        self._pending_elements = 0
        self._steps = 0
        self._ranges: list[tuple[int, int]] = []  # what norm() counts (_counted)
        self._ranges_key: tuple[int, int] | None = None
        self._error: BaseException | None = None
        self._jobs: queue.Queue | None = None
        if overlap and self.parts > 1:
            self._jobs = queue.Queue()
            threading.Thread(target=self._run, name="shoal-sdp-reduce", daemon=True).start()

    def attach(self, params: list[torch.nn.Parameter]) -> None:
        self.params = [p for p in params if p.requires_grad]
        self.arrange(self.params)

    def arrange(self, ordered: list[torch.nn.Parameter]) -> None:
        """Lays the shards out in ``ordered``'s order (the optimizer's groups), keeping their
        values; the parameters not named follow."""
        named = {id(p) for p in ordered}
        order = list(ordered) + [p for p in self.params if id(p) not in named]
        sizes = [p.ds_tensor.numel() for p in order]
        flat = torch.zeros(sum(sizes))
        views = {}
        for p, at, size in zip(order, layout.offsets(sizes), sizes):
            views[id(p)] = flat[at:at + size]
            if id(p) in self.views:
                views[id(p)].copy_(self.views[id(p)])
        self.flat, self.views, self.params = flat, views, order

    def span(self, params: list[torch.nn.Parameter]) -> torch.Tensor:
        """The gradient shards of ``params`` (consecutive in the layout) as one view."""
        if not params:
            return self.flat[:0]
        start = self.views[id(params[0])].storage_offset()
        return self.flat[start:start + sum(p.ds_tensor.numel() for p in params)]

    # -- during the backward ---------------------------------------------------------------
    def add(self, p: torch.nn.Parameter, grad: torch.Tensor | None) -> None:
        if grad is None:
            return
        # A later microbatch's gradient of a parameter still waiting in the bucket is added
        # to it: one whole gradient per parameter at most, and one reduction per step.
        if id(p) in self._pending:
            waiting = self._pending[id(p)][1]
            if waiting.dtype != torch.float32:  # 16-bit sums in float32, as reduced
                waiting = waiting.float()
                self._pending[id(p)] = (p, waiting)
            waiting.add_(grad.detach())
            return
        self._pending[id(p)] = (p, grad.detach())
        self._pending_elements += p.ds_tensor.numel() * self.parts
        if self._pending_elements >= self.bucket_elements:
            self._flush()

    def _flush(self) -> None:
        batch = list(self._pending.values())
        self._pending, self._pending_elements = {}, 0
        if not batch:
            return
        if self._jobs is None:
            self._reduce(batch)
        else:
            self._jobs.put(batch)

    def _run(self) -> None:
        while True:
            batch = self._jobs.get()
            try:
                if self._error is None:
                    self._reduce(batch)
            except BaseException as exc:  # noqa: BLE001 - raised at the step's end
                self._error = exc
            finally:
                # the whole gradients go now, not when the next bucket comes (a step later)
                batch = None
                self._jobs.task_done()

    def _reduce(self, batch) -> None:
        # The rows are filled a gradient at a time and each whole gradient let go once
        # copied (the batch holds the only reference): the bucket is in memory once, as
        # rows, not twice.
        widths = [self.views[id(p)].numel() for p, _ in batch]
        rows = torch.empty(self.parts, sum(widths))
        for i, (at, width) in enumerate(zip(layout.offsets(widths), widths)):
            p, g = batch[i]
            batch[i] = (p, None)
            rows[:, at:at + width] = layout.padded_rows(g.reshape(-1).float(), self.parts)
            del g
        if self.parts > 1:
            out = torch.from_numpy(core.reduce_scatter(
                rows.numpy(), op="average", group=self.groups.reduce)).reshape(-1)
        else:
            out = rows.reshape(-1)
        at = 0
        for p, _ in batch:
            view = self.views[id(p)]
            view.add_(out[at:at + view.numel()])
            at += view.numel()

    # -- at the step's end -----------------------------------------------------------------
    def finish_step(self) -> bool:
        """Reduces what is left; averages over the replicas every ``every`` steps. Returns
        whether the gradient shards are now those of the whole batch."""
        self._flush()
        if self._jobs is not None:
            self._jobs.join()
        if self._error is not None:
            error, self._error = self._error, None
            raise error
        self._steps += 1
        if self._steps % self.every:
            return False
        if self.groups.replica is not SOLO:
            core.allreduce(self.flat.numpy(), op="average", group=self.groups.replica)
        if self.tp_group is not SOLO and self.tp_averaged:
            mine = [self.views[id(p)] for p in self.params if id(p) in self.tp_averaged]
            joined = torch.cat(mine)
            core.allreduce(joined.numpy(), op="average", group=self.tp_group)
            at = 0
            for view in mine:
                view.copy_(joined[at:at + view.numel()])
                at += view.numel()
        return True

    def zero(self) -> None:
        self.flat.zero_()

    def norm(self, distributed: frozenset[int], tp_rank: int = 0) -> float:
        """The L2 norm of the whole model's gradient, each parameter counted once: the
        shards summed over the sharding group, tensor-parallel shards over the TP group,
        the parameters tensor parallelism does not split from tp_rank 0 only."""
        total = np.zeros(1)
        for start, end in self._counted(distributed, tp_rank):
            total[0] += float(torch.linalg.vector_norm(self.flat[start:end])) ** 2
        if self.parts > 1:
            core.allreduce(total, group=self.groups.control)
        if self.tp_group is not SOLO:
            core.allreduce(total, group=self.tp_group)
        return math.sqrt(float(total[0]))

    def _counted(self, distributed: frozenset[int], tp_rank: int) -> list[tuple[int, int]]:
        """The ranges of the flat buffer this rank counts in the norm (one without tensor
        parallelism), merged where they touch."""
        key = (id(self.flat), tp_rank)
        if self._ranges_key != key:
            ranges: list[tuple[int, int]] = []
            at = 0
            for p in self.params:
                size = self.views[id(p)].numel()
                if tp_rank == 0 or id(p) in distributed:
                    if ranges and ranges[-1][1] == at:
                        ranges[-1] = (ranges[-1][0], at + size)
                    else:
                        ranges.append((at, at + size))
                at += size
            self._ranges, self._ranges_key = ranges, key
        return self._ranges
