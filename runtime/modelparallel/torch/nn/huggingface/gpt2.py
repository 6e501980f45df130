"""Hugging Face GPT-2 (``GPT2LMHeadModel``) as ``smp.nn.DistributedTransformerLMHead``.

Names (HF -> SMP; ``i`` a layer; HF's ``Conv1D`` weights are ``[in, out]``, transposed to
linear ones; ``c_attn`` holds query, key and value side by side on its output axis)::

    transformer.wte.weight              word_embedding.weight   (lm_head.weight: tied to it)
    transformer.wpe.weight              position_embedding.weight
    transformer.h.i.ln_1.*              transformer.seq_layers.i.attention.pre_layernorm.*
    transformer.h.i.attn.c_attn.*       transformer.seq_layers.i.attention.{query,key,value}.*
    transformer.h.i.attn.c_proj.*       transformer.seq_layers.i.attention.dense.*
    transformer.h.i.ln_2.*              transformer.seq_layers.i.output.pre_layernorm.*
    transformer.h.i.mlp.c_fc.*          transformer.seq_layers.i.output.dense1.*
    transformer.h.i.mlp.c_proj.*        transformer.seq_layers.i.output.dense2.*
    transformer.ln_f.*                  layernorm.*

The translators take and return full state dicts (``DistributedModel.state_dict()``'s, split
tensors gathered); entries of neither naming pass unchanged.
"""

from __future__ import annotations

import torch
from shoal.modelparallel.errors import SMPConfigError, SMPUnsupportedError
from shoal.modelparallel.torch.nn.huggingface import common
from shoal.modelparallel.torch.nn.huggingface.common import drop, rename, rule, transposed
from shoal.modelparallel.torch.nn.lmhead import DistributedTransformerLMHead

_LAYER = "transformer.seq_layers"
_QKV = ("query", "key", "value")


def _split_c_attn(m, t, _sd) -> dict:
    p, i, w = m["p"], m["i"], m["w"]
    parts = t.chunk(3, dim=-1)  # weight [H, 3H] / bias [3H]: q, k, v on the last axis
    return {f"{p}{_LAYER}.{i}.attention.{name}.{w}": part.t().contiguous() if w == "weight"
            else part.contiguous() for name, part in zip(_QKV, parts)}


_TO_SMP = [
    rule(r"transformer\.wte\.weight", rename("{p}word_embedding.weight")),
    rule(r"transformer\.wpe\.weight", rename("{p}position_embedding.weight")),
    rule(r"transformer\.ln_f\.(?P<w>weight|bias)", rename("{p}layernorm.{w}")),
    rule(r"lm_head\.weight", drop),  # tied to the word embedding
    rule(r"transformer\.h\.(?P<i>\d+)\.attn\.(?:bias|masked_bias)", drop),  # old HF buffers
    rule(r"transformer\.h\.(?P<i>\d+)\.attn\.c_attn\.(?P<w>weight|bias)", _split_c_attn),
    rule(r"transformer\.h\.(?P<i>\d+)\.attn\.c_proj\.weight",
         transposed(f"{{p}}{_LAYER}.{{i}}.attention.dense.weight")),
    rule(r"transformer\.h\.(?P<i>\d+)\.mlp\.c_fc\.weight",
         transposed(f"{{p}}{_LAYER}.{{i}}.output.dense1.weight")),
    rule(r"transformer\.h\.(?P<i>\d+)\.mlp\.c_proj\.weight",
         transposed(f"{{p}}{_LAYER}.{{i}}.output.dense2.weight")),
    *common.attention_rules("transformer.h", {
        "ln_1": "attention.pre_layernorm", "attn.c_proj": "attention.dense",
        "ln_2": "output.pre_layernorm", "mlp.c_fc": "output.dense1",
        "mlp.c_proj": "output.dense2"}, _LAYER),
]


def _join_qkv(m, _t, sd) -> dict:
    p, i, w = m["p"], m["i"], m["w"]
    parts = [sd[f"{p}{_LAYER}.{i}.attention.{name}.{w}"] for name in _QKV]
    if w == "weight":
        parts = [part.t() for part in parts]
    return {f"{p}transformer.h.{i}.attn.c_attn.{w}": torch.cat(parts, dim=-1).contiguous()}


def _word_embedding(m, t, _sd) -> dict:
    return {f"{m['p']}transformer.wte.weight": t, f"{m['p']}lm_head.weight": t}


_TO_HF = [
    rule(rf"{_LAYER}\.(?P<i>\d+)\.attention\.query\.(?P<w>weight|bias)", _join_qkv),
    rule(rf"{_LAYER}\.(?P<i>\d+)\.attention\.(?:key|value)\.(?P<w>weight|bias)", drop),
    rule(rf"{_LAYER}\.(?P<i>\d+)\.attention\.causal_mask", drop),
    rule(rf"{_LAYER}\.(?P<i>\d+)\.attention\.dense\.weight",
         transposed("{p}transformer.h.{i}.attn.c_proj.weight")),
    rule(rf"{_LAYER}\.(?P<i>\d+)\.output\.dense1\.weight",
         transposed("{p}transformer.h.{i}.mlp.c_fc.weight")),
    rule(rf"{_LAYER}\.(?P<i>\d+)\.output\.dense2\.weight",
         transposed("{p}transformer.h.{i}.mlp.c_proj.weight")),
    *common.attention_rules(_LAYER, {
        "attention.pre_layernorm": "ln_1", "attention.dense": "attn.c_proj",
        "output.pre_layernorm": "ln_2", "output.dense1": "mlp.c_fc",
        "output.dense2": "mlp.c_proj"}, "transformer.h"),
    rule(r"word_embedding\.weight", _word_embedding),
    rule(r"position_embedding\.weight", rename("{p}transformer.wpe.weight")),
    rule(r"layernorm\.(?P<w>weight|bias)", rename("{p}transformer.ln_f.{w}")),
]


def translate_hf_state_dict_to_smdistributed_gpt2(state_dict: dict) -> dict:
    """A ``GPT2LMHeadModel`` state dict under ``DistributedTransformerLMHead``'s names."""
    return common.apply(state_dict, _TO_SMP)


def translate_state_dict_to_hf_gpt2(state_dict: dict, max_seq_len: int | None = None) -> dict:
    """A ``DistributedTransformerLMHead`` state dict under ``GPT2LMHeadModel``'s names;
    with ``max_seq_len``, each attention's causal-mask buffer ``attn.bias`` of the HF
    versions that keep one in the state dict (``[1, 1, max_seq_len, max_seq_len]``)."""
    out = common.apply(state_dict, _TO_HF)
    if max_seq_len is not None:
        causal = torch.tril(torch.ones(max_seq_len, max_seq_len, dtype=torch.bool))
        for key in [k for k in out if k.endswith(".attn.c_attn.weight")]:
            out[key[: -len("c_attn.weight")] + "bias"] = causal.view(1, 1, max_seq_len,
                                                                     max_seq_len)
    return out


# -- the hooks ---------------------------------------------------------------------------


def init_hook(config, *args, **kwargs):  # noqa: ARG001 - HF's other constructor arguments
    if config.n_embd % config.n_head != 0:
        raise SMPConfigError(f"Embedding size ({config.n_embd}) must be divisible by the number "
                             f"of attention heads ({config.n_head}).")
    if config.activation_function not in ("gelu_new", "relu"):
        raise SMPConfigError("Only 'gelu_new' and 'relu' activations are supported.")
    if getattr(config, "add_cross_attention", False):
        raise SMPUnsupportedError("GPT-2 with cross-attention is not supported by the "
                                  "distributed GPT-2")
    if getattr(config, "scale_attn_by_inverse_layer_idx", False):
        raise SMPUnsupportedError("scale_attn_by_inverse_layer_idx is not supported by the "
                                  "distributed GPT-2")
    return (), {
        "num_layers": config.n_layer, "num_attention_heads": config.n_head,
        "attention_head_size": config.n_embd // config.n_head, "hidden_size": config.n_embd,
        "intermediate_size": config.n_inner or 4 * config.n_embd,
        "vocab_size": config.vocab_size, "num_positions": config.n_positions,
        "attention_dropout_prob": config.attn_pdrop, "hidden_dropout_prob": config.resid_pdrop,
        "embedding_dropout_prob": config.embd_pdrop, "activation": config.activation_function,
        "layernorm_epsilon": config.layer_norm_epsilon, "num_token_types": 0,
        "causal_mask_size": config.n_positions, "add_lm_head": True,
        "initializer_range": config.initializer_range, "use_normal_initialization": True,
        "pre_layernorm": True, "post_layernorm": False,
        "scale_attention_scores": bool(getattr(config, "scale_attn_weights", True)),
    }


def forward_hook(input_ids=None, past_key_values=None, attention_mask=None, token_type_ids=None,
                 position_ids=None, head_mask=None, inputs_embeds=None,
                 encoder_hidden_states=None, encoder_attention_mask=None, labels=None,
                 use_cache=None, output_attentions=None, output_hidden_states=None,
                 return_dict=None, cache=None, logits_to_keep=0, **kwargs):
    common.refuse("GPT-2", past_key_values=past_key_values, cache=cache, head_mask=head_mask,
                  inputs_embeds=inputs_embeds, use_cache=use_cache,
                  output_attentions=output_attentions,
                  output_hidden_states=output_hidden_states, token_type_ids=token_type_ids,
                  encoder_hidden_states=encoder_hidden_states,
                  encoder_attention_mask=encoder_attention_mask, logits_to_keep=logits_to_keep)
    common.refuse_extra("GPT-2", {**kwargs, "return_dict": return_dict})
    inputs = (input_ids, common.smp_padding_mask(attention_mask, input_ids), None, position_ids, labels)
    return (inputs,), {}


def return_hook(outputs):
    from transformers.modeling_outputs import CausalLMOutputWithCrossAttentions

    loss, logits = outputs if isinstance(outputs, tuple) else (None, outputs)
    return CausalLMOutputWithCrossAttentions(loss=loss, logits=logits)


def register() -> None:
    """``GPT2LMHeadModel`` -> ``DistributedTransformerLMHead`` in the TP registry."""
    from shoal.modelparallel.torch.tensorparallel.registry import tp_register_with_module
    from transformers.models.gpt2.modeling_gpt2 import GPT2LMHeadModel

    tp_register_with_module(GPT2LMHeadModel, DistributedTransformerLMHead, init_hook,
                            forward_hook, return_hook,
                            translate=translate_hf_state_dict_to_smdistributed_gpt2,
                            translate_back=translate_state_dict_to_hf_gpt2)
