"""``smp.nn``: SMP's tensor-parallel modules (``smdistributed.modelparallel.torch.nn``)."""

from shoal.modelparallel.torch.nn.attention import DistributedAttentionLayer
from shoal.modelparallel.torch.nn.embedding import DistributedEmbedding
from shoal.modelparallel.torch.nn.layernorm import DistributedLayerNorm, FusedLayerNorm
from shoal.modelparallel.torch.nn.linear import DistributedLinear
from shoal.modelparallel.torch.nn.lmhead import DistributedTransformerLMHead
from shoal.modelparallel.torch.nn.module import DistributedModule
from shoal.modelparallel.torch.nn.output import DistributedTransformerOutputLayer
from shoal.modelparallel.torch.nn.transformer import (
           DistributedTransformer,
           DistributedTransformerLayer,
)

__all__ = ["DistributedModule", "DistributedLinear", "DistributedEmbedding",
           "DistributedLayerNorm", "FusedLayerNorm", "DistributedAttentionLayer",
           "DistributedTransformerOutputLayer", "DistributedTransformerLayer",
           "DistributedTransformer", "DistributedTransformerLMHead", "huggingface"]

# Last: it may register Hugging Face classes already imported, which needs the modules above.
from shoal.modelparallel.torch.nn import huggingface  # noqa: E402 - transformers stays optional
