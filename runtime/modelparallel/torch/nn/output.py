"""``smp.nn.DistributedTransformerOutputLayer``: a transformer's MLP block, its intermediate
channels split over the TP group (rank r holds ``local_sizes(intermediate_size)[r]``).

Parameters (the unsplit layer's names): ``dense1`` (``hidden -> intermediate``), ``dense2``
(``intermediate -> hidden``), ``pre_layernorm`` and/or ``layernorm``. With ``optimize:
speed`` ``dense1`` is column-parallel and ``dense2`` row-parallel (all-reduce, bias whole),
LayerNorm replicated; with ``optimize: memory`` both take this rank's input channels and
reduce-scatter to its output channels (``dense1`` to its intermediate channels, ``dense2``
to its hidden channels), LayerNorm distributed (see ``layout.py``).

What it computes (SMP's documented reference): ``dense2(act(dense1(x')))`` with ``x'`` the
input, pre-normalised with ``pre_layernorm``; dropout (``hidden_dropout_prob``); then
``layernorm(x + out)`` with ``post_layernorm``, else ``x + out`` (the residual kept, as in
``attention.py``). ``act`` is exact gelu, relu, or ``gelu_new`` (gelu's tanh approximation,
GPT-2's and GPT-J's). With ``single_pre_layernorm`` the block has no layer normalisation of
its own: its input is the attention's pre-normalised one (``DistributedTransformerLayer``
with ``parallel_attn_output``, GPT-J's).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from shoal.modelparallel.errors import SMPConfigError
from shoal.modelparallel.torch.nn.dropout import ParallelDropout
from shoal.modelparallel.torch.nn.layout import Layout
from shoal.modelparallel.torch.nn.module import DistributedModule
from shoal.modelparallel.torch.nn.options import (
    FP32_RESIDUAL_MESSAGE,
    check_activation,
    check_extra,
    check_layernorms,
)
from shoal.modelparallel.torch.nn.projection import ParallelLinear
from shoal.modelparallel.torch.tensorparallel import collectives as tp


class DistributedTransformerOutputLayer(DistributedModule):
    def __init__(self, hidden_size: int = 1024, intermediate_size: int = 4096,
                 hidden_dropout_prob: float = 0.1, activation: str = "gelu",
                 layernorm_epsilon: float = 1e-5, initializer_range: float = 0.02,
                 use_normal_initialization: bool = False, pre_layernorm: bool = False,
                 post_layernorm: bool = True, fp32_residual_addition: bool = False,
                 single_pre_layernorm: bool = False, **extra) -> None:
        super().__init__()
        check_extra(type(self).__name__, extra)
        check_activation(activation)
        check_layernorms(pre_layernorm, post_layernorm, single_pre_layernorm)
        self.hidden_size, self.intermediate_size = int(hidden_size), int(intermediate_size)
        self.activation = activation
        self.layout = Layout(self.hidden_size)
        if fp32_residual_addition and self.layout.optimize != "speed":
            raise SMPConfigError(FP32_RESIDUAL_MESSAGE)
        self.fp32_residual_addition = bool(fp32_residual_addition)
        self.intermediate_sizes = tp.local_sizes(self.intermediate_size, self.tp_size())
        if self.intermediate_sizes[self.tp_rank()] == 0:
            raise SMPConfigError(
                f"intermediate_size {self.intermediate_size} cannot be split over "
                f"{self.tp_size()} tensor-parallel ranks")
        self._build_projections(initializer_range if use_normal_initialization else None)
        self.dropout = ParallelDropout(hidden_dropout_prob)
        eps = float(layernorm_epsilon)
        own_pre = pre_layernorm and not single_pre_layernorm
        self.pre_layernorm = self.layout.layernorm(eps) if own_pre else None
        self.layernorm = self.layout.layernorm(eps) if post_layernorm else None

    @classmethod
    def can_distribute(cls, *args, **kwargs) -> bool:  # noqa: ARG003
        size = DistributedModule.tp_size()
        hidden = kwargs.get("hidden_size", args[0] if args else 1024)
        inter = kwargs.get("intermediate_size", args[1] if len(args) > 1 else 4096)
        return hidden >= size and inter >= size

    def _build_projections(self, normal_std: float | None) -> None:
        hidden, inter = self.layout.hidden_sizes, self.intermediate_sizes
        if self.layout.memory:
            into, out_of = ("sharded", hidden, inter), ("sharded", inter, hidden)
        else:
            into, out_of = ("column", None, inter), ("row", inter, None)
        self.dense1 = ParallelLinear(self.hidden_size, self.intermediate_size, *into, normal_std)
        self.dense2 = ParallelLinear(self.intermediate_size, self.hidden_size, *out_of, normal_std)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layout.leave(self.run(self.layout.enter(x)))

    def run(self, x: torch.Tensor) -> torch.Tensor:
        """The computation in the block's layout."""
        out = self.contribution(self.normalize(x))
        if self.fp32_residual_addition:
            total = (x.float() + out.float()).to(x.dtype)
        else:
            total = x + out
        return self.layernorm(total) if self.layernorm is not None else total

    def normalize(self, x: torch.Tensor) -> torch.Tensor:
        return self.pre_layernorm(x) if self.pre_layernorm is not None else x

    def contribution(self, normed: torch.Tensor) -> torch.Tensor:
        """What the block adds to the residual stream: the MLP of ``normed``, dropped out."""
        if self.tp_size() > 1 and not self.layout.memory:
            normed = tp.copy_to(normed)  # column-parallel input: gradients summed over ranks
        inner = self.dense1(normed)
        if self.activation == "gelu_new":
            inner = F.gelu(inner, approximate="tanh")
        else:
            inner = F.gelu(inner) if self.activation == "gelu" else F.relu(inner)
        out = self.dense2(inner)
        if self.layout.memory:
            return self.dropout(out, shard_dim=-1, sizes=self.layout.hidden_sizes,
                                rank=self.tp_rank())
        return self.dropout(out)

    def extra_repr(self) -> str:
        return (f"hidden={self.hidden_size}, intermediate={self.intermediate_size}, "
                f"activation={self.activation}, optimize={self.layout.optimize}, "
                f"tp_size={self.tp_size()}")
