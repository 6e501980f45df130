"""smp.nn's transformer modules in one process (tp = 1, no smp.init): they equal the
single-process reference built from SMP's published reference implementations, keep SMP's
constructor defaults and names, refuse what SMP refuses with its messages, and refuse the
options they do not implement rather than ignore them."""

from __future__ import annotations

import inspect
import os
import sys

import pytest

torch = pytest.importorskip("torch")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "integration"))
import transformer_reference as ref  # noqa: E402
from shoal.modelparallel.errors import SMPConfigError, SMPUnsupportedError  # noqa: E402
from shoal.modelparallel.torch import nn as smp_nn  # noqa: E402

pytestmark = pytest.mark.torch
H, HEADS, HEAD, INTER, S, N = 12, 4, 3, 20, 5, 3
NO_DROPOUT = {"attention_dropout_prob": 0.0, "hidden_dropout_prob": 0.0}


def same(dist, reference, inputs, pick=lambda out: out):
    ref.load_shards(dist, reference)
    want, got = pick(reference(inputs)), pick(dist(inputs))
    assert torch.allclose(got, want, atol=1e-6, rtol=1e-6)
    got.sum().backward()
    want.sum().backward()
    want_grads = dict(reference.named_parameters())
    for name, param in dist.named_parameters():
        assert torch.allclose(param.grad, want_grads[name].grad, atol=1e-5, rtol=1e-5), name


def states():
    return torch.randn(N, S, H)


def test_attention_with_causal_mask_equals_reference():
    torch.manual_seed(0)
    mask = (torch.rand(N, 1, 1, S) < 0.3).float() * -1e4
    dist = smp_nn.DistributedAttentionLayer(HEADS, HEAD, H, causal_mask_size=8,
                                            pre_layernorm=True, **NO_DROPOUT)
    same(dist, ref.RefAttention(HEADS, HEAD, H, causal=8, pre=True), (states(), mask))


def test_cross_attention_equals_reference():
    torch.manual_seed(1)
    dist = smp_nn.DistributedAttentionLayer(HEADS, HEAD, H, cross_attention=True, **NO_DROPOUT)
    cross = torch.randn(N, S + 2, H)
    same(dist, ref.RefAttention(HEADS, HEAD, H, cross=True), (states(), cross, None))


@pytest.mark.parametrize("activation", ["gelu", "relu"])
def test_output_layer_equals_reference(activation):
    torch.manual_seed(2)
    dist = smp_nn.DistributedTransformerOutputLayer(H, INTER, 0.0, activation,
                                                    pre_layernorm=True, post_layernorm=False)
    same(dist, ref.RefOutput(H, INTER, activation, pre=True, post=False), states())


def test_transformer_equals_reference_and_returns_the_mask():
    torch.manual_seed(3)
    dist = smp_nn.DistributedTransformer(3, HEADS, HEAD, H, INTER, causal_mask_size=S,
                                         add_cross_attention=True, **NO_DROPOUT)
    reference = ref.RefTransformer(3, heads=HEADS, head_size=HEAD, hidden=H, inter=INTER,
                                   causal=S, cross=True)
    inputs = (states(), torch.randn(N, 4, H), torch.zeros(N, 1, 1, S), torch.zeros(N, 1, 1, 4))
    assert all(a is b for a, b in zip(dist(inputs)[1:], inputs[1:]))
    same(dist, reference, inputs, pick=lambda out: out[0])
    assert isinstance(dist.seq_layers, torch.nn.Sequential) and len(dist.seq_layers) == 3


def test_lm_head_loss_and_logits_equal_reference():
    torch.manual_seed(4)
    dist = smp_nn.DistributedTransformerLMHead(
        2, HEADS, HEAD, H, INTER, vocab_size=19, num_positions=8, num_token_types=2,
        causal_mask_size=8, pre_layernorm=True, post_layernorm=False,
        embedding_dropout_prob=0.0, **NO_DROPOUT)
    reference = ref.RefLMHead(2, 19, 8, 2, final_layernorm=True, heads=HEADS, head_size=HEAD,
                              hidden=H, inter=INTER, causal=8, pre=True, post=False)
    ids = torch.randint(0, 19, (N, S))
    inputs = (ids, (torch.rand(N, S) < 0.2).long(), torch.randint(0, 2, (N, S)), None, ids)
    same(dist, reference, inputs, pick=lambda out: out[0])
    logits = dist(inputs[:2] + (None, None))
    assert logits.shape == (N, S, 19)
    assert torch.allclose(dist(inputs)[1], reference(inputs)[1], atol=1e-6)


def test_state_dict_names():
    layer = smp_nn.DistributedTransformer(1, 2, 2, 4, 8, pre_layernorm=True)
    keys = set(layer.state_dict())
    for part in ("query", "key", "value", "dense"):
        assert {f"seq_layers.0.attention.{part}.weight", f"seq_layers.0.attention.{part}.bias"} <= keys
    assert "seq_layers.0.output.dense1.weight" in keys and "seq_layers.0.output.dense2.bias" in keys
    assert "seq_layers.0.attention.pre_layernorm.weight" in keys
    head = smp_nn.DistributedTransformerLMHead(1, 2, 2, 4, 8, vocab_size=7, num_positions=6)
    keys = set(head.state_dict())
    assert {"word_embedding.weight", "position_embedding.weight"} <= keys
    assert not any(k.startswith("layernorm") or "token_type" in k for k in keys)


DEFAULTS = {
    "DistributedTransformerLayer": dict(
        num_attention_heads=32, attention_head_size=32, hidden_size=1024, intermediate_size=4096,
        attention_dropout_prob=0.1, hidden_dropout_prob=0.1, activation="gelu",
        layernorm_epsilon=1e-5, initializer_range=0.02, use_normal_initialization=False,
        causal_mask_size=None, add_cross_attention=False, pre_layernorm=False,
        post_layernorm=True),
    "DistributedAttentionLayer": dict(
        num_attention_heads=32, attention_head_size=32, hidden_size=1024,
        attention_dropout_prob=0.1, hidden_dropout_prob=0.1, layernorm_epsilon=1e-5,
        initializer_range=0.02, use_normal_initialization=False, cross_attention=False,
        causal_mask_size=None, pre_layernorm=False, post_layernorm=True),
    "DistributedTransformerOutputLayer": dict(
        hidden_size=1024, intermediate_size=4096, hidden_dropout_prob=0.1, activation="gelu",
        layernorm_epsilon=1e-5, initializer_range=0.02, use_normal_initialization=False,
        pre_layernorm=False, post_layernorm=True, fp32_residual_addition=False),
    "DistributedTransformer": dict(
        num_layers=12, num_attention_heads=32, attention_head_size=32, hidden_size=1024,
        intermediate_size=4096, attention_dropout_prob=0.1, hidden_dropout_prob=0.1,
        activation="gelu", layernorm_epsilon=1e-5, initializer_range=0.02,
        use_normal_initialization=False, causal_mask_size=None, add_cross_attention=False,
        pre_layernorm=False, post_layernorm=True),
    "DistributedTransformerLMHead": dict(
        num_layers=12, num_attention_heads=32, attention_head_size=32, hidden_size=1024,
        intermediate_size=4096, vocab_size=30522, num_positions=1024, attention_dropout_prob=0.1,
        hidden_dropout_prob=0.1, activation="gelu", layernorm_epsilon=1e-5, num_token_types=0,
        causal_mask_size=None, add_cross_attention=False, add_lm_head=True,
        initializer_range=0.02, use_normal_initialization=False, pre_layernorm=False,
        post_layernorm=True),
}


@pytest.mark.parametrize("name", list(DEFAULTS))
def test_constructor_arguments_in_smp_order_with_smp_defaults(name):
    params = list(inspect.signature(getattr(smp_nn, name)).parameters.values())
    documented = DEFAULTS[name]
    assert [p.name for p in params[: len(documented)]] == list(documented)
    assert {p.name: p.default for p in params[: len(documented)]} == documented


def test_smp_messages():
    with pytest.raises(SMPConfigError, match=r"^Only relu and gelu activations are supported by "
                                             r"DistributedTransformerOutput layer\.$"):
        smp_nn.DistributedTransformerLayer(2, 2, 4, 8, activation="tanh")
    with pytest.raises(SMPConfigError, match=r"^At least one of pre_layernorm, "
                                             r"single_pre_layernorm and post_layernorm must be True"):
        smp_nn.DistributedAttentionLayer(2, 2, 4, post_layernorm=False)
    with pytest.raises(SMPConfigError, match=r"^If causal mask size \(8\) is provided, it must be "
                                             r"larger than or equal to the number of positions \(16\)\.$"):
        smp_nn.DistributedTransformerLMHead(1, 2, 2, 4, 8, vocab_size=7, num_positions=16,
                                            causal_mask_size=8)


def test_fp32_residual_addition_needs_speed(monkeypatch):
    from shoal.modelparallel.torch.nn import output

    class MemoryLayout(output.Layout):
        def __init__(self, hidden_size):
            super().__init__(hidden_size)
            self.optimize = "memory"

    monkeypatch.setattr(output, "Layout", MemoryLayout)
    with pytest.raises(SMPConfigError, match=r"^fp32 residual addition only supports "
                                             r"optimize == speed\.$"):
        smp_nn.DistributedTransformerOutputLayer(4, 8, fp32_residual_addition=True)


def test_extra_options_accepted_refused_or_unknown():
    small = dict(num_layers=1, num_attention_heads=2, attention_head_size=2, hidden_size=4,
                 intermediate_size=8)
    smp_nn.DistributedTransformer(**small, fused_softmax=True, fused_bias_gelu=True,
                                  attention_in_fp32=True, query_key_layer_scaling=True,
                                  flash_attention=True, use_alibi=False)
    with pytest.raises(SMPUnsupportedError, match="use_alibi=True is not supported"):
        smp_nn.DistributedTransformer(**small, use_alibi=True)
    with pytest.raises(SMPUnsupportedError, match="distribute_embedding=True"):
        smp_nn.DistributedTransformerLMHead(**small, vocab_size=7, num_positions=6,
                                            distribute_embedding=True)
    with pytest.raises(TypeError, match="unexpected keyword argument 'colour'"):
        smp_nn.DistributedTransformerLayer(2, 2, 4, 8, colour="blue")


def test_options_that_change_the_computation():
    torch.manual_seed(5)
    x = states()
    unscaled = smp_nn.DistributedAttentionLayer(HEADS, HEAD, H, scale_attention_scores=False,
                                                **NO_DROPOUT)
    scaled = smp_nn.DistributedAttentionLayer(HEADS, HEAD, H, **NO_DROPOUT)
    scaled.load_state_dict(unscaled.state_dict())
    assert not torch.allclose(unscaled((x, None)), scaled((x, None)))
    plain = smp_nn.DistributedTransformerLMHead(1, 2, 2, 4, 8, vocab_size=7, num_positions=6,
                                                use_positional_embedding=False,
                                                add_lm_head=False, **NO_DROPOUT)
    assert "position_embedding.weight" not in plain.state_dict()
    assert plain((torch.randint(0, 7, (2, 6)),)).shape == (2, 6, 4)


def test_dropout_at_tp1_follows_torch_seed():
    layer = smp_nn.DistributedTransformerLayer(2, 2, 4, 8, attention_dropout_prob=0.5,
                                               hidden_dropout_prob=0.5)
    x = torch.randn(2, 3, 4)
    torch.manual_seed(6)
    first = layer((x, None))[0]
    torch.manual_seed(6)
    assert torch.equal(first, layer((x, None))[0])
    layer.eval()
    assert not torch.equal(first, layer((x, None))[0])


def test_normal_initialisation():
    torch.manual_seed(7)
    layer = smp_nn.DistributedTransformerOutputLayer(64, 256, use_normal_initialization=True,
                                                     initializer_range=0.02)
    assert abs(layer.dense1.weight.std().item() - 0.02) < 0.002
    assert torch.count_nonzero(layer.dense1.bias) == 0
