"""A model as the strategy planner sees it: its layers' parameters, FLOPs and activations.

Two ways in, one result (:class:`ModelProfile`, a tuple of :class:`Layer`):

* a transformer description, ``transformer:layers=24,hidden=2304,heads=24,seq=2048,vocab=51200``
  (:func:`parse_description`, :class:`TransformerSpec`): the formulas of Narayanan et al.
  (SC'21) for FLOPs and of Korthikanti et al. (2022, table 2) for activations;
* a Python factory, ``my_model.py:build`` (:mod:`shoal.planning.tracing`): the module is built on
  the meta device and one forward is traced with a sample input, so sizes come from the model
  itself without allocating it.

Activations are counted in bytes per sample at 16-bit precision (the papers' unit); the cost
model doubles them for fp32 training.
"""

from __future__ import annotations

import difflib

import attrs

from shoal.errors import ValidationError

# operations an ``nn.Linear`` forward dispatches (a transpose and a fused multiply-add)
LINEAR_OPS = 2
# A pre-layer-norm GPT block's forward, as dispatched (tests/unit/test_planning_models.py traces
# a reference block to check them): two layer norms, four linears, the attention's scores
# (matmuls, scale, causal mask, softmax and their views), two residual adds
BLOCK_OPS = 54
GATED_OPS = 5  # a third linear and the gate's product
DROPOUT_OPS = 12  # three dropouts, each with its mask
FUSED_ATTENTION_SAVES = 13  # a fused kernel for the scores' matmuls, scale, mask and softmax
EMBEDDING_OPS, HEAD_OPS = 4, 6  # token and position lookups and their sum; the norm and linear


@attrs.frozen
class Layer:
    """One layer of the model, in the order the forward runs them."""

    name: str
    params: int  # trainable parameters
    flops: float  # forward FLOPs per sample
    act_split: float  # saved bytes per sample that tensor parallelism splits
    act_kept: float  # saved bytes per sample it does not split
    boundary: float  # bytes per sample of the output: kept under checkpointing, sent between stages
    tp_comm: float = 0.0  # bytes per sample all-reduced in the forward under tensor parallelism
    split: bool = False  # tensor parallelism splits its parameters and FLOPs
    repeated: bool = False  # one of the model's stack of identical blocks (checkpointed ones)
    speed: float = 1.0  # its FLOP rate relative to a large matmul's, where measured
    largest: int = 0  # elements of its largest parameter tensor (0: one tensor of ``params``)
    ops: int = 0  # operations its forward dispatches (0: not counted, priced as one module)
    # bytes per sample its loss holds in float32 at its backward's peak, whatever the training
    # precision (the saved log-softmax, its gradient and the logits' gradient), split with it
    loss: float = 0.0
    # what SMP's auto-partition weighs (``partition_costs``): the modules in it, and the bytes
    # per sample of every one of their outputs (16-bit), its own included
    modules: int = 1
    outputs: float = 0.0

    @property
    def largest_tensor(self) -> int:
        return self.largest or self.params

    @property
    def calls(self) -> float:
        """Its fixed cost per pass in units of a tiny ``nn.Linear`` call (what the calibration
        probe times as ``layer_overhead``): every dispatched operation costs about the same
        on the host, whatever its size, which dominates small microbatches."""
        return max(1.0, self.ops / LINEAR_OPS)


@attrs.frozen
class ModelProfile:
    """What the cost model needs of a model."""

    name: str
    layers: tuple[Layer, ...] = attrs.field(converter=tuple)
    heads: int | None = None  # tensor-parallel degrees must divide it
    sequence: int | None = None
    description: dict = attrs.field(factory=dict, eq=False)

    @property
    def params(self) -> int:
        return sum(layer.params for layer in self.layers)

    @property
    def flops(self) -> float:
        """Forward FLOPs per sample."""
        return sum(layer.flops for layer in self.layers)

    @property
    def blocks(self) -> int:
        return sum(1 for layer in self.layers if layer.repeated)


def _at_least(minimum: int):
    def check(_, attribute, value):
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValidationError(f"'{attribute.name}' must be an int (got {value!r})")
        if value < minimum:
            raise ValidationError(f"'{attribute.name}' must be >= {minimum} (got {value!r})")
    return check


def _optional_at_least(minimum: int):
    check = _at_least(minimum)
    return lambda i, a, v: None if v is None else check(i, a, v)


@attrs.frozen
class TransformerSpec:
    """A decoder-only transformer (GPT, Llama): the shapes that size it."""

    layers: int = attrs.field(validator=_at_least(1))
    hidden: int = attrs.field(validator=_at_least(1))
    heads: int = attrs.field(validator=_at_least(1))
    seq: int = attrs.field(validator=_at_least(1))
    vocab: int = attrs.field(validator=_at_least(1))
    ffn: int | None = attrs.field(default=None, validator=_optional_at_least(1))  # 4 * hidden
    kv_heads: int | None = attrs.field(default=None, validator=_optional_at_least(1))  # heads
    tied: bool = True  # the output layer shares the embedding's weight
    gated: bool = False  # SwiGLU-style MLP: three matrices instead of two
    flash: bool = False  # attention that does not keep the score matrices (FlashAttention)
    dropout: bool = True  # GPT-style dropout masks (Llama has none)

    def __attrs_post_init__(self):
        if self.hidden % self.heads:
            raise ValidationError(
                f"'hidden' ({self.hidden}) must be divisible by 'heads' ({self.heads}): "
                f"each head has hidden/heads dimensions; try heads="
                f"{_nearest_divisor(self.hidden, self.heads)}")
        if self.heads % self.kv_heads_:
            raise ValidationError(f"'heads' ({self.heads}) must be divisible by 'kv_heads' "
                                  f"({self.kv_heads_}): key/value heads are shared by groups")

    @property
    def ffn_(self) -> int:
        return self.ffn or 4 * self.hidden

    @property
    def kv_heads_(self) -> int:
        return self.kv_heads or self.heads

    @property
    def block_ops(self) -> int:
        return (BLOCK_OPS + GATED_OPS * self.gated + DROPOUT_OPS * self.dropout
                - FUSED_ATTENTION_SAVES * self.flash)

    def profile(self) -> ModelProfile:
        h, s, v, a = self.hidden, self.seq, self.vocab, self.heads
        kv = h * self.kv_heads_ // a
        attention = 2 * h * h + 2 * h * kv + 2 * h + 2 * kv  # q, o, k, v and their biases
        mlp = (3 if self.gated else 2) * h * self.ffn_ + self.ffn_ + h
        block_params = attention + mlp + 4 * h  # two layer norms
        # 2 FLOPs per weight per token, plus QK^T and the weighted sum of V
        block_flops = 2 * s * (attention + mlp) + 4 * s * s * h
        # softmax output, and with dropout its mask (1 byte) and output
        scores = 0 if self.flash else (5 if self.dropout else 2) * a * s * s
        kept = 10 if self.dropout else 8  # layer-norm and matmul inputs, two dropout masks
        # Korthikanti et al., table 2: sbh(10 + 24/t + 5as/(ht)) bytes; of the 24, 16 are the
        # MLP's (4 * 4h), so they follow its width, as Megatron's memory estimate does
        mlp_act = (6 if self.gated else 4) * s * self.ffn_
        # a GPT block's modules: itself, two norms, the attention and the MLP with their
        # linears (q, k, v fused), the activation, and with dropout its three
        drops = 3 if self.dropout else 0
        gate = 1 if self.gated else 0
        block = Layer("block", block_params, block_flops, act_split=8 * s * h + mlp_act + scores,
                      act_kept=kept * s * h, boundary=2 * s * h, tp_comm=2 * 2 * s * h,
                      split=True, repeated=True, largest=max(h * self.ffn_, h * h),
                      ops=self.block_ops, modules=10 + gate + drops,
                      outputs=2 * (s * h * (10 if self.dropout else 8)
                                   + s * self.ffn_ * (2 + gate)
                                   + (a * s * s if self.dropout and not self.flash else 0)))
        embedding = Layer("embedding", v * h + s * h, 0.0, act_split=0.0, act_kept=2 * s * h,
                          boundary=2 * s * h, tp_comm=2 * s * h, split=True, largest=v * h,
                          ops=EMBEDDING_OPS, modules=2 + (1 if self.dropout else 0),
                          outputs=2 * s * h * (2 + (1 if self.dropout else 0)))
        # the loss runs in float32 at any precision (vocabulary-parallel under TP): its
        # log-softmax saved, and in its backward that output's gradient and the logits'
        head = Layer("head", (0 if self.tied else v * h) + 2 * h, 2 * s * h * v,
                     act_split=0.0, act_kept=2 * s * h, boundary=4, split=True,
                     largest=0 if self.tied else v * h, ops=HEAD_OPS, loss=12 * s * v,
                     modules=2, outputs=2 * (s * h + s * v))
        layers = [embedding] + [attrs.evolve(block, name=f"block{i}")
                                for i in range(self.layers)] + [head]
        return ModelProfile("transformer", layers, heads=a, sequence=s,
                            description=attrs.asdict(self))


def _nearest_divisor(n: int, near: int) -> int:
    divisors = [d for d in range(1, n + 1) if n % d == 0]
    return min(divisors, key=lambda d: (abs(d - near), d))


_KEYS = {"layers": int, "hidden": int, "heads": int, "seq": int, "vocab": int, "ffn": int,
         "kv_heads": int, "tied": bool, "gated": bool, "flash": bool, "dropout": bool}
KEY_ALIASES = {"num_layers": "layers", "hidden_size": "hidden", "num_heads": "heads",
                "sequence_length": "seq", "seq_len": "seq", "seq_length": "seq",
                "vocab_size": "vocab",
                "num_attention_heads": "heads", "n_layer": "layers", "n_embd": "hidden",
                "n_head": "heads", "intermediate_size": "ffn", "num_key_value_heads": "kv_heads",
                "tied_embeddings": "tied", "num_hidden_layers": "layers",
                "hidden_width": "hidden", "max_context_width": "seq"}  # HF's and SMP examples
_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


def parse_description(text: str) -> TransformerSpec:
    """``transformer:layers=24,hidden=2304,...`` as a :class:`TransformerSpec`."""
    kind, _, body = str(text).partition(":")
    if kind.strip() != "transformer":
        raise ValidationError(
            f"model description {text!r} must start with 'transformer:' (for example "
            "transformer:layers=24,hidden=2304,heads=24,seq=2048,vocab=51200), or name a "
            "factory as my_model.py:build")
    values = {}
    for item in filter(None, (part.strip() for part in body.split(","))):
        key, sep, value = item.partition("=")
        key = KEY_ALIASES.get(key.strip(), key.strip())
        if not sep or key not in _KEYS:
            close = difflib.get_close_matches(key, list(_KEYS), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ValidationError(f"unknown transformer key {key!r}{hint} in {text!r}; keys: "
                                  f"{', '.join(_KEYS)}, each as key=value")
        values[key] = _value(key, value.strip(), _KEYS[key])
    return from_mapping(values, text)


def from_mapping(values: dict, source: str = "model description") -> TransformerSpec:
    """A :class:`TransformerSpec` from a dict (the estimator's ``model_description``)."""
    values = {KEY_ALIASES.get(k, k): v for k, v in values.items()}
    missing = [k for k in ("layers", "hidden", "heads", "seq", "vocab") if k not in values]
    if missing:
        raise ValidationError(f"{source} lacks {', '.join(missing)} (a transformer needs "
                              "layers, hidden, heads, seq and vocab)")
    unknown = sorted(set(values) - set(_KEYS))
    if unknown:
        raise ValidationError(f"{source}: unknown key(s) {', '.join(unknown)}; keys: "
                              f"{', '.join(_KEYS)}")
    return TransformerSpec(**{k: _value(k, v, _KEYS[k]) if isinstance(v, str) else v
                              for k, v in values.items()})


def _value(key: str, text: str, kind: type):
    if kind is bool:
        if text.lower() in _TRUE:
            return True
        if text.lower() in _FALSE:
            return False
        raise ValidationError(f"'{key}' must be true or false (got {text!r})")
    try:
        return int(text)
    except ValueError:
        raise ValidationError(f"'{key}' must be an int (got {text!r})") from None
