"""The constructor arguments the transformer modules share beyond their documented ones.

SMP's modules accept more keyword arguments than its documentation lists (scripts pass them
through ``smp.model_creation`` / ``smp.tensor_parallelism``). Three kinds here:

- implemented ones are ordinary parameters of the classes (``mask_value``,
  ``scale_attention_scores``, ``embedding_dropout_prob``, ``use_positional_embedding``,
  ``final_layernorm``, ``fp32_residual_addition``, ``tie_input_output_embedding``); those
  of a layer (``LAYER_OPTIONS``: rotary embeddings, a parallel attention/MLP residual, one
  shared pre-layernorm, bias-free attention) are passed on by the stacks that hold layers;
- ``NO_EFFECT``: accepted, nothing changes: they choose GPU kernels (fused softmax, fused
  bias-gelu, flash attention) or precision tricks whose result in float32 is the plain
  computation's;
- ``UNSUPPORTED``: they change what the layer computes and are not implemented: accepted at
  their default value, refused otherwise (never silently ignored).
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from shoal.modelparallel.errors import SMPConfigError, SMPUnsupportedError

NO_EFFECT: Mapping[str, str] = MappingProxyType({
    "fused_softmax": "a fused GPU kernel for masking and softmax; the same values",
    "fused_bias_gelu": "a fused GPU kernel for bias and gelu; the same values",
    "fused_dropout": "a fused GPU kernel for dropout",
    "flash_attention": "a GPU attention kernel; attention is computed exactly here",
    "triton_flash_attention": "a GPU attention kernel; attention is computed exactly here",
    "attention_in_fp32": "attention already runs in the activations' float32 here",
    "query_key_layer_scaling": "a float16 overflow guard; float32 scores are the same",
    "alibi_bias_max": "only read when use_alibi is True, which is refused",
    "zero_init": "sharded data parallelism's initialisation, which is refused",
})

# name -> the default (the only value accepted).
UNSUPPORTED: Mapping[str, Any] = MappingProxyType({
    "use_alibi": False,
    "scale_attn_by_layer_idx": False,
    "distribute_embedding": False,
})

# Implemented by DistributedTransformerLayer (and its attention); the stacks pass them on.
LAYER_OPTIONS = frozenset({"rotary_dim", "rotary_pct", "rotary_emb_base", "attention_bias",
                           "parallel_attn_output", "single_pre_layernorm",
                           "fused_qkv_per_head"})
ACTIVATIONS = ("gelu", "relu", "gelu_new")
LAYERNORM_MESSAGE = ("At least one of pre_layernorm, single_pre_layernorm and post_layernorm "
                     "must be True.")
ACTIVATION_MESSAGE = ("Only relu and gelu activations are supported by DistributedTransformerOutput "
                      "layer.")
FP32_RESIDUAL_MESSAGE = "fp32 residual addition only supports optimize == speed."


def check_extra(owner: str, extra: Mapping[str, Any], passes_on: bool = False) -> dict[str, Any]:
    """The keyword arguments beyond ``owner``'s own that it passes on to its parts; refuses
    unknown names and unsupported values (``passes_on``: the layers' own options too, which
    the layers check)."""
    for name, value in extra.items():
        if name in NO_EFFECT or (passes_on and name in LAYER_OPTIONS):
            continue
        if name in UNSUPPORTED:
            if value != UNSUPPORTED[name]:
                raise SMPUnsupportedError(
                    f"{owner}: {name}={value!r} is not supported (it changes what the layer "
                    f"computes); only {name}={UNSUPPORTED[name]!r} is.")
            continue
        raise TypeError(f"{owner}.__init__() got an unexpected keyword argument '{name}'")
    return dict(extra)


def check_layernorms(pre_layernorm: bool, post_layernorm: bool,
                     single_pre_layernorm: bool = False) -> None:
    if not (pre_layernorm or post_layernorm or single_pre_layernorm):
        raise SMPConfigError(LAYERNORM_MESSAGE)


def check_activation(activation: str) -> None:
    # gelu_new: the tanh approximation of gelu (GPT-2's, GPT-J's).
    if activation not in ACTIVATIONS:
        raise SMPConfigError(ACTIVATION_MESSAGE)


def check_causal_mask(causal_mask_size: int | None, num_positions: int) -> None:
    if causal_mask_size is not None and causal_mask_size < num_positions:
        raise SMPConfigError(
            f"If causal mask size ({causal_mask_size}) is provided, it must be larger than or "
            f"equal to the number of positions ({num_positions}).")
