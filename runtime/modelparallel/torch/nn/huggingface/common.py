"""What the Hugging Face translations share: renaming state dicts by rules, the forward
arguments the distributed modules cannot honour, and attention masks in SMP's convention.

A rule is a regular expression over a state-dict key (anything before the matched part is
kept as the key's prefix, so a model's whole state dict and a submodule's translate alike)
and a function of the match, the tensor and the whole state dict (parts of one tensor may
come from several entries), returning the new entries ({} drops the key). Keys no rule
matches pass unchanged.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping

import torch
from shoal.modelparallel.errors import SMPUnsupportedError

Handler = Callable[[re.Match, torch.Tensor, Mapping[str, torch.Tensor]], dict]
Rule = tuple[re.Pattern, Handler]


def rule(pattern: str, handler: Handler) -> Rule:
    return re.compile(r"^(?P<p>(?:.*\.)?)" + pattern + "$"), handler


def rename(template: str) -> Handler:
    """The tensor under ``template`` formatted with the match's groups."""
    return lambda m, t, _sd: {template.format(**m.groupdict()): t}


def transposed(template: str) -> Handler:
    """A ``Conv1D`` weight (``[in, out]``) as a linear one (``[out, in]``), or back."""
    return lambda m, t, _sd: {template.format(**m.groupdict()): t.t().contiguous()}


def drop(_m, _t, _sd) -> dict:
    return {}


def apply(state_dict: Mapping[str, torch.Tensor], rules: list[Rule]) -> dict:
    out: dict = {}
    for key, value in state_dict.items():
        for pattern, handler in rules:
            match = pattern.match(key)
            if match is not None:
                out.update(handler(match, value, state_dict))
                break
        else:
            out[key] = value
    return out


def attention_rules(layer: str, hf: Mapping[str, str], smp_layer: str) -> list[Rule]:
    """Plain renames of one layer's entries: ``hf`` maps the HF name inside a layer to the
    SMP one (both without ``weight``/``bias``)."""
    rules = []
    for hf_name, smp_name in hf.items():
        rules.append(rule(rf"{layer}\.(?P<i>\d+)\.{re.escape(hf_name)}\.(?P<w>weight|bias)",
                          rename(f"{{p}}{smp_layer}.{{i}}.{smp_name}.{{w}}")))
    return rules


# -- forward arguments ------------------------------------------------------------------


def refuse(model: str, **given) -> None:
    """Refuses forward arguments the distributed module cannot honour (given, truthy)."""
    for name, value in given.items():
        if _given(value):
            raise SMPUnsupportedError(
                f"{name} is not supported by the distributed {model} "
                "(smp.nn.DistributedTransformerLMHead / DistributedTransformer)")


def _given(value) -> bool:
    if value is None or value is False:
        return False
    if isinstance(value, int) and not isinstance(value, bool):
        return value != 0  # logits_to_keep's default
    return True


def refuse_extra(model: str, kwargs: Mapping) -> None:
    """HF's forward passes ``**kwargs`` on to attention functions and losses; those set to
    something the distributed module would ignore are refused."""
    ignored = {"return_dict", "cache_position", "num_items_in_batch"}
    for name, value in kwargs.items():
        if name == "return_dict":
            if value is False:
                raise SMPUnsupportedError(
                    f"return_dict=False is not supported by the distributed {model}: "
                    "it returns a ModelOutput")
            continue
        if name not in ignored:
            refuse(model, **{name: value})


def smp_padding_mask(attention_mask: torch.Tensor | None, input_ids: torch.Tensor) -> torch.Tensor:
    """HF's ``[N, S]`` mask (1 = attend) -> SMP's (1 = masked). Never None: the TP peers
    gather their masks, so each must bring one (a rank without padding too)."""
    if attention_mask is None:
        return torch.zeros(input_ids.shape, dtype=torch.long, device=input_ids.device)
    if attention_mask.dim() != 2:
        raise SMPUnsupportedError("only [batch, sequence] attention masks are supported by the "
                                  "distributed language model")
    return (attention_mask == 0).to(torch.long)


def additive_mask(mask: torch.Tensor | None, hidden_states: torch.Tensor,
                  mask_value: float = -1e4) -> torch.Tensor:
    """An encoder's mask as the distributed layers take it: ``[N, 1, S, S]``, added to the
    scores. HF's models hand their encoders a 4-D float mask (already additive), a boolean
    one (True = attend), or None where nothing is padded; one shape whatever came, because
    the TP peers gather their masks (a rank without padding brings zeros)."""
    n, s = hidden_states.shape[0], hidden_states.shape[1]
    dtype = hidden_states.dtype
    if mask is None:
        return torch.zeros(n, 1, s, s, dtype=dtype, device=hidden_states.device)
    if mask.dim() == 2:  # an integer 0/1 mask (1 = attend) of [N, S]
        mask = mask[:, None, None, :].to(torch.bool)
    if mask.dtype == torch.bool:
        mask = torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(
            ~mask, mask_value)
    return mask.to(dtype).expand(n, 1, s, s).contiguous()


def causal_lm_output(outputs):
    """The LM head's ``(loss, logits)`` or logits as Hugging Face's causal-LM output."""
    from transformers.modeling_outputs import CausalLMOutputWithPast

    loss, logits = outputs if isinstance(outputs, tuple) else (None, outputs)
    return CausalLMOutputWithPast(loss=loss, logits=logits)
