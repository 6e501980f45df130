"""How the DDP wrapper averages a gradient bucket across ranks.

Every bucket goes through ``torch.distributed.all_reduce(async_op=True)`` on the wrapper's
process group. On Shoal's backend that call lands in the c10d extension, which hands the
bucket to the core's asynchronous allreduce with the core's own average (one pass, no
division afterwards) and completes the handle from its completer thread, so the reduction
runs on the core's worker while backward goes on. Going through the extension rather than
the core's Python API keeps one path for both, and measured faster on this machine (the
issuing thread releases the GIL, and completion is polled off the training thread). On
other backends (gloo, for comparison) the bucket is summed and divided by the world size.
"""

from __future__ import annotations

import torch
import torch.distributed as torch_dist

from ..backend import ALIASES, BACKEND_NAME


class TorchTransport:
    """Buckets through ``torch.distributed`` on the given process group."""

    def __init__(self, process_group, world_size: int, native_average: bool):
        self._group = process_group
        self._world_size = world_size
        self._native_average = native_average

    def start(self, tensor: torch.Tensor):
        """Start averaging ``tensor`` in place; returns the function that completes it."""
        op = torch_dist.ReduceOp.AVG if self._native_average else torch_dist.ReduceOp.SUM
        work = torch_dist.all_reduce(tensor, op=op, group=self._group, async_op=True)

        def finish():
            work.wait()
            if not self._native_average:
                tensor.div_(self._world_size)

        return finish


def transport_for(process_group, world_size: int) -> TorchTransport:
    """The transport for a group: the core's own average on Shoal's backend."""
    backend = str(torch_dist.get_backend(process_group)).lower()
    return TorchTransport(process_group, world_size, backend in (BACKEND_NAME, *ALIASES))
