"""Hugging Face GPT-J (``GPTJForCausalLM``) as ``smp.nn.DistributedTransformerLMHead``.

Names (HF -> SMP; ``i`` a layer)::

    transformer.wte.weight                 word_embedding.weight
    transformer.h.i.ln_1.*                 transformer.seq_layers.i.attention.pre_layernorm.*
    transformer.h.i.attn.{q,k,v}_proj.weight
                                           transformer.seq_layers.i.attention.{query,key,value}.weight
    transformer.h.i.attn.out_proj.weight   transformer.seq_layers.i.attention.dense.weight
    transformer.h.i.mlp.fc_in.*            transformer.seq_layers.i.output.dense1.*
    transformer.h.i.mlp.fc_out.*           transformer.seq_layers.i.output.dense2.*
    transformer.ln_f.*                     layernorm.*
    lm_head.{weight,bias}                  lm_head.{weight,bias}

GPT-J's layer is one shared pre-layernorm feeding attention and MLP side by side
(``single_pre_layernorm``, ``parallel_attn_output``), bias-free attention projections
(``attention_bias=False``), rotary embeddings on ``rotary_dim`` channels of each head in
interleaved pairs, and an untied output layer with a bias.
"""

from __future__ import annotations

from shoal.modelparallel.errors import SMPUnsupportedError
from shoal.modelparallel.torch.nn.huggingface import common
from shoal.modelparallel.torch.nn.huggingface.common import drop, rename, rule
from shoal.modelparallel.torch.nn.lmhead import DistributedTransformerLMHead

_LAYER = "transformer.seq_layers"
_NAMES = {
    "ln_1": "attention.pre_layernorm", "attn.q_proj": "attention.query",
    "attn.k_proj": "attention.key", "attn.v_proj": "attention.value",
    "attn.out_proj": "attention.dense", "mlp.fc_in": "output.dense1",
    "mlp.fc_out": "output.dense2",
}
_TO_SMP = [
    rule(r"transformer\.wte\.weight", rename("{p}word_embedding.weight")),
    rule(r"transformer\.ln_f\.(?P<w>weight|bias)", rename("{p}layernorm.{w}")),
    # Buffers of older HF versions (masks, rotary tables): recomputed.
    rule(r"transformer\.h\.\d+\.attn\.(?:bias|masked_bias|embed_positions)", drop),
    *common.attention_rules("transformer.h", _NAMES, _LAYER),
]
_TO_HF = [
    rule(rf"{_LAYER}\.\d+\.attention\.causal_mask", drop),
    *common.attention_rules(_LAYER, {v: k for k, v in _NAMES.items()}, "transformer.h"),
    rule(r"word_embedding\.weight", rename("{p}transformer.wte.weight")),
    rule(r"layernorm\.(?P<w>weight|bias)", rename("{p}transformer.ln_f.{w}")),
]


def translate_hf_gptj_state_dict_to_smdistributed_gptj(state_dict: dict) -> dict:
    """A ``GPTJForCausalLM`` state dict under ``DistributedTransformerLMHead``'s names."""
    return common.apply(state_dict, _TO_SMP)


translate_hf_state_dict_to_smdistributed_gptj = translate_hf_gptj_state_dict_to_smdistributed_gptj


def translate_state_dict_to_hf_gptj(state_dict: dict, max_seq_len: int | None = None) -> dict:  # noqa: ARG001
    """A ``DistributedTransformerLMHead`` state dict under ``GPTJForCausalLM``'s names
    (``max_seq_len``: SMP's signature; no buffer of that size is written)."""
    return common.apply(state_dict, _TO_HF)


# -- the hooks ---------------------------------------------------------------------------


def init_hook(config, *args, **kwargs):  # noqa: ARG001 - HF's other constructor arguments
    if getattr(config, "tie_word_embeddings", False):
        raise SMPUnsupportedError("GPT-J with tied word embeddings is not supported by the "
                                  "distributed GPT-J (its output layer has a bias)")
    head_size = config.n_embd // config.n_head
    return (), {
        "num_layers": config.n_layer, "num_attention_heads": config.n_head,
        "attention_head_size": head_size, "hidden_size": config.n_embd,
        "intermediate_size": config.n_inner or 4 * config.n_embd,
        "vocab_size": config.vocab_size, "num_positions": config.n_positions,
        "attention_dropout_prob": config.attn_pdrop, "hidden_dropout_prob": config.resid_pdrop,
        "embedding_dropout_prob": config.embd_pdrop, "activation": config.activation_function,
        "layernorm_epsilon": config.layer_norm_epsilon, "causal_mask_size": config.n_positions,
        "initializer_range": config.initializer_range, "use_normal_initialization": True,
        "pre_layernorm": True, "post_layernorm": False, "use_positional_embedding": False,
        "rotary_dim": config.rotary_dim or head_size, "parallel_attn_output": True,
        "single_pre_layernorm": True, "attention_bias": False,
        "tie_input_output_embedding": False, "lm_head_bias": True,
    }


def forward_hook(input_ids=None, past_key_values=None, attention_mask=None, token_type_ids=None,
                 position_ids=None, head_mask=None, inputs_embeds=None, labels=None,
                 use_cache=None, output_attentions=None, output_hidden_states=None,
                 return_dict=None, cache=None, logits_to_keep=0, **kwargs):
    common.refuse("GPT-J", past_key_values=past_key_values, cache=cache,
                  token_type_ids=token_type_ids, head_mask=head_mask,
                  inputs_embeds=inputs_embeds, use_cache=use_cache,
                  output_attentions=output_attentions,
                  output_hidden_states=output_hidden_states, logits_to_keep=logits_to_keep)
    common.refuse_extra("GPT-J", {**kwargs, "return_dict": return_dict})
    inputs = (input_ids, common.smp_padding_mask(attention_mask, input_ids), None, position_ids, labels)
    return (inputs,), {}


return_hook = common.causal_lm_output


def register() -> None:
    """``GPTJForCausalLM`` -> ``DistributedTransformerLMHead`` in the TP registry."""
    from shoal.modelparallel.torch.tensorparallel.registry import tp_register_with_module
    from transformers.models.gptj.modeling_gptj import GPTJForCausalLM

    tp_register_with_module(GPTJForCausalLM, DistributedTransformerLMHead, init_hook,
                            forward_hook, return_hook,
                            translate=translate_hf_gptj_state_dict_to_smdistributed_gptj,
                            translate_back=translate_state_dict_to_hf_gptj)
