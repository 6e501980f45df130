"""``smp.nn.huggingface`` in one process (tp 1): each Hugging Face family and its distributed
module, weights translated, give the same outputs, loss and gradients; state dicts
round-trip; the GPT-2 hook's rules and refused arguments; registration when ``transformers``
is imported, and none (without failing) when it is absent."""

from __future__ import annotations

import copy
import os
import subprocess
import sys

import pytest

pytest.importorskip("transformers", reason="the Hugging Face translations need transformers")
import torch  # noqa: E402
import transformers  # noqa: E402
from shoal.modelparallel.errors import SMPConfigError, SMPUnsupportedError  # noqa: E402
from shoal.modelparallel.torch import nn as smp_nn  # noqa: E402
from shoal.modelparallel.torch.nn.huggingface import (  # noqa: E402
    bert,
    gpt2,
    gptj,
    gptneox,
    roberta,
)
from shoal.modelparallel.torch.tensorparallel.registry import registration  # noqa: E402

VOCAB, SEQ, BATCH = 64, 10, 3
ATOL = 1e-5


def causal_configs():
    return {
        "gpt2": (transformers.GPT2Config(
            vocab_size=VOCAB, n_positions=32, n_embd=32, n_layer=2, n_head=4, resid_pdrop=0.0,
            embd_pdrop=0.0, attn_pdrop=0.0), transformers.GPT2LMHeadModel, gpt2),
        "gptj": (transformers.GPTJConfig(
            vocab_size=VOCAB, n_positions=32, n_embd=32, n_layer=2, n_head=4, rotary_dim=4,
            resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0), transformers.GPTJForCausalLM, gptj),
        "gptneox": (transformers.GPTNeoXConfig(
            vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
            intermediate_size=64, max_position_embeddings=32, rotary_pct=0.5,
            hidden_dropout=0.0, attention_dropout=0.0), transformers.GPTNeoXForCausalLM, gptneox),
        "gptneox-sequential": (transformers.GPTNeoXConfig(
            vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
            intermediate_size=64, max_position_embeddings=32, rotary_pct=1.0,
            use_parallel_residual=False, hidden_dropout=0.0, attention_dropout=0.0),
            transformers.GPTNeoXForCausalLM, gptneox),
    }


TO_SMP = {gpt2: gpt2.translate_hf_state_dict_to_smdistributed_gpt2,
          gptj: gptj.translate_hf_gptj_state_dict_to_smdistributed_gptj,
          gptneox: gptneox.translate_hf_state_dict_to_smdistributed_gptneox,
          bert: bert.translate_hf_state_dict_to_smdistributed_bert,
          roberta: roberta.translate_hf_state_dict_to_smdistributed_roberta}
TO_HF = {gpt2: gpt2.translate_state_dict_to_hf_gpt2, gptj: gptj.translate_state_dict_to_hf_gptj,
         gptneox: gptneox.translate_state_dict_to_hf_gptneox,
         bert: bert.translate_state_dict_to_hf_bert,
         roberta: roberta.translate_state_dict_to_hf_roberta}


def batch(seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, VOCAB, (BATCH, SEQ), generator=g)
    mask = torch.ones(BATCH, SEQ, dtype=torch.long)
    mask[1, -3:] = 0  # a padded row
    labels = ids.masked_fill(mask == 0, -100)
    return ids, mask, labels


def build_pair(name):
    config, cls, family = causal_configs()[name]
    config._attn_implementation = "eager"
    torch.manual_seed(1)
    hf = cls(config).eval()
    _, kwargs = family.init_hook(config)
    dist = smp_nn.DistributedTransformerLMHead(**kwargs).eval()
    dist.load_state_dict(TO_SMP[family](hf.state_dict()), strict=True)
    return hf, dist, family


def run_dist(family, dist, **inputs):
    args, kwargs = family.forward_hook(**inputs)
    return family.return_hook(dist(*args, **kwargs))


def assert_close_dicts(got, expected, atol=ATOL):
    assert set(got) == set(expected), (sorted(set(got) ^ set(expected)))
    for key, value in expected.items():
        assert got[key].shape == value.shape, key
        assert torch.allclose(got[key], value, atol=atol), (key, (got[key] - value).abs().max())


@pytest.mark.parametrize("name", list(causal_configs()))
def test_causal_lm_equals_hf(name):
    hf, dist, family = build_pair(name)
    ids, mask, labels = batch()
    positions = None if name == "gpt2" else torch.arange(SEQ).expand(BATCH, SEQ) + 3
    expected = hf(input_ids=ids, attention_mask=mask, labels=labels, position_ids=positions)
    got = run_dist(family, dist, input_ids=ids, attention_mask=mask, labels=labels,
                   position_ids=positions)
    assert type(got).__name__.startswith("CausalLMOutput")
    assert torch.allclose(got["logits"], expected.logits, atol=ATOL)
    assert torch.allclose(got["loss"], expected.loss, atol=ATOL)
    expected.loss.backward()
    got["loss"].backward()
    hf_grads = {k: p.grad for k, p in hf.named_parameters()}
    if family is gpt2:  # tied: the embedding's gradient is the sum of both uses, once
        hf_grads["lm_head.weight"] = hf_grads["transformer.wte.weight"]
    dist_grads = {k: p.grad for k, p in dist.named_parameters()}
    assert_close_dicts(dist_grads, TO_SMP[family](hf_grads))
    logits = run_dist(family, dist, input_ids=ids)["logits"]  # no mask, no labels
    assert torch.allclose(logits, hf(input_ids=ids).logits, atol=ATOL)


@pytest.mark.parametrize("name", list(causal_configs()))
def test_causal_lm_state_dict_round_trip(name):
    hf, dist, family = build_pair(name)
    hf_state = hf.state_dict()
    assert_close_dicts(TO_HF[family](TO_SMP[family](hf_state)), hf_state, atol=0.0)
    fresh = type(hf)(hf.config)
    fresh.load_state_dict(TO_HF[family](dist.state_dict()), strict=True)
    assert_close_dicts(fresh.state_dict(), hf_state, atol=0.0)


def encoder_pair(family, attn="eager"):
    if family is bert:
        config = transformers.BertConfig(
            vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
            intermediate_size=64, max_position_embeddings=32, hidden_dropout_prob=0.0,
            attention_probs_dropout_prob=0.0)
        cls = transformers.BertModel
    else:
        config = transformers.RobertaConfig(
            vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
            intermediate_size=64, max_position_embeddings=40, hidden_dropout_prob=0.0,
            attention_probs_dropout_prob=0.0)
        cls = transformers.RobertaModel
    config._attn_implementation = attn
    torch.manual_seed(2)
    hf = cls(config, add_pooling_layer=False).eval()
    _, kwargs = family.init_hook(config)
    dist = smp_nn.DistributedTransformer(**kwargs).eval()
    dist.load_state_dict(TO_SMP[family](hf.encoder.state_dict()), strict=True)
    swapped = copy.deepcopy(hf)
    swapped.encoder = _Hooked(family, dist)
    return hf, swapped, dist


class _Hooked(torch.nn.Module):
    """The distributed encoder behind the hooks, as the registry installs them."""

    def __init__(self, family, dist):
        super().__init__()
        self.family, self.dist = family, dist

    def forward(self, *args, **kwargs):
        args, kwargs = self.family.forward_hook(*args, **kwargs)
        return self.family.return_hook(self.dist(*args, **kwargs))


@pytest.mark.parametrize("family,attn", [(bert, "eager"), (bert, "sdpa"), (roberta, "eager")])
def test_encoder_equals_hf(family, attn):
    hf, swapped, dist = encoder_pair(family, attn)
    ids, mask, _ = batch(3)
    ids = ids.clamp(min=2)  # RoBERTa's padding id is 1
    expected = hf(input_ids=ids, attention_mask=mask).last_hidden_state
    got = swapped(input_ids=ids, attention_mask=mask).last_hidden_state
    assert torch.allclose(got, expected, atol=ATOL)
    target = torch.randn(expected.shape, generator=torch.Generator().manual_seed(4))
    ((expected - target) ** 2).mean().backward()
    ((got - target) ** 2).mean().backward()
    hf_grads = {k: p.grad for k, p in hf.encoder.named_parameters()}
    assert_close_dicts({k: p.grad for k, p in dist.named_parameters()}, TO_SMP[family](hf_grads))
    emb = {k: p.grad for k, p in swapped.embeddings.named_parameters()}
    assert_close_dicts(emb, {k: p.grad for k, p in hf.embeddings.named_parameters()})


@pytest.mark.parametrize("family", [bert, roberta])
def test_encoder_state_dict_round_trip(family):
    hf, _, dist = encoder_pair(family)
    whole = hf.state_dict()
    smp_names = TO_SMP[family](whole)
    assert "encoder.seq_layers.1.output.dense2.weight" in smp_names
    assert "embeddings.word_embeddings.weight" in smp_names  # outside the encoder: unchanged
    assert_close_dicts(TO_HF[family](smp_names), whole, atol=0.0)
    assert_close_dicts(TO_HF[family](dist.state_dict()), hf.encoder.state_dict(), atol=0.0)
    assert bert.translate_hf_state_dict_to_smdistributed is bert.translate_hf_state_dict_to_smdistributed_bert
    assert roberta.translate_hf_state_dict_to_smdistributed is (
        roberta.translate_hf_state_dict_to_smdistributed_roberta)


def test_gpt2_names_and_conv1d_transposes():
    hf, _, _ = build_pair("gpt2")
    sd = hf.state_dict()
    smp_sd = gpt2.translate_hf_state_dict_to_smdistributed_gpt2(sd)
    c_attn = sd["transformer.h.0.attn.c_attn.weight"]  # [in, 3 * out]
    assert torch.equal(smp_sd["transformer.seq_layers.0.attention.key.weight"], c_attn[:, 32:64].t())
    assert torch.equal(smp_sd["transformer.seq_layers.0.output.dense1.weight"],
                       sd["transformer.h.0.mlp.c_fc.weight"].t())
    assert "lm_head.weight" not in smp_sd and "word_embedding.weight" in smp_sd
    with_buffers = gpt2.translate_state_dict_to_hf_gpt2(smp_sd, max_seq_len=32)
    assert with_buffers["transformer.h.1.attn.bias"].shape == (1, 1, 32, 32)
    prefixed = gpt2.translate_hf_state_dict_to_smdistributed_gpt2({"lm." + k: v for k, v in sd.items()})
    assert "lm.transformer.seq_layers.1.attention.dense.weight" in prefixed


def test_gpt2_hook_rules_and_messages():
    config = transformers.GPT2Config(n_embd=30, n_head=4)
    with pytest.raises(SMPConfigError, match=r"^Embedding size \(30\) must be divisible by the "
                                             r"number of attention heads \(4\)"):
        gpt2.init_hook(config)
    with pytest.raises(SMPConfigError, match=r"^Only 'gelu_new' and 'relu' activations are "
                                             r"supported\.$"):
        gpt2.init_hook(transformers.GPT2Config(activation_function="gelu"))
    _, kwargs = gpt2.init_hook(transformers.GPT2Config(activation_function="relu"))
    assert kwargs["activation"] == "relu" and kwargs["pre_layernorm"] and kwargs["num_token_types"] == 0
    ids = torch.zeros(1, 4, dtype=torch.long)
    for name, value in [("past_key_values", ()), ("inputs_embeds", torch.zeros(1, 4, 8)),
                        ("head_mask", torch.ones(2)), ("use_cache", True),
                        ("output_attentions", True), ("output_hidden_states", True),
                        ("return_dict", False)]:
        with pytest.raises(SMPUnsupportedError, match=name):
            gpt2.forward_hook(input_ids=ids, **{name: value})
    (inputs,), _ = gpt2.forward_hook(input_ids=ids, attention_mask=torch.tensor([[1, 1, 1, 0]]),
                                     use_cache=False, return_dict=True)
    assert inputs[1].tolist() == [[0, 0, 0, 1]]  # SMP's convention: 1 = masked


def test_registered_replacements():
    from transformers.models.bert.modeling_bert import BertEncoder
    from transformers.models.roberta.modeling_roberta import RobertaEncoder

    expected = {transformers.GPT2LMHeadModel: smp_nn.DistributedTransformerLMHead,
                BertEncoder: smp_nn.DistributedTransformer,
                RobertaEncoder: smp_nn.DistributedTransformer,
                transformers.GPTJForCausalLM: smp_nn.DistributedTransformerLMHead,
                transformers.GPTNeoXForCausalLM: smp_nn.DistributedTransformerLMHead}
    for hf_cls, dist_cls in expected.items():
        reg = registration(hf_cls)
        assert reg is not None and reg.dist_module is dist_cls, hf_cls
        assert reg.translate is not None and reg.return_hook is not None


def test_import_order_and_without_transformers():
    code = ("import shoal.modelparallel.torch as smp\n"
            "from shoal.modelparallel.torch.tensorparallel.registry import registration\n"
            "import sys; assert 'transformers.models.gpt2.modeling_gpt2' not in sys.modules\n"
            "from transformers import GPT2LMHeadModel\n"
            "assert registration(GPT2LMHeadModel).dist_module is smp.nn.DistributedTransformerLMHead\n"
            "import smdistributed.modelparallel.torch.nn.huggingface.gpt2 as g\n"
            "assert callable(g.translate_state_dict_to_hf_gpt2)\n")
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    subprocess.run([sys.executable, "-c", code], check=True, env=env, timeout=120)
    absent = ("import sys; sys.modules['transformers'] = None\n"
              "import shoal.modelparallel.torch as smp\n"
              "from shoal.modelparallel.torch.nn.huggingface import gpt2\n"
              "assert gpt2.translate_hf_state_dict_to_smdistributed_gpt2({}) == {}\n")
    subprocess.run([sys.executable, "-c", absent], check=True, env=env, timeout=120)
