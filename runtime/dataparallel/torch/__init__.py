"""Shoal's PyTorch data parallelism: the ``shoal`` torch.distributed backend (registered on
import, alias ``smddp``), the ``smdistributed``-style module API (``.distributed``) and its
DistributedDataParallel wrapper (``.parallel.distributed``)."""

from .backend import BACKEND_NAME, register_backend

register_backend()

__all__ = ["BACKEND_NAME", "register_backend"]
