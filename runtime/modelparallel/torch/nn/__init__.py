"""``smp.nn``: SMP's tensor-parallel modules (``smdistributed.modelparallel.torch.nn``)."""

from shoal.modelparallel.torch.nn.embedding import DistributedEmbedding
from shoal.modelparallel.torch.nn.layernorm import DistributedLayerNorm, FusedLayerNorm
from shoal.modelparallel.torch.nn.linear import DistributedLinear
from shoal.modelparallel.torch.nn.module import DistributedModule

__all__ = ["DistributedModule", "DistributedLinear", "DistributedEmbedding",
           "DistributedLayerNorm", "FusedLayerNorm"]
