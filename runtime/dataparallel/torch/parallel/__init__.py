"""Shoal's DistributedDataParallel wrapper (``from ...parallel import DistributedDataParallel``)."""

from .distributed import DistributedDataParallel

__all__ = ["DistributedDataParallel"]
