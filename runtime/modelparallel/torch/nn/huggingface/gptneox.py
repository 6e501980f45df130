"""Hugging Face GPT-NeoX (``GPTNeoXForCausalLM``) as ``smp.nn.DistributedTransformerLMHead``.

Names (HF -> SMP; ``i`` a layer)::

    gpt_neox.embed_in.weight                       word_embedding.weight
    gpt_neox.layers.i.input_layernorm.*            transformer.seq_layers.i.attention.pre_layernorm.*
    gpt_neox.layers.i.attention.query_key_value.*  transformer.seq_layers.i.attention.query_key_value.*
    gpt_neox.layers.i.attention.dense.*            transformer.seq_layers.i.attention.dense.*
    gpt_neox.layers.i.post_attention_layernorm.*   transformer.seq_layers.i.output.pre_layernorm.*
    gpt_neox.layers.i.mlp.dense_h_to_4h.*          transformer.seq_layers.i.output.dense1.*
    gpt_neox.layers.i.mlp.dense_4h_to_h.*          transformer.seq_layers.i.output.dense2.*
    gpt_neox.final_layer_norm.*                    layernorm.*
    lm_head.weight (embed_out.weight before v5)    lm_head.weight

The fused ``query_key_value`` keeps HF's layout (outputs grouped by head: ``[q, k, v]`` per
head), which the distributed attention takes as it is (``fused_qkv_per_head``); rotary
embeddings (``rotary_pct`` of each head, halves paired) and the parallel residual
(``use_parallel_residual``) are the distributed layer's options.
"""

from __future__ import annotations

from shoal.modelparallel.errors import SMPUnsupportedError
from shoal.modelparallel.torch.nn.huggingface import common
from shoal.modelparallel.torch.nn.huggingface.common import drop, rename, rule
from shoal.modelparallel.torch.nn.lmhead import DistributedTransformerLMHead

_LAYER = "transformer.seq_layers"
_NAMES = {
    "input_layernorm": "attention.pre_layernorm",
    "attention.query_key_value": "attention.query_key_value",
    "attention.dense": "attention.dense",
    "post_attention_layernorm": "output.pre_layernorm",
    "mlp.dense_h_to_4h": "output.dense1", "mlp.dense_4h_to_h": "output.dense2",
}
_TO_SMP = [
    rule(r"gpt_neox\.embed_in\.weight", rename("{p}word_embedding.weight")),
    rule(r"gpt_neox\.final_layer_norm\.(?P<w>weight|bias)", rename("{p}layernorm.{w}")),
    rule(r"(?:embed_out|lm_head)\.weight", rename("{p}lm_head.weight")),
    # Buffers of older HF versions (masks, rotary frequencies): recomputed.
    rule(r"gpt_neox\.layers\.\d+\.attention\.(?:bias|masked_bias|rotary_emb\.inv_freq)", drop),
    rule(r"gpt_neox\.rotary_emb\.inv_freq", drop),
    *common.attention_rules("gpt_neox.layers", _NAMES, _LAYER),
]


def _head_name() -> str:
    """HF v5 calls the output projection ``lm_head``, earlier versions ``embed_out``."""
    try:
        import transformers
    except ImportError:
        return "lm_head"
    return "embed_out" if int(transformers.__version__.split(".")[0]) < 5 else "lm_head"


def _to_hf_rules() -> list:
    return [
        rule(rf"{_LAYER}\.\d+\.attention\.causal_mask", drop),
        *common.attention_rules(_LAYER, {v: k for k, v in _NAMES.items()}, "gpt_neox.layers"),
        rule(r"word_embedding\.weight", rename("{p}gpt_neox.embed_in.weight")),
        rule(r"layernorm\.(?P<w>weight|bias)", rename("{p}gpt_neox.final_layer_norm.{w}")),
        rule(r"lm_head\.weight", rename("{p}" + _head_name() + ".weight")),
    ]


def translate_hf_state_dict_to_smdistributed_gptneox(state_dict: dict) -> dict:
    """A ``GPTNeoXForCausalLM`` state dict under ``DistributedTransformerLMHead``'s names."""
    return common.apply(state_dict, _TO_SMP)


def translate_state_dict_to_hf_gptneox(state_dict: dict, max_seq_len: int | None = None) -> dict:  # noqa: ARG001
    """A ``DistributedTransformerLMHead`` state dict under ``GPTNeoXForCausalLM``'s names
    (``max_seq_len``: SMP's signature; no buffer of that size is written)."""
    return common.apply(state_dict, _to_hf_rules())


# -- the hooks ---------------------------------------------------------------------------


def _rotary(config) -> tuple[float, float]:
    rope = getattr(config, "rope_parameters", None) or {}
    if rope.get("rope_type", "default") != "default":
        raise SMPUnsupportedError(f"rope_type {rope['rope_type']!r} is not supported by the "
                                  "distributed GPT-NeoX (only the default rotary embedding)")
    pct = rope.get("partial_rotary_factor", getattr(config, "rotary_pct", 0.25))
    base = rope.get("rope_theta", getattr(config, "rotary_emb_base", 10000))
    return float(pct), float(base)


def init_hook(config, *args, **kwargs):  # noqa: ARG001 - HF's other constructor arguments
    heads = config.num_attention_heads
    pct, base = _rotary(config)
    return (), {
        "num_layers": config.num_hidden_layers, "num_attention_heads": heads,
        "attention_head_size": config.hidden_size // heads, "hidden_size": config.hidden_size,
        "intermediate_size": config.intermediate_size, "vocab_size": config.vocab_size,
        "num_positions": config.max_position_embeddings,
        "attention_dropout_prob": getattr(config, "attention_dropout", 0.0),
        "hidden_dropout_prob": getattr(config, "hidden_dropout", 0.0),
        "embedding_dropout_prob": getattr(config, "hidden_dropout", 0.0),
        "activation": config.hidden_act, "layernorm_epsilon": config.layer_norm_eps,
        "causal_mask_size": config.max_position_embeddings,
        "initializer_range": config.initializer_range, "use_normal_initialization": True,
        "pre_layernorm": True, "post_layernorm": False, "use_positional_embedding": False,
        "rotary_pct": pct, "rotary_emb_base": base, "fused_qkv_per_head": True,
        "parallel_attn_output": bool(config.use_parallel_residual),
        "attention_bias": bool(getattr(config, "attention_bias", True)),
        "tie_input_output_embedding": bool(getattr(config, "tie_word_embeddings", False)),
    }


def forward_hook(input_ids=None, attention_mask=None, position_ids=None, inputs_embeds=None,
                 head_mask=None, past_key_values=None, labels=None, use_cache=None,
                 output_attentions=None, output_hidden_states=None, return_dict=None,
                 cache=None, token_type_ids=None, logits_to_keep=0, **kwargs):
    common.refuse("GPT-NeoX", inputs_embeds=inputs_embeds, head_mask=head_mask,
                  past_key_values=past_key_values, cache=cache, use_cache=use_cache,
                  output_attentions=output_attentions,
                  output_hidden_states=output_hidden_states, token_type_ids=token_type_ids,
                  logits_to_keep=logits_to_keep)
    common.refuse_extra("GPT-NeoX", {**kwargs, "return_dict": return_dict})
    inputs = (input_ids, common.smp_padding_mask(attention_mask, input_ids), None, position_ids, labels)
    return (inputs,), {}


return_hook = common.causal_lm_output


def register() -> None:
    """``GPTNeoXForCausalLM`` -> ``DistributedTransformerLMHead`` in the TP registry."""
    from shoal.modelparallel.torch.tensorparallel.registry import tp_register_with_module
    from transformers.models.gpt_neox.modeling_gpt_neox import GPTNeoXForCausalLM

    tp_register_with_module(GPTNeoXForCausalLM, DistributedTransformerLMHead, init_hook,
                            forward_hook, return_hook,
                            translate=translate_hf_state_dict_to_smdistributed_gptneox,
                            translate_back=translate_state_dict_to_hf_gptneox)
