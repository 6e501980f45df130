"""Transformer descriptions: parameters, FLOPs and activations against the published formulas."""

import pytest
from shoal.errors import ValidationError
from shoal.planning.models import TransformerSpec, from_mapping, parse_description

# Narayanan et al. (SC'21), table 1: params (B), heads, hidden, layers; v = 51200, s = 2048
TABLE_1 = [(1.7, 24, 2304, 24), (3.6, 32, 3072, 30), (7.5, 32, 4096, 36),
           (18.4, 48, 6144, 40), (39.1, 64, 8192, 48)]
VOCAB, SEQ = 51200, 2048


def gpt_1_7b(**extra):
    return TransformerSpec(layers=24, hidden=2304, heads=24, seq=SEQ, vocab=VOCAB, **extra)


def expected_params(L, h, s, v):
    attention = 4 * h * h + 4 * h  # q, k, v, o weights and biases
    mlp = 8 * h * h + 5 * h  # h -> 4h -> h, biases 4h + h
    norms = 4 * h  # two layer norms, scale and shift each
    return L * (attention + mlp + norms) + v * h + s * h + 2 * h  # embeddings, final norm


def narayanan_flops(B, L, s, h, v):
    return 72 * B * L * s * h * h * (1 + s / (6 * h) + v / (12 * h * L))


def block(spec):
    return next(layer for layer in spec.profile().layers if layer.repeated)


def test_the_1_7b_row_has_the_closed_form_parameter_count():
    profile = gpt_1_7b().profile()
    L, h, s, v = 24, 2304, SEQ, VOCAB
    assert profile.params == expected_params(L, h, s, v)
    assert profile.params == 12 * L * h * h + 13 * L * h + v * h + s * h + 2 * h
    assert profile.params == pytest.approx(1.7e9, rel=0.03)
    assert profile.blocks == 24 and profile.heads == 24 and profile.sequence == SEQ


@pytest.mark.parametrize("billions, heads, hidden, layers", TABLE_1)
def test_table_1_rows_match_their_sizes_and_narayanans_flops(billions, heads, hidden, layers):
    spec = TransformerSpec(layers=layers, hidden=hidden, heads=heads, seq=SEQ, vocab=VOCAB)
    profile = spec.profile()
    assert profile.params == pytest.approx(billions * 1e9, rel=0.03)
    # forward + backward is three forwards; Narayanan's count leaves out the biases' FLOPs
    batch = 512
    assert 3 * profile.flops * batch == pytest.approx(
        narayanan_flops(batch, layers, SEQ, hidden, VOCAB), rel=0.005)


def test_a_block_saves_korthikantis_activations():
    spec = gpt_1_7b()
    s, h, a = SEQ, 2304, 24
    layer = block(spec)
    # table 2, no parallelism: s*b*h*(34 + 5*a*s/h) bytes, here per sample (b = 1)
    assert layer.act_split + layer.act_kept == s * h * 34 + 5 * a * s * s
    # of the 34, 10 are not split by tensor parallelism: sbh(10 + 24/t + 5as/(ht))
    assert layer.act_kept == 10 * s * h
    # full recompute keeps only the 16-bit layer input, 2sbh
    assert layer.boundary == 2 * s * h
    # Megatron's TP: two all-reduces of b*s*h 16-bit values in each block's forward
    assert layer.tp_comm == 2 * 2 * s * h
    assert layer.split


def test_flash_attention_drops_the_score_matrices():
    s, h, a = SEQ, 2304, 24
    plain, flash = block(gpt_1_7b()), block(gpt_1_7b(flash=True))
    assert flash.act_split + flash.act_kept == 34 * s * h
    assert (plain.act_split + plain.act_kept) - (flash.act_split + flash.act_kept) == 5 * a * s * s
    assert flash.params == plain.params and flash.flops == plain.flops


def test_a_non_default_ffn_follows_megatrons_activation_estimate():
    s, h, ffn = 1024, 512, 3 * 512
    spec = TransformerSpec(layers=2, hidden=h, heads=8, seq=s, vocab=1000, ffn=ffn, flash=True)
    layer = block(spec)
    assert layer.act_split + layer.act_kept == s * (18 * h + 4 * ffn)  # sb(18h + 4 d_ff)
    assert layer.params == 4 * h * h + 4 * h + 2 * h * ffn + ffn + h + 4 * h


def test_grouped_query_attention_shrinks_the_key_and_value_projections():
    h, heads, kv_heads = 2304, 24, 6
    full, grouped = gpt_1_7b().profile(), gpt_1_7b(kv_heads=kv_heads).profile()
    kv_dim = h // heads * kv_heads
    # k and v each lose h*(h - kv_dim) weights and (h - kv_dim) biases per block
    assert full.params - grouped.params == 24 * 2 * (h * (h - kv_dim) + (h - kv_dim))
    assert grouped.flops < full.flops


def test_a_gated_mlp_has_a_third_matrix():
    h, ffn, L, s = 2304, 4 * 2304, 24, SEQ
    plain, gated = gpt_1_7b().profile(), gpt_1_7b(gated=True).profile()
    # one more h x ffn matrix per block (Llama has no biases; the count may carry one)
    assert gated.params - plain.params == pytest.approx(L * h * ffn, rel=1 / h)
    assert gated.flops - plain.flops == pytest.approx(L * 2 * s * h * ffn, rel=1 / h)


def test_an_untied_head_adds_its_own_matrix():
    tied, untied = gpt_1_7b().profile(), gpt_1_7b(tied=False).profile()
    assert untied.params - tied.params == VOCAB * 2304


def test_a_description_parses_into_a_spec_with_its_options():
    spec = parse_description("transformer: layers=24, hidden=2304, heads=24, seq=2048, "
                             "vocab=51200, kv_heads=8, tied=no, flash=true, gated=1")
    assert spec == TransformerSpec(layers=24, hidden=2304, heads=24, seq=2048, vocab=51200,
                                   kv_heads=8, tied=False, flash=True, gated=True)


def test_a_description_accepts_the_aliases_as_keys():
    spec = parse_description("transformer:num_layers=2,hidden_size=64,num_heads=4,seq_len=16,"
                             "vocab_size=100")
    assert (spec.layers, spec.hidden, spec.heads, spec.seq, spec.vocab) == (2, 64, 4, 16, 100)


def test_an_unknown_key_suggests_the_closest_one():
    with pytest.raises(ValidationError, match=r"unknown transformer key 'hiden'.*did you mean "
                                              r"'hidden'"):
        parse_description("transformer:layers=2,hiden=64,heads=4,seq=16,vocab=100")


def test_a_key_without_a_value_is_refused():
    with pytest.raises(ValidationError, match="each as key=value"):
        parse_description("transformer:layers,hidden=64,heads=4,seq=16,vocab=100")


def test_missing_keys_are_named():
    with pytest.raises(ValidationError, match="lacks heads, seq, vocab"):
        parse_description("transformer:layers=24,hidden=2304")


@pytest.mark.parametrize("text, message", [
    ("transformer:layers=2x,hidden=64,heads=4,seq=16,vocab=100", "'layers' must be an int"),
    ("transformer:layers=2,hidden=64,heads=4,seq=16,vocab=100,tied=maybe",
     "'tied' must be true or false"),
    ("transformer:layers=0,hidden=64,heads=4,seq=16,vocab=100", "'layers' must be >= 1"),
])
def test_bad_values_are_refused(text, message):
    with pytest.raises(ValidationError, match=message):
        parse_description(text)


def test_heads_must_divide_hidden_and_the_nearest_divisor_is_suggested():
    hidden, heads = 2304, 25
    nearest = min((d for d in range(1, hidden + 1) if hidden % d == 0),
                  key=lambda d: (abs(d - heads), d))
    assert nearest == 24  # 2304 = 2^8 * 3^2
    with pytest.raises(ValidationError, match=rf"must be divisible by 'heads'.*heads={nearest}\b"):
        parse_description(f"transformer:layers=2,hidden={hidden},heads={heads},seq=16,vocab=100")


def test_kv_heads_must_divide_heads():
    with pytest.raises(ValidationError, match="divisible by 'kv_heads'"):
        TransformerSpec(layers=2, hidden=64, heads=4, seq=16, vocab=100, kv_heads=3)


@pytest.mark.parametrize("text", ["layers=2,hidden=64,heads=4,seq=16,vocab=100",
                                  "gpt:layers=2", "my_model.py:build"])
def test_a_description_must_start_with_transformer(text):
    with pytest.raises(ValidationError, match="must start with 'transformer:'"):
        parse_description(text)


def test_from_mapping_accepts_hf_and_gpt2_style_names():
    llama = from_mapping({"num_layers": 32, "hidden_size": 4096, "num_attention_heads": 32,
                          "sequence_length": 4096, "vocab_size": 32000,
                          "intermediate_size": 11008, "num_key_value_heads": 8,
                          "tied_embeddings": False})
    assert llama == TransformerSpec(layers=32, hidden=4096, heads=32, seq=4096, vocab=32000,
                                    ffn=11008, kv_heads=8, tied=False)
    gpt2 = from_mapping({"n_layer": 12, "n_embd": 768, "n_head": 12, "seq": 1024,
                         "vocab": 50257})
    assert (gpt2.layers, gpt2.hidden, gpt2.heads) == (12, 768, 12)
    # Hugging Face's GPT-2 small (tied head, learned positions) has 124,439,808 parameters
    assert gpt2.profile().params == 124_439_808


def test_from_mapping_reads_string_values_and_refuses_unknown_or_non_int_ones():
    assert from_mapping({"layers": "2", "hidden": "64", "heads": "4", "seq": "16",
                         "vocab": "100", "flash": "yes"}).flash is True
    base = {"layers": 2, "hidden": 64, "heads": 4, "seq": 16, "vocab": 100}
    with pytest.raises(ValidationError, match="unknown key.*dropouts"):
        from_mapping({**base, "dropouts": 1})
    with pytest.raises(ValidationError, match="'hidden' must be an int"):
        from_mapping({**base, "hidden": 64.0})
    with pytest.raises(ValidationError, match="'layers' must be an int"):
        from_mapping({**base, "layers": True})


def _reference_block(h, heads, gated, dropout):
    """A pre-layer-norm GPT block as the GPT-style training scripts write it."""
    import math

    import torch
    import torch.nn.functional as F
    from torch import nn

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(h), nn.LayerNorm(h)
            self.qkv, self.proj = nn.Linear(h, 3 * h), nn.Linear(h, h)
            self.up, self.gate, self.down = nn.Linear(h, 4 * h), nn.Linear(h, 4 * h), nn.Linear(4 * h, h)
            self.p = 0.1 if dropout else 0.0

        def forward(self, x):
            b, t, _ = x.shape
            q, k, v = self.qkv(self.ln1(x)).split(h, dim=-1)
            q, k, v = [y.view(b, t, heads, -1).transpose(1, 2) for y in (q, k, v)]
            scores = (q @ k.transpose(-2, -1)) / math.sqrt(h // heads)
            causal = torch.ones(t, t, dtype=torch.bool, device=x.device).triu(1)
            y = F.dropout(scores.masked_fill(causal, float("-inf")).softmax(-1), self.p) @ v
            x = x + F.dropout(self.proj(y.transpose(1, 2).reshape(b, t, h)), self.p)
            z = self.ln2(x)
            z = F.silu(self.gate(z)) * self.up(z) if gated else F.gelu(self.up(z))
            return x + F.dropout(self.down(z), self.p)

    return Block()


@pytest.mark.parametrize("gated, dropout", [(False, False), (False, True), (True, False),
                                            (True, True)])
def test_a_blocks_operations_are_those_a_reference_block_dispatches(gated, dropout):
    torch = pytest.importorskip("torch")
    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        ops = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            Count.ops += 1
            return func(*args, **(kwargs or {}))

    h, heads = 64, 4
    block = _reference_block(h, heads, gated, dropout).to("meta").train()
    with Count():
        block(torch.empty(2, 16, h, device="meta"))
    spec = TransformerSpec(layers=2, hidden=h, heads=heads, seq=16, vocab=128, gated=gated,
                           dropout=dropout)
    assert spec.block_ops == Count.ops
    layer = next(layer for layer in spec.profile().layers if layer.repeated)
    assert layer.ops == Count.ops and layer.calls == Count.ops / 2
    fused = TransformerSpec(layers=2, hidden=h, heads=heads, seq=16, vocab=128, gated=gated,
                            dropout=dropout, flash=True)
    assert fused.block_ops < spec.block_ops
