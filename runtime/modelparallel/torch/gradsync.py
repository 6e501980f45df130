"""Gradient averaging over the data-parallel group (``ddp: True``), overlapping the backward.

The parameters are split into fixed buckets (reverse registration order: the backward
produces the last layers' gradients first; one dtype per bucket, ``bucket_cap_mb`` at most).
A bucket's allreduce starts, on a copy of its gradients, as soon as every parameter in it
has received as many gradient accumulations as in the previous synchronized step (the
microbatches' backwards reaching it), and only after every bucket before it has started:
every replica starts the same allreduces in the same order, whatever order its threads
reach the parameters in.

Nothing is written into ``.grad`` until the step ends, so a guess that was wrong (a
parameter reached more often than the step before: a data-dependent model) costs time,
never correctness: the replicas agree on it with one small allreduce, drop the early
results and reduce the final gradients again. The first step, with nothing to go by,
reduces after the backward.

With optimizer-state sharding (optstate.py) each gradient is needed by its owner only:
:meth:`GradientSync.shard` regroups the buckets by owner, and the end of the step reduces
each bucket onto its owner (half an allreduce's traffic); the other members drop those
gradients.
"""

from __future__ import annotations

import functools
import threading

import numpy as np
import torch
from shoal.dataparallel import core


class GradientSync:
    """Averages the gradients of ``params`` over ``group`` every ``every`` steps."""

    def __init__(self, params: list[torch.nn.Parameter], group, bucket_bytes: int,
                 every: int = 1, overlap: bool = True, timeline=None) -> None:
        self.timeline = timeline  # SHOAL_MP_TIMELINE: an instant per bucket started
        self.params = [p for p in params if p.requires_grad]
        self.group = group
        self.every = every
        self.overlap = overlap
        self.bucket_bytes = bucket_bytes
        self.owners: list[int] | None = None  # optimizer-state sharding: each one's owner
        self.me = 0  # this rank in ``group``
        self.buckets = _bucket_indices(self.params, bucket_bytes)
        self._bucket_of = {i: k for k, bucket in enumerate(self.buckets) for i in bucket}
        self._lock = threading.Lock()
        self._expected: list[int] | None = None
        self._steps = 0
        self._reset()
        # What the last synchronized step did, for tests and the timeline.
        self.started_early = 0
        self.redone = False
        for i, p in enumerate(self.params):
            p.register_post_accumulate_grad_hook(functools.partial(self._accumulated, i))

    def shard(self, owners: list[int], me: int) -> None:
        """Reduces each parameter's gradient onto ``owners[i]`` (a rank of the group; this
        rank is ``me``) instead of every member, after the backward."""
        self.owners, self.me = list(owners), me
        self.overlap = False  # the core's reduce is synchronous: one call per bucket, at the end
        self.buckets = _bucket_indices(self.params, self.bucket_bytes, self.owners)
        self._bucket_of = {i: k for k, bucket in enumerate(self.buckets) for i in bucket}

    def _reset(self) -> None:
        self._counts = [0] * len(self.params)
        self._flats: dict[int, tuple[torch.Tensor, core.Handle]] = {}
        self._next = 0
        self._late = False

    # -- during the backward (autograd's threads) -------------------------------------------
    def _accumulated(self, index: int, _param: torch.Tensor) -> None:
        with self._lock:
            self._counts[index] += 1
            if self._expected is None or not self.overlap:
                return
            if self._bucket_of[index] < self._next:
                self._late = True  # its bucket is already being reduced
                return
            while self._next < len(self.buckets) and self._ready(self._next):
                self._start(self._next)

    def _ready(self, k: int) -> bool:
        expected = self._expected
        return all(0 < expected[i] <= self._counts[i] for i in self.buckets[k])

    def _start(self, k: int) -> None:
        flat = self._flat(k)
        array, dtype = _typed(flat)
        handle = core.allreduce_async(array, op="average", dtype=dtype, group=self.group)
        core.flush(self.group)  # a bucket is already the unit to reduce: no waiting to fuse
        if self.timeline is not None:
            self.timeline.instant("allreduce", "allreduce", bucket=k,
                                  bytes=flat.numel() * flat.element_size())
        self._flats[k] = (flat, handle)
        self._next = k + 1

    def _flat(self, k: int) -> torch.Tensor:
        """A copy of bucket ``k``'s gradients, end to end."""
        return torch.cat([self._grad(i).reshape(-1) for i in self.buckets[k]])

    def _grad(self, i: int) -> torch.Tensor:
        p = self.params[i]
        if p.grad is None:  # the same list on every replica: a missing gradient is a zero
            p.grad = torch.zeros_like(p)
        return p.grad.detach()

    # -- at the end of the step ------------------------------------------------------------
    def finish_step(self) -> None:
        """Called by every rank after each step; averages on every ``every``-th."""
        self._steps += 1
        if self._steps % self.every:
            return
        if self.owners is not None:
            self._reduce_to_owners()
            return
        with self._lock:
            early = len(self._flats)
            # Whether any replica may have started early: the same on every replica.
            could_start = self.overlap and self._expected is not None
            while self._next < len(self.buckets):
                self._start(self._next)
            flats, late, counts = self._flats, self._late, self._counts
            self._expected = counts
            self._reset()
        began = self.timeline.now() if self.timeline is not None else 0.0
        for _, handle in flats.values():
            handle.wait()
        redo = False
        if could_start:
            flag = np.array([1.0 if late else 0.0])
            redo = bool(core.allreduce(flag, op="max", group=self.group)[0])
        if redo:
            flats = {}
            for k in range(len(self.buckets)):
                flat = self._flat(k)
                array, dtype = _typed(flat)
                core.allreduce(array, op="average", dtype=dtype, group=self.group)
                flats[k] = (flat, None)
        for k, (flat, _) in flats.items():
            offset = 0
            for i in self.buckets[k]:
                grad = self.params[i].grad
                grad.detach().copy_(flat[offset:offset + grad.numel()].view_as(grad))
                offset += grad.numel()
        self.started_early, self.redone = (0 if redo else early), redo
        if self.timeline is not None:
            self.timeline.span("allreduce wait", "allreduce", began, self.timeline.now(),
                               started_early=self.started_early, redone=redo)


    def _reduce_to_owners(self) -> None:
        with self._lock:
            self._expected = self._counts
            self._reset()
        for k, bucket in enumerate(self.buckets):
            owner = self.owners[bucket[0]]
            flat = self._flat(k)
            array, dtype = _typed(flat)
            core.reduce(array, op="average", root=owner, dtype=dtype, group=self.group)
            offset = 0
            for i in bucket:
                param = self.params[i]
                if owner == self.me:
                    param.grad.detach().copy_(flat[offset:offset + param.numel()].view_as(param))
                else:
                    param.grad = None  # the owner steps it; this copy would only take memory
                offset += param.numel()
        self.started_early, self.redone = 0, False


def _typed(flat: torch.Tensor) -> tuple[np.ndarray, str | None]:
    """``flat``'s storage as the core takes it: numpy has no bfloat16, so its bits go as
    uint16 with the dtype named."""
    if flat.dtype == torch.bfloat16:
        return flat.view(torch.int16).numpy().view(np.uint16), "bfloat16"
    return flat.numpy(), None


def _bucket_indices(params: list[torch.nn.Parameter], limit: int,
                    owners: list[int] | None = None) -> list[list[int]]:
    """Indices of ``params`` in buckets of at most ``limit`` bytes (one parameter at least),
    one dtype (and one owner, if given) each, from the last parameter to the first."""
    buckets: list[list[int]] = []
    open_: dict[tuple, tuple[list[int], int]] = {}
    for i in reversed(range(len(params))):
        p = params[i]
        size = p.numel() * p.element_size()
        key = (p.dtype, owners[i] if owners is not None else 0)
        bucket, used = open_.get(key, ([], 0))
        if bucket and used + size > limit:
            buckets.append(bucket)
            bucket, used = [], 0
        bucket.append(i)
        open_[key] = (bucket, used + size)
    buckets.extend(bucket for bucket, _ in open_.values() if bucket)
    return buckets
