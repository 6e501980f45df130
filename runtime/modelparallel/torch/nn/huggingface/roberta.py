"""Hugging Face RoBERTa's encoder (``RobertaEncoder``) as ``smp.nn.DistributedTransformer``.

RoBERTa's encoder is BERT's under other class names: the same state-dict names (see
``bert.py``), hooks and translation.
"""

from __future__ import annotations

from shoal.modelparallel.torch.nn.huggingface import bert
from shoal.modelparallel.torch.nn.transformer import DistributedTransformer


def translate_hf_state_dict_to_smdistributed_roberta(state_dict: dict) -> dict:
    """A RoBERTa state dict (encoder's or whole model's) under ``DistributedTransformer``'s names."""
    return bert.translate_hf_state_dict_to_smdistributed_bert(state_dict)


translate_hf_state_dict_to_smdistributed = translate_hf_state_dict_to_smdistributed_roberta
init_hook, forward_hook, return_hook = bert.init_hook, bert.forward_hook, bert.return_hook


def translate_state_dict_to_hf_roberta(state_dict: dict, max_seq_len: int | None = None) -> dict:
    """A ``DistributedTransformer`` state dict under RoBERTa's encoder names."""
    return bert.translate_state_dict_to_hf_bert(state_dict, max_seq_len)


def register() -> None:
    """``RobertaEncoder`` -> ``DistributedTransformer`` in the TP registry."""
    from shoal.modelparallel.torch.tensorparallel.registry import tp_register_with_module
    from transformers.models.roberta.modeling_roberta import RobertaEncoder

    tp_register_with_module(RobertaEncoder, DistributedTransformer, init_hook, forward_hook,
                            return_hook,
                            translate=translate_hf_state_dict_to_smdistributed_roberta,
                            translate_back=translate_state_dict_to_hf_roberta)
