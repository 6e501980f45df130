"""The linear maps of the transformer modules, each holding this rank's shard.

Named like ``nn.Linear`` (``weight [out, in]``, ``bias [out]``) so that a full state dict
reads like the unsplit layer's. Three kinds, after the layout (``layout.py``):

``column``  weight rows split (``weight[out_r, in]``, ``bias[out_r]``): the input is the
            whole, replicated activation; the output is this rank's channels. The caller
            passes its input through ``copy_to`` once for all the projections that read it,
            so that the input's gradient is summed over the group.
``row``     weight columns split (``weight[out, in_r]``): the input is this rank's channels;
            the partial products are all-reduced and the (replicated) bias added once.
``sharded`` weight columns split as ``row``, the partial products reduce-scattered to this
            rank's output channels, ``bias[out_r]`` added there (``optimize: memory``).

Each split is a plain cut of the full tensor on one axis, so shards concatenate to it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from shoal.modelparallel.torch.nn.module import DistributedModule
from shoal.modelparallel.torch.tensorparallel import collectives as tp

KINDS = ("column", "row", "sharded")


class ParallelLinear(DistributedModule):
    def __init__(self, in_features: int, out_features: int, kind: str,
                 in_sizes: Sequence[int] | None = None, out_sizes: Sequence[int] | None = None,
                 normal_std: float | None = None, bias: bool = True) -> None:
        super().__init__()
        if kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, not {kind!r}")
        self.in_features, self.out_features, self.kind = int(in_features), int(out_features), kind
        size = self.tp_size()
        self.in_sizes = list(in_sizes or tp.local_sizes(self.in_features, size))
        self.out_sizes = list(out_sizes or tp.local_sizes(self.out_features, size))
        rank = self.tp_rank()
        if kind == "column":
            self.weight = torch.nn.Parameter(torch.empty(self.out_sizes[rank], self.in_features))
            self.distribute("weight", 0, self.out_features, self.out_sizes)
        else:
            self.weight = torch.nn.Parameter(torch.empty(self.out_features, self.in_sizes[rank]))
            self.distribute("weight", 1, self.in_features, self.in_sizes)
        if not bias:  # GPT-J's attention projections have none
            self.register_parameter("bias", None)
        elif kind == "row":
            self.bias = torch.nn.Parameter(torch.empty(self.out_features))
        else:
            self.bias = torch.nn.Parameter(torch.empty(self.out_sizes[rank]))
            self.distribute("bias", 0, self.out_features, self.out_sizes)
        self.reset_parameters(normal_std)

    def reset_parameters(self, normal_std: float | None = None) -> None:
        """The full layer's initialisation, this rank's part of it: ``nn.Linear``'s, or
        N(0, ``normal_std``) weights and zero biases."""
        full = (self.out_features, self.in_features)
        if normal_std is not None:
            self.init_shard(self.weight, "weight", full,
                            lambda w: torch.nn.init.normal_(w, 0.0, normal_std))
            if self.bias is not None:
                torch.nn.init.zeros_(self.bias)
            return
        self.init_shard(self.weight, "weight", full,
                        lambda w: torch.nn.init.kaiming_uniform_(w, a=math.sqrt(5)))
        if self.bias is None:
            return
        bound = 1 / math.sqrt(self.in_features) if self.in_features else 0.0
        self.init_shard(self.bias, "bias", (self.out_features,),
                        lambda b: torch.nn.init.uniform_(b, -bound, bound))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.tp_size() == 1 or self.kind == "column":
            return F.linear(x, self.weight, self.bias)
        partial = F.linear(x, self.weight)
        if self.kind == "row":
            out = tp.reduce_from(partial)
        else:
            out = tp.reduce_scatter(partial, -1, self.out_sizes)
        return out + self.bias if self.bias is not None else out

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"kind={self.kind}, tp_size={self.tp_size()}")
