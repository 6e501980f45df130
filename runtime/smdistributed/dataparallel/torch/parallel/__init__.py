"""``smdistributed.dataparallel.torch.parallel``: Shoal's DistributedDataParallel wrapper."""

from shoal.dataparallel.torch.parallel import DistributedDataParallel

__all__ = ["DistributedDataParallel"]
