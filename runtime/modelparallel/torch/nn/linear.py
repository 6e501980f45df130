"""``smp.nn.DistributedLinear``: a linear layer whose input features are split over the TP group.

Rank r holds ``weight[:, in_r]`` (``in_r`` its share of the input features: the first
``in % tp`` ranks one more) and, on tp_rank 0 only, the bias. Each rank's batch is its own
(SMP's default): the forward trades rows for features with an all-to-all (``[B, ..., in]``
becomes ``[tp*B, ..., in_r]``), multiplies by its shard, and reduce-scatters the partial
products back over the batch, so each rank gets ``[B, ..., out]``. With ``prescaled_batch``
the group shares one batch: each rank takes its features of it, and the partial products
are summed (all-reduce).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from shoal.modelparallel.torch.nn.module import DistributedModule
from shoal.modelparallel.torch.tensorparallel import collectives as tp


class DistributedLinear(DistributedModule):
    def __init__(self, in_features: int, out_features: int, bias: bool = True) -> None:
        super().__init__()
        self.in_features, self.out_features = int(in_features), int(out_features)
        local_in = self.local_channels(self.in_features)
        self.weight = torch.nn.Parameter(torch.empty(self.out_features, local_in))
        self.distribute("weight", 1, self.in_features)
        # The bias is added once, by tp_rank 0, before the partial products are summed.
        if bias and self.tp_rank() == 0:
            self.bias = torch.nn.Parameter(torch.empty(self.out_features))
        else:
            self.register_parameter("bias", None)
        self._has_bias = bool(bias)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """nn.Linear's initialisation of the full layer, this rank's part of it."""
        self.init_shard(self.weight, "weight", (self.out_features, self.in_features),
                        lambda w: torch.nn.init.kaiming_uniform_(w, a=math.sqrt(5)))
        if self.bias is not None:
            bound = 1 / math.sqrt(self.in_features) if self.in_features else 0.0
            torch.nn.init.uniform_(self.bias, -bound, bound)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        sizes = self._smp_splits["weight"].sizes
        if self.tp_size() == 1:
            return F.linear(x, self.weight, self.bias)
        if self.prescaled_batch():
            partial = F.linear(tp.scatter(x, -1, sizes), self.weight, self.bias)
            return tp.reduce_from(partial)
        mixed = tp.all_to_all(x, split_dim=-1, cat_dim=0, split_sizes=sizes)
        partial = F.linear(mixed, self.weight, self.bias)
        return tp.reduce_scatter(partial, 0, [x.shape[0]] * self.tp_size())

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self._has_bias}, tp_size={self.tp_size()}")
