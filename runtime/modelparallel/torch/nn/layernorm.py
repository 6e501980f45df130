"""Layer normalisation for tensor parallelism: over a hidden dimension split across the TP
group (``DistributedLayerNorm``, the ``optimize: memory`` layout), and SMP's
``FusedLayerNorm`` name.

``FusedLayerNorm`` is apex's drop-in on GPUs; here it is torch's LayerNorm under that name
and signature (no fused kernel exists on this path; the numerics are LayerNorm's), so the
scripts that import it unconditionally run.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from shoal.modelparallel.torch.nn.module import DistributedModule
from shoal.modelparallel.torch.tensorparallel import collectives as tp


class FusedLayerNorm(torch.nn.LayerNorm):
    def __init__(self, normalized_shape, eps: float = 1e-5, elementwise_affine: bool = True,
                 **_ignored) -> None:
        super().__init__(normalized_shape, eps=eps, elementwise_affine=elementwise_affine)


class DistributedLayerNorm(DistributedModule):
    """LayerNorm over the last dimension of ``hidden_size`` entries, of which this rank holds
    its share (its input is ``[..., local]``): the mean and variance are summed over the
    group; weight and bias are split like the input."""

    def __init__(self, hidden_size: int, eps: float = 1e-5, elementwise_affine: bool = True) -> None:
        super().__init__()
        self.hidden_size, self.eps = int(hidden_size), float(eps)
        local = self.local_channels(self.hidden_size)
        if elementwise_affine:
            self.weight = torch.nn.Parameter(torch.ones(local))
            self.bias = torch.nn.Parameter(torch.zeros(local))
            self.distribute("weight", 0, self.hidden_size)
            self.distribute("bias", 0, self.hidden_size)
        else:
            self.register_parameter("weight", None)
            self.register_parameter("bias", None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.tp_size() == 1:
            return F.layer_norm(x, (self.hidden_size,), self.weight, self.bias, self.eps)
        # Two passes over the whole hidden dimension (as accurate as LayerNorm's own);
        # each rank normalises its shard, so the sums' gradients are summed back.
        mean = tp.sum_everywhere(x.sum(-1, keepdim=True)) / self.hidden_size
        centered = x - mean
        var = tp.sum_everywhere((centered * centered).sum(-1, keepdim=True)) / self.hidden_size
        y = centered * torch.rsqrt(var + self.eps)
        if self.weight is not None:
            y = y * self.weight + self.bias
        return y
