"""Importing this module registers the ``smddp`` (and ``shoal``) torch.distributed backend,
as ``import smdistributed.dataparallel.torch.torch_smddp`` does with the closed library."""

from .backend import ALIASES, BACKEND_NAME, register_backend

register_backend()

__all__ = ["ALIASES", "BACKEND_NAME", "register_backend"]
