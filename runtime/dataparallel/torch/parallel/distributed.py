"""Shoal's own DistributedDataParallel: the wrapper of the ``smdistributed.dataparallel``
module API (``from smdistributed.dataparallel.torch.parallel.distributed import
DistributedDataParallel as DDP``).

At construction it broadcasts rank 0's parameters and buffers. During backward, a hook on
each parameter's gradient accumulation marks it ready; a bucket whose parameters are all
ready is packed (gradients become views of the bucket's flat buffer) and its average across
ranks is started asynchronously (on Shoal's backend, by the core's allreduce with its own
average; see ``transport``), in bucket order, so communication overlaps the rest of backward. At the end
of backward the wrapper waits for every bucket.
``no_sync()`` skips all of it, so gradients accumulate locally until the next synced step.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch
import torch.distributed as torch_dist
from shoal.errors import RuntimeFailure
from torch import nn
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

from .buckets import bucket_cap_bytes, plan_buckets
from .transport import transport_for


class _Bucket:
    """One flat gradient buffer and the parameters whose gradients are views of it."""

    def __init__(self, params: list[torch.Tensor]):
        self.params = params
        self.buffer = torch.zeros(
            sum(p.numel() for p in params), dtype=params[0].dtype, device=params[0].device
        )
        self.views = []
        offset = 0
        for param in params:
            self.views.append(self.buffer[offset : offset + param.numel()].view_as(param))
            offset += param.numel()
        self.pending = len(params)
        self.finish = None  # completes this step's reduction (set when started)

    def pack(self, position: int) -> None:
        """Make the parameter's gradient a view of this bucket (copying it in if needed)."""
        param, view = self.params[position], self.views[position]
        grad = param.grad
        if grad is None:
            view.zero_()
        elif grad.data_ptr() != view.data_ptr():
            view.copy_(grad)
            param.grad = view


class DistributedDataParallel(nn.Module):
    """Data parallelism over Shoal's collectives: wrap the model, train as usual.

    ``device_ids`` and ``output_device`` are accepted for parity and unused on CPU;
    ``process_group`` may be ``None`` or the world group; ``bucket_cap_mb`` defaults to 25.
    """

    def __init__(
        self,
        module: nn.Module,
        device_ids=None,
        output_device=None,
        broadcast_buffers: bool = True,
        process_group=None,
        bucket_cap_mb: float | None = None,
    ):
        super().__init__()
        if not torch_dist.is_initialized():
            raise RuntimeFailure(
                "DistributedDataParallel needs an initialized process group: call "
                "smdistributed.dataparallel.torch.distributed.init_process_group() first"
            )
        self.module = module
        self.device_ids = device_ids
        self.output_device = output_device
        self.broadcast_buffers = broadcast_buffers
        self.process_group = process_group
        self.bucket_bytes = bucket_cap_bytes(bucket_cap_mb)
        self.require_backward_grad_sync = True
        self._world_size = torch_dist.get_world_size(process_group)
        self._sync_module_states()
        self._params = _unique_trainable(module)
        self._buckets, self._where = self._make_buckets()
        self._transport = transport_for(process_group, self._world_size)
        self._next_bucket = 0
        self._finalizer_queued = False
        self._hooks = [
            param.register_post_accumulate_grad_hook(self._make_hook(index))
            for index, param in enumerate(self._params)
        ]

    def forward(self, *inputs, **kwargs):
        if self.broadcast_buffers:
            self._broadcast_coalesced(list(self.module.buffers()))
        return self.module(*inputs, **kwargs)

    @contextmanager
    def no_sync(self):
        """Skip gradient synchronization inside the block; gradients accumulate locally and
        are reduced, together with the next step's, by the first backward after it."""
        previous = self.require_backward_grad_sync
        self.require_backward_grad_sync = False
        try:
            yield
        finally:
            self.require_backward_grad_sync = previous

    # construction -------------------------------------------------------------------

    def _sync_module_states(self) -> None:
        states = [*self.module.parameters(), *self.module.buffers()]
        self._broadcast_coalesced(states)

    def _broadcast_coalesced(self, tensors: list[torch.Tensor]) -> None:
        """Broadcast rank 0's values of ``tensors`` in flat chunks of one dtype each."""
        if not tensors or self._world_size == 1:
            return
        nbytes = [t.numel() * t.element_size() for t in tensors]
        dtypes = [t.dtype for t in tensors]
        with torch.no_grad():
            for group in plan_buckets(nbytes, dtypes, self.bucket_bytes):
                chunk = [tensors[i] for i in group]
                flat = _flatten_dense_tensors([t.detach() for t in chunk])
                torch_dist.broadcast(flat, src=0, group=self.process_group)
                for tensor, synced in zip(chunk, _unflatten_dense_tensors(flat, chunk)):
                    tensor.copy_(synced)

    def _make_buckets(self):
        nbytes = [p.numel() * p.element_size() for p in self._params]
        keys = [(p.dtype, p.device) for p in self._params]
        buckets, where = [], {}
        for bucket_index, indices in enumerate(plan_buckets(nbytes, keys, self.bucket_bytes)):
            buckets.append(_Bucket([self._params[i] for i in indices]))
            for position, index in enumerate(indices):
                where[index] = (bucket_index, position)
        return buckets, where

    # backward -----------------------------------------------------------------------

    def _make_hook(self, index: int):
        def hook(param: torch.Tensor) -> None:
            if self.require_backward_grad_sync:
                self._mark_ready(index)

        return hook

    def _mark_ready(self, index: int) -> None:
        if not self._finalizer_queued:
            self._finalizer_queued = True
            torch.autograd.Variable._execution_engine.queue_callback(self._finish_backward)
        bucket_index, position = self._where[index]
        bucket = self._buckets[bucket_index]
        bucket.pack(position)
        bucket.pending -= 1
        # Buckets start strictly in order so that every rank issues the same sequence.
        while self._next_bucket < len(self._buckets):
            if self._buckets[self._next_bucket].pending > 0:
                break
            self._launch(self._buckets[self._next_bucket])

    def _launch(self, bucket: _Bucket) -> None:
        bucket.finish = self._transport.start(bucket.buffer)
        self._next_bucket += 1

    def _finish_backward(self) -> None:
        """Start buckets left pending (unused parameters), wait for all, average."""
        try:
            while self._next_bucket < len(self._buckets):
                bucket = self._buckets[self._next_bucket]
                for position in range(len(bucket.params)):
                    bucket.pack(position)
                self._launch(bucket)
            for bucket in self._buckets:
                finish, bucket.finish = bucket.finish, None
                finish()  # the bucket now holds the average over all ranks
        finally:
            for bucket in self._buckets:
                bucket.pending = len(bucket.params)
            self._next_bucket = 0
            self._finalizer_queued = False


def _unique_trainable(module: nn.Module) -> list[torch.Tensor]:
    seen, params = set(), []
    for param in module.parameters():
        if param.requires_grad and id(param) not in seen:
            seen.add(id(param))
            params.append(param)
    return params
