"""``smp.nn.DistributedAttentionLayer``: multi-head self- or cross-attention with its output
projection, dropout, residual connection and layer normalisation, heads split over the TP
group (rank r holds ``local_sizes(num_attention_heads)[r]`` heads: the first
``heads % tp`` ranks one more).

Parameters (the unsplit layer's names): ``query``, ``key``, ``value`` (``hidden -> heads *
head_size``), ``dense`` (``heads * head_size -> hidden``), ``pre_layernorm`` and/or
``layernorm``. With ``optimize: speed`` Q/K/V are column-parallel (weight rows split by
heads) and ``dense`` row-parallel (weight columns split by heads, all-reduce, bias whole);
LayerNorm is replicated. With ``optimize: memory`` every projection takes this rank's
hidden channels (weight columns split) and reduce-scatters to its heads, ``dense`` back to
its hidden channels; LayerNorm is a ``DistributedLayerNorm`` (see ``layout.py``).

What it computes (SMP's documented reference): scores ``q k^T / sqrt(head_size)``; a
causal mask (``causal_mask_size``, self-attention only) puts ``mask_value`` on the future;
the additive ``attention_mask`` ``[N, 1, 1, S]`` is added; softmax, dropout, the weighted
values, ``dense``, dropout; then ``layernorm(out + hidden_states)`` with ``post_layernorm``,
else ``out + hidden_states``. (The documentation's sketch returns ``out`` alone without
post-layernorm; a pre-layernorm block such as GPT-2's, which SMP maps onto this layer with
``pre_layernorm=True, post_layernorm=False``, keeps its residual connection, as here.)
Cross-attention takes keys and values from ``cross_states`` (not normalised).

Beyond the documented arguments: ``rotary_dim`` (GPT-J: that many channels of each head
rotated, interleaved pairs) or ``rotary_pct`` (GPT-NeoX: that share of each head, halves
paired), with ``rotary_emb_base``, rotate queries and keys by position (``rotary.py``);
``attention_bias=False`` drops the biases of the four projections (GPT-J);
``fused_qkv_per_head`` (GPT-NeoX's layout, self-attention only) replaces ``query``, ``key``,
``value`` by one ``query_key_value`` (``hidden -> 3 * heads * head_size``) whose outputs are
grouped by head, ``[q_h, k_h, v_h]`` for each head h: split by heads it is a plain cut of its
rows, each rank's rows its heads' queries, keys and values.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from shoal.modelparallel.errors import SMPConfigError
from shoal.modelparallel.torch.nn import rotary
from shoal.modelparallel.torch.nn.dropout import ParallelDropout
from shoal.modelparallel.torch.nn.layout import Layout
from shoal.modelparallel.torch.nn.module import DistributedModule
from shoal.modelparallel.torch.nn.options import check_extra, check_layernorms
from shoal.modelparallel.torch.nn.projection import ParallelLinear
from shoal.modelparallel.torch.tensorparallel import collectives as tp


class DistributedAttentionLayer(DistributedModule):
    def __init__(self, num_attention_heads: int = 32, attention_head_size: int = 32,
                 hidden_size: int = 1024, attention_dropout_prob: float = 0.1,
                 hidden_dropout_prob: float = 0.1, layernorm_epsilon: float = 1e-5,
                 initializer_range: float = 0.02, use_normal_initialization: bool = False,
                 cross_attention: bool = False, causal_mask_size: int | None = None,
                 pre_layernorm: bool = False, post_layernorm: bool = True,
                 mask_value: float = -1e4, scale_attention_scores: bool = True,
                 rotary_dim: int | None = None, rotary_pct: float | None = None,
                 rotary_emb_base: float = 10000.0, attention_bias: bool = True,
                 fused_qkv_per_head: bool = False, **extra) -> None:
        super().__init__()
        check_extra(type(self).__name__, extra)
        check_layernorms(pre_layernorm, post_layernorm)
        self.attention_bias = bool(attention_bias)
        self.fused_qkv_per_head = bool(fused_qkv_per_head)
        if self.fused_qkv_per_head and cross_attention:
            raise SMPConfigError("fused_qkv_per_head is for self-attention only")
        self.num_attention_heads, self.attention_head_size = int(num_attention_heads), \
            int(attention_head_size)
        self.hidden_size, self.cross_attention = int(hidden_size), bool(cross_attention)
        self.mask_value, self.scale_attention_scores = float(mask_value), bool(scale_attention_scores)
        self.layout = Layout(self.hidden_size)
        self.head_counts = tp.local_sizes(self.num_attention_heads, self.tp_size())
        if self.head_counts[self.tp_rank()] == 0:
            raise SMPConfigError(
                f"{self.num_attention_heads} attention heads cannot be split over "
                f"{self.tp_size()} tensor-parallel ranks: every rank needs at least one head")
        self._set_rotary(rotary_dim, rotary_pct, rotary_emb_base)
        self._build_projections(None if not use_normal_initialization else initializer_range)
        self.dropout1 = ParallelDropout(attention_dropout_prob)
        self.dropout2 = ParallelDropout(hidden_dropout_prob)
        eps = float(layernorm_epsilon)
        self.pre_layernorm = self.layout.layernorm(eps) if pre_layernorm else None
        self.layernorm = self.layout.layernorm(eps) if post_layernorm else None
        self.causal_mask_size = causal_mask_size
        if causal_mask_size is not None and not self.cross_attention:
            size = int(causal_mask_size)
            causal = torch.tril(torch.ones(size, size, dtype=torch.bool))
            self.register_buffer("causal_mask", causal, persistent=False)
        else:
            self.causal_mask = None

    @classmethod
    def can_distribute(cls, *args, **kwargs) -> bool:  # noqa: ARG003
        heads = kwargs.get("num_attention_heads", args[0] if args else 32)
        return heads >= DistributedModule.tp_size()

    def _set_rotary(self, rotary_dim, rotary_pct, base) -> None:
        if rotary_dim is not None and rotary_pct is not None:
            raise SMPConfigError("rotary_dim and rotary_pct are exclusive: give one of them")
        self.rotary_interleaved = rotary_dim is not None
        if rotary_pct is not None:
            rotary_dim = int(self.attention_head_size * float(rotary_pct))
        self.rotary_dim = int(rotary_dim) if rotary_dim else 0
        if self.rotary_dim % 2 or self.rotary_dim > self.attention_head_size:
            raise SMPConfigError(f"rotary_dim ({self.rotary_dim}) must be even and at most the "
                                 f"attention head size ({self.attention_head_size})")
        self.rotary_emb_base = float(base)

    def _build_projections(self, normal_std: float | None) -> None:
        width = self.num_attention_heads * self.attention_head_size
        heads = [h * self.attention_head_size for h in self.head_counts]
        hidden = self.layout.hidden_sizes
        if self.layout.memory:
            into, out_of = ("sharded", hidden, heads), ("sharded", heads, hidden)
        else:
            into, out_of = ("column", None, heads), ("row", heads, None)
        bias = self.attention_bias
        if self.fused_qkv_per_head:
            kind, in_sizes, out_sizes = into
            self.query_key_value = ParallelLinear(self.hidden_size, 3 * width, kind, in_sizes,
                                                  [3 * h for h in out_sizes], normal_std, bias)
        else:
            self.query = ParallelLinear(self.hidden_size, width, *into, normal_std, bias)
            self.key = ParallelLinear(self.hidden_size, width, *into, normal_std, bias)
            self.value = ParallelLinear(self.hidden_size, width, *into, normal_std, bias)
        self.dense = ParallelLinear(width, self.hidden_size, *out_of, normal_std, bias)

    # -- the public forward: this rank's rows in and out ------------------------------------
    def forward(self, inputs):
        if self.cross_attention:
            hidden_states, cross_states, attention_mask = inputs
        else:
            (hidden_states, attention_mask), cross_states = inputs, None
        rows = hidden_states.shape[0]
        layout = self.layout
        hidden = layout.enter(hidden_states)
        cross = layout.enter(cross_states) if cross_states is not None else None
        out = self.run(hidden, layout.enter_mask(attention_mask, rows), cross)
        return layout.leave(out)

    # -- the computation in the block's layout -------------------------------------------
    def run(self, hidden: torch.Tensor, mask: torch.Tensor | None,
            cross: torch.Tensor | None = None) -> torch.Tensor:
        out = self.contribution(self.normalize(hidden), mask, cross) + hidden
        return self.layernorm(out) if self.layernorm is not None else out

    def normalize(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.pre_layernorm(hidden) if self.pre_layernorm is not None else hidden

    def contribution(self, normed: torch.Tensor, mask: torch.Tensor | None,
                     cross: torch.Tensor | None = None) -> torch.Tensor:
        """What the layer adds to the residual stream: attention over ``normed`` (the
        pre-normalised input), projected and dropped out."""
        source = cross if self.cross_attention else None
        if self.tp_size() > 1 and not self.layout.memory:
            # Column-parallel inputs: one copy each, so their gradients are summed once.
            normed = tp.copy_to(normed)
            source = tp.copy_to(source) if source is not None else None
        if source is None:
            source = normed
        q, k, v = self._qkv(normed, source)
        if self.rotary_dim:
            q = rotary.rotate(q, self.rotary_dim, self.rotary_interleaved, self.rotary_emb_base)
            k = rotary.rotate(k, self.rotary_dim, self.rotary_interleaved, self.rotary_emb_base)
        context = self._attend(q, k, v, mask)
        return self.dropout2(self.dense(context), **self._hidden_shard())

    def _qkv(self, normed: torch.Tensor, source: torch.Tensor):
        """Queries, keys and values, each ``[N, local_heads, S, head_size]``."""
        if not self.fused_qkv_per_head:
            return (self._heads(self.query(normed)), self._heads(self.key(source)),
                    self._heads(self.value(source)))
        n, s = normed.shape[0], normed.shape[1]
        grouped = self.query_key_value(normed).view(n, s, -1, 3, self.attention_head_size)
        return tuple(grouped[:, :, :, j].permute(0, 2, 1, 3) for j in range(3))

    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        """``[N, S, local_heads * head_size]`` -> ``[N, local_heads, S, head_size]``."""
        n, s = x.shape[0], x.shape[1]
        return x.view(n, s, -1, self.attention_head_size).permute(0, 2, 1, 3)

    def _attend(self, q, k, v, mask) -> torch.Tensor:
        scores = torch.matmul(q, k.transpose(-1, -2))
        if self.scale_attention_scores:
            scores = scores / math.sqrt(self.attention_head_size)
        if self.causal_mask is not None:
            scores = self._apply_causal_mask(scores)
        if mask is not None:
            scores = scores + mask
        probs = F.softmax(scores, dim=-1)
        probs = self.dropout1(probs, shard_dim=1, sizes=self.head_counts, rank=self.tp_rank())
        context = torch.matmul(probs, v).permute(0, 2, 1, 3)
        return context.reshape(context.shape[0], context.shape[1], -1)

    def _apply_causal_mask(self, scores: torch.Tensor) -> torch.Tensor:
        queries, keys = scores.shape[-2], scores.shape[-1]
        if keys > self.causal_mask.shape[0]:
            raise ValueError(f"sequence length {keys} exceeds causal_mask_size "
                             f"{self.causal_mask.shape[0]}")
        allowed = self.causal_mask[keys - queries:keys, :keys]
        return scores.masked_fill(~allowed, self.mask_value)

    def _hidden_shard(self) -> dict:
        """How a dropout's input of hidden width is split in this layout."""
        if not self.layout.memory:
            return {}
        return {"shard_dim": -1, "sizes": self.layout.hidden_sizes, "rank": self.tp_rank()}

    def extra_repr(self) -> str:
        return (f"heads={self.num_attention_heads}, head_size={self.attention_head_size}, "
                f"hidden={self.hidden_size}, cross_attention={self.cross_attention}, "
                f"optimize={self.layout.optimize}, tp_size={self.tp_size()}")
