"""``smp.nn.DistributedTransformerLayer`` (attention, optional cross-attention, MLP) and
``smp.nn.DistributedTransformer`` (``num_layers`` of them in ``seq_layers``, an
``nn.Sequential``).

Children: ``attention`` (``DistributedAttentionLayer``), ``cross_attention`` (with
``add_cross_attention``), ``output`` (``DistributedTransformerOutputLayer``); their
parameters are split as those modules say.

A layer's ``forward`` takes this rank's rows, ``(hidden_states, attention_mask)`` or
``(hidden_states, cross_states, attention_mask, cross_mask)``, and returns the same tuple
with the new hidden states. Between the layers of a stack the tuple stays in the block's
layout (``layout.py``): the first layer enters it (gathering rows or trading them for hidden
channels), the last leaves it, so the stack pays that exchange once, not once per layer.
``seq_layers`` can still be run (or checkpointed) child by child.

``parallel_attn_output`` (GPT-J, GPT-NeoX): the attention and the MLP both read the layer's
input and their outputs are added to it, ``x + attn(ln1(x)) + mlp(ln2(x))``, instead of the
MLP reading the attention's result; with ``single_pre_layernorm`` (GPT-J) both read the same
``ln1(x)``. The attention's own options (rotary embeddings, ``attention_bias``,
``fused_qkv_per_head``) pass through.
"""

from __future__ import annotations

import torch
from shoal.modelparallel.errors import SMPUnsupportedError
from shoal.modelparallel.torch.nn.attention import DistributedAttentionLayer
from shoal.modelparallel.torch.nn.module import DistributedModule
from shoal.modelparallel.torch.nn.options import check_activation, check_extra, check_layernorms
from shoal.modelparallel.torch.nn.output import DistributedTransformerOutputLayer


class DistributedTransformerLayer(DistributedModule):
    def __init__(self, num_attention_heads: int = 32, attention_head_size: int = 32,
                 hidden_size: int = 1024, intermediate_size: int = 4096,
                 attention_dropout_prob: float = 0.1, hidden_dropout_prob: float = 0.1,
                 activation: str = "gelu", layernorm_epsilon: float = 1e-5,
                 initializer_range: float = 0.02, use_normal_initialization: bool = False,
                 causal_mask_size: int | None = None, add_cross_attention: bool = False,
                 pre_layernorm: bool = False, post_layernorm: bool = True,
                 mask_value: float = -1e4, scale_attention_scores: bool = True,
                 fp32_residual_addition: bool = False, parallel_attn_output: bool = False,
                 single_pre_layernorm: bool = False, rotary_dim: int | None = None,
                 rotary_pct: float | None = None, rotary_emb_base: float = 10000.0,
                 attention_bias: bool = True, fused_qkv_per_head: bool = False,
                 **extra) -> None:
        super().__init__()
        check_extra(type(self).__name__, extra)
        check_activation(activation)
        check_layernorms(pre_layernorm, post_layernorm, single_pre_layernorm)
        self._check_parallel(parallel_attn_output, single_pre_layernorm, post_layernorm,
                             add_cross_attention, fp32_residual_addition)
        self.parallel_attn_output = bool(parallel_attn_output)
        self.single_pre_layernorm = bool(single_pre_layernorm)
        self.add_cross_attention = bool(add_cross_attention)
        common = dict(num_attention_heads=num_attention_heads,
                      attention_head_size=attention_head_size, hidden_size=hidden_size,
                      attention_dropout_prob=attention_dropout_prob,
                      hidden_dropout_prob=hidden_dropout_prob,
                      layernorm_epsilon=layernorm_epsilon, initializer_range=initializer_range,
                      use_normal_initialization=use_normal_initialization,
                      pre_layernorm=pre_layernorm, post_layernorm=post_layernorm,
                      mask_value=mask_value, scale_attention_scores=scale_attention_scores,
                      **extra)
        common["pre_layernorm"] = pre_layernorm or single_pre_layernorm
        self.attention = DistributedAttentionLayer(
            causal_mask_size=causal_mask_size, rotary_dim=rotary_dim, rotary_pct=rotary_pct,
            rotary_emb_base=rotary_emb_base, attention_bias=attention_bias,
            fused_qkv_per_head=fused_qkv_per_head, **common)
        if self.add_cross_attention:
            self.cross_attention = DistributedAttentionLayer(cross_attention=True, **common)
        self.output = DistributedTransformerOutputLayer(
            hidden_size=hidden_size, intermediate_size=intermediate_size,
            hidden_dropout_prob=hidden_dropout_prob, activation=activation,
            layernorm_epsilon=layernorm_epsilon, initializer_range=initializer_range,
            use_normal_initialization=use_normal_initialization, pre_layernorm=pre_layernorm,
            post_layernorm=post_layernorm, fp32_residual_addition=fp32_residual_addition,
            single_pre_layernorm=single_pre_layernorm, **extra)
        self.layout = self.attention.layout
        # Whether this layer's input / output is this rank's rows (else the block layout).
        self.enters_layout = True
        self.leaves_layout = True

    @classmethod
    def can_distribute(cls, *args, **kwargs) -> bool:
        names = ("num_attention_heads", "attention_head_size", "hidden_size", "intermediate_size")
        given = dict(zip(names, args)) | kwargs
        return (DistributedAttentionLayer.can_distribute(**given)
                and DistributedTransformerOutputLayer.can_distribute(
                    hidden_size=given.get("hidden_size", 1024),
                    intermediate_size=given.get("intermediate_size", 4096)))

    @staticmethod
    def _check_parallel(parallel, single, post, cross, fp32_residual) -> None:
        if single and not parallel:
            raise SMPUnsupportedError("single_pre_layernorm=True needs parallel_attn_output=True "
                                      "(the MLP reads the attention's normalised input)")
        if parallel and (post or cross or fp32_residual):
            raise SMPUnsupportedError(
                "parallel_attn_output=True is supported with pre-layernorm only, without "
                "post_layernorm, cross-attention or fp32_residual_addition")

    def forward(self, inputs):
        if self.add_cross_attention:
            hidden, cross, mask, cross_mask = inputs
        else:
            (hidden, mask), cross, cross_mask = inputs, None, None
        given = (hidden, cross, mask, cross_mask)
        if self.enters_layout:
            hidden, cross, mask, cross_mask = self._enter(hidden, cross, mask, cross_mask)
        out = self._run(hidden, mask, cross, cross_mask)
        if self.leaves_layout:
            out = self.layout.leave(out)
            if self.enters_layout:
                _, cross, mask, cross_mask = given  # what came in goes back out
            else:
                cross, mask, cross_mask = self._leave(out.shape[0], cross, mask, cross_mask)
        if self.add_cross_attention:
            return out, cross, mask, cross_mask
        return out, mask

    def _run(self, hidden, mask, cross, cross_mask):
        """The layer in the block's layout."""
        if self.parallel_attn_output:
            normed = self.attention.normalize(hidden)
            attended = self.attention.contribution(normed, mask)
            mlp_in = normed if self.single_pre_layernorm else self.output.normalize(hidden)
            return self.output.contribution(mlp_in) + attended + hidden
        out = self.attention.run(hidden, mask)
        if self.add_cross_attention:
            out = self.cross_attention.run(out, cross_mask, cross)
        return self.output.run(out)

    def _enter(self, hidden, cross, mask, cross_mask):
        layout, rows = self.layout, hidden.shape[0]
        return (layout.enter(hidden), layout.enter(cross) if cross is not None else None,
                layout.enter_mask(mask, rows), layout.enter_mask(cross_mask, rows))

    def _leave(self, rows, cross, mask, cross_mask):
        layout = self.layout
        return (layout.leave(cross) if cross is not None else None,
                layout.leave_mask(mask, rows), layout.leave_mask(cross_mask, rows))


class DistributedTransformer(DistributedModule):
    def __init__(self, num_layers: int = 12, num_attention_heads: int = 32,
                 attention_head_size: int = 32, hidden_size: int = 1024,
                 intermediate_size: int = 4096, attention_dropout_prob: float = 0.1,
                 hidden_dropout_prob: float = 0.1, activation: str = "gelu",
                 layernorm_epsilon: float = 1e-5, initializer_range: float = 0.02,
                 use_normal_initialization: bool = False, causal_mask_size: int | None = None,
                 add_cross_attention: bool = False, pre_layernorm: bool = False,
                 post_layernorm: bool = True, **extra) -> None:
        super().__init__()
        check_activation(activation)
        check_layernorms(pre_layernorm, post_layernorm, extra.get("single_pre_layernorm", False))
        self.num_layers = int(num_layers)
        layer_args = dict(
            num_attention_heads=num_attention_heads, attention_head_size=attention_head_size,
            hidden_size=hidden_size, intermediate_size=intermediate_size,
            attention_dropout_prob=attention_dropout_prob, hidden_dropout_prob=hidden_dropout_prob,
            activation=activation, layernorm_epsilon=layernorm_epsilon,
            initializer_range=initializer_range,
            use_normal_initialization=use_normal_initialization,
            causal_mask_size=causal_mask_size, add_cross_attention=add_cross_attention,
            pre_layernorm=pre_layernorm, post_layernorm=post_layernorm, **extra)
        self.seq_layers = torch.nn.Sequential(
            *(DistributedTransformerLayer(**layer_args) for _ in range(self.num_layers)))
        self.set_layout_boundaries(True)

    @classmethod
    def can_distribute(cls, *args, **kwargs) -> bool:
        names = ("num_layers", "num_attention_heads", "attention_head_size", "hidden_size",
                 "intermediate_size")
        given = dict(zip(names, args)) | kwargs
        given.pop("num_layers", None)
        return DistributedTransformerLayer.can_distribute(**given)

    def set_layout_boundaries(self, own: bool) -> None:
        """``own``: the stack takes and returns this rank's rows (its first layer enters the
        block layout, its last leaves it); else its caller does, and every layer works in
        the layout (``DistributedTransformerLMHead``)."""
        last = len(self.seq_layers) - 1
        for i, layer in enumerate(self.seq_layers):
            layer.enters_layout = own and i == 0
            layer.leaves_layout = own and i == last

    def forward(self, inputs):
        return self.seq_layers(inputs)

