"""Hugging Face BERT's encoder (``BertEncoder``) as ``smp.nn.DistributedTransformer``.

Names (HF -> SMP; ``i`` a layer; the prefix before ``layer.`` is kept, so a whole
``BertModel``'s or ``BertFor...``'s state dict translates too, its embeddings, pooler and
heads unchanged)::

    layer.i.attention.self.{query,key,value}.*   seq_layers.i.attention.{query,key,value}.*
    layer.i.attention.output.dense.*             seq_layers.i.attention.dense.*
    layer.i.attention.output.LayerNorm.*         seq_layers.i.attention.layernorm.*
    layer.i.intermediate.dense.*                 seq_layers.i.output.dense1.*
    layer.i.output.dense.*                       seq_layers.i.output.dense2.*
    layer.i.output.LayerNorm.*                   seq_layers.i.output.layernorm.*

RoBERTa's encoder has the same names (``roberta.py``).
"""

from __future__ import annotations

from shoal.modelparallel.errors import SMPConfigError, SMPUnsupportedError
from shoal.modelparallel.torch.nn.huggingface import common
from shoal.modelparallel.torch.nn.huggingface.common import drop, rule
from shoal.modelparallel.torch.nn.transformer import DistributedTransformer

_NAMES = {
    "attention.self.query": "attention.query", "attention.self.key": "attention.key",
    "attention.self.value": "attention.value", "attention.output.dense": "attention.dense",
    "attention.output.LayerNorm": "attention.layernorm", "intermediate.dense": "output.dense1",
    "output.dense": "output.dense2", "output.LayerNorm": "output.layernorm",
}
_TO_SMP = common.attention_rules("layer", _NAMES, "seq_layers")
_TO_HF = [rule(r"seq_layers\.(?P<i>\d+)\.attention\.causal_mask", drop),
          *common.attention_rules("seq_layers", {v: k for k, v in _NAMES.items()}, "layer")]


def translate_hf_state_dict_to_smdistributed_bert(state_dict: dict) -> dict:
    """A BERT state dict (encoder's or whole model's) under ``DistributedTransformer``'s names."""
    return common.apply(state_dict, _TO_SMP)


translate_hf_state_dict_to_smdistributed = translate_hf_state_dict_to_smdistributed_bert


def translate_state_dict_to_hf_bert(state_dict: dict, max_seq_len: int | None = None) -> dict:  # noqa: ARG001
    """A ``DistributedTransformer`` state dict under BERT's encoder names (``max_seq_len``:
    SMP's signature; BERT's encoder keeps no buffer of that size)."""
    return common.apply(state_dict, _TO_HF)


# -- the hooks (shared with RoBERTa) ----------------------------------------------------------


def init_hook(config, *args, **kwargs):  # noqa: ARG001 - HF's other constructor arguments
    if config.hidden_size % config.num_attention_heads != 0:
        raise SMPConfigError(f"Hidden size ({config.hidden_size}) must be divisible by the number "
                             f"of attention heads ({config.num_attention_heads}).")
    if getattr(config, "is_decoder", False) or getattr(config, "add_cross_attention", False):
        raise SMPUnsupportedError("a decoder (causal or cross-attending) BERT/RoBERTa encoder is "
                                  "not supported by the distributed encoder")
    return (), {
        "num_layers": config.num_hidden_layers,
        "num_attention_heads": config.num_attention_heads,
        "attention_head_size": config.hidden_size // config.num_attention_heads,
        "hidden_size": config.hidden_size, "intermediate_size": config.intermediate_size,
        "attention_dropout_prob": config.attention_probs_dropout_prob,
        "hidden_dropout_prob": config.hidden_dropout_prob, "activation": config.hidden_act,
        "layernorm_epsilon": config.layer_norm_eps, "initializer_range": config.initializer_range,
        "use_normal_initialization": True, "pre_layernorm": False, "post_layernorm": True,
    }


def forward_hook(hidden_states, attention_mask=None, head_mask=None, encoder_hidden_states=None,
                 encoder_attention_mask=None, past_key_values=None, use_cache=None,
                 output_attentions=None, output_hidden_states=None, return_dict=None,
                 cache=None, position_ids=None, **kwargs):  # noqa: ARG001 - unused by encoders
    common.refuse("encoder", head_mask=head_mask, encoder_hidden_states=encoder_hidden_states,
                  encoder_attention_mask=encoder_attention_mask, past_key_values=past_key_values,
                  cache=cache, use_cache=use_cache, output_attentions=output_attentions,
                  output_hidden_states=output_hidden_states)
    common.refuse_extra("encoder", {**kwargs, "return_dict": return_dict})
    return ((hidden_states, common.additive_mask(attention_mask, hidden_states)),), {}


def return_hook(outputs):
    from transformers.modeling_outputs import BaseModelOutputWithPastAndCrossAttentions

    return BaseModelOutputWithPastAndCrossAttentions(last_hidden_state=outputs[0])


def register() -> None:
    """``BertEncoder`` -> ``DistributedTransformer`` in the TP registry."""
    from shoal.modelparallel.torch.tensorparallel.registry import tp_register_with_module
    from transformers.models.bert.modeling_bert import BertEncoder

    tp_register_with_module(BertEncoder, DistributedTransformer, init_hook, forward_hook,
                            return_hook, translate=translate_hf_state_dict_to_smdistributed_bert,
                            translate_back=translate_state_dict_to_hf_bert)
