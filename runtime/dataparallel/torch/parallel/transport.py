"""How the DDP wrapper averages a gradient bucket across ranks.

On Shoal's backend the wrapper hands each bucket straight to the core's asynchronous
allreduce (``op="average"``), which packs consecutive buckets into its fusion buffers and
reduces them on its worker thread while backward goes on. Buckets are issued and waited for
on the thread that runs backward, in program order, so every rank cuts the fusion buffers at
the same places. On any other backend (gloo, for comparison) the bucket goes through
``torch.distributed.all_reduce`` with a sum, divided by the world size when it completes.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.distributed as torch_dist

from ..backend import ALIASES, BACKEND_NAME

_CORE_DTYPES = {
    torch.float32: None,
    torch.float64: None,
    torch.float16: None,
    torch.int32: None,
    torch.int64: None,
    torch.bfloat16: "bfloat16",
}


def _numpy_view(tensor: torch.Tensor) -> np.ndarray:
    """A numpy view of a contiguous CPU tensor (bfloat16 as its uint16 bits)."""
    if tensor.dtype == torch.bfloat16:
        return tensor.view(torch.int16).numpy().view(np.uint16)
    return tensor.numpy()


class CoreTransport:
    """Buckets through the core's fused asynchronous average."""

    def __init__(self):
        from shoal.dataparallel import core

        self._core = core

    def supports(self, tensor: torch.Tensor) -> bool:
        return tensor.device.type == "cpu" and tensor.dtype in _CORE_DTYPES

    def start(self, tensor: torch.Tensor):
        handle = self._core.allreduce_async(
            _numpy_view(tensor), op="average", dtype=_CORE_DTYPES[tensor.dtype]
        )
        return handle.wait


class TorchTransport:
    """Buckets through ``torch.distributed`` on the given process group."""

    def __init__(self, process_group, world_size: int):
        self._group = process_group
        self._world_size = world_size

    def supports(self, tensor: torch.Tensor) -> bool:
        return True

    def start(self, tensor: torch.Tensor):
        work = torch_dist.all_reduce(
            tensor, op=torch_dist.ReduceOp.SUM, group=self._group, async_op=True
        )

        def finish():
            work.wait()
            tensor.div_(self._world_size)

        return finish


def transport_for(process_group, world_size: int):
    """The core's transport when the group runs on Shoal's backend, else torch's."""
    backend = str(torch_dist.get_backend(process_group)).lower()
    if backend in (BACKEND_NAME, *ALIASES):
        return CoreTransport()
    return TorchTransport(process_group, world_size)
