"""Single-process reference modules for ``smp.nn``'s transformer modules, written from the
reference implementations SMP publishes (SageMaker Python SDK, "Appendix: Reference
Implementations for Modules"), with the same submodule names as the distributed modules so
that weights and gradients map one to one. Where this differs from the appendix's sketch:
the residual connection is kept without post-layernorm (a pre-layernorm block's), the MLP's
dropout is ``hidden_dropout_prob``, Q/K/V are ``hidden -> heads * head_size``, and the causal
mask puts ``mask_value`` on the future positions.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


class RefAttention(nn.Module):
    def __init__(self, heads, head_size, hidden, cross=False, causal=None, pre=False,
                 post=True, eps=1e-5, mask_value=-1e4, p_attn=0.0, p_hidden=0.0):
        super().__init__()
        self.heads, self.head_size, self.cross, self.mask_value = heads, head_size, cross, mask_value
        width = heads * head_size
        self.query, self.key, self.value = (nn.Linear(hidden, width) for _ in range(3))
        self.dense = nn.Linear(width, hidden)
        self.dropout1, self.dropout2 = nn.Dropout(p_attn), nn.Dropout(p_hidden)
        self.pre_layernorm = nn.LayerNorm(hidden, eps=eps) if pre else None
        self.layernorm = nn.LayerNorm(hidden, eps=eps) if post else None
        self.causal = causal

    def split(self, x):
        return x.view(x.shape[0], x.shape[1], self.heads, self.head_size).permute(0, 2, 1, 3)

    def forward(self, inp):
        if self.cross:
            hidden, cross, mask = inp
        else:
            hidden, mask = inp
        normed = self.pre_layernorm(hidden) if self.pre_layernorm is not None else hidden
        source = cross if self.cross else normed
        q, k, v = self.split(self.query(normed)), self.split(self.key(source)), \
            self.split(self.value(source))
        scores = q @ k.transpose(-1, -2) / math.sqrt(self.head_size)
        if self.causal is not None and not self.cross:
            s = scores.shape[-1]
            allowed = torch.tril(torch.ones(s, s, dtype=torch.bool))
            scores = torch.where(allowed, scores, torch.full_like(scores, self.mask_value))
        if mask is not None:
            scores = scores + mask
        probs = self.dropout1(F.softmax(scores, dim=-1))
        context = (probs @ v).permute(0, 2, 1, 3).reshape(hidden.shape[0], hidden.shape[1], -1)
        out = self.dropout2(self.dense(context))
        return self.layernorm(out + hidden) if self.layernorm is not None else out + hidden


class RefOutput(nn.Module):
    def __init__(self, hidden, inter, activation="gelu", pre=False, post=True, eps=1e-5, p=0.0):
        super().__init__()
        self.dense1, self.dense2 = nn.Linear(hidden, inter), nn.Linear(inter, hidden)
        self.activation, self.dropout = activation, nn.Dropout(p)
        self.pre_layernorm = nn.LayerNorm(hidden, eps=eps) if pre else None
        self.layernorm = nn.LayerNorm(hidden, eps=eps) if post else None

    def forward(self, x):
        normed = self.pre_layernorm(x) if self.pre_layernorm is not None else x
        inner = self.dense1(normed)
        inner = F.gelu(inner) if self.activation == "gelu" else F.relu(inner)
        out = self.dropout(self.dense2(inner))
        return self.layernorm(x + out) if self.layernorm is not None else x + out


class RefLayer(nn.Module):
    def __init__(self, heads, head_size, hidden, inter, activation="gelu", causal=None,
                 cross=False, pre=False, post=True):
        super().__init__()
        self.add_cross = cross
        self.attention = RefAttention(heads, head_size, hidden, causal=causal, pre=pre, post=post)
        if cross:
            self.cross_attention = RefAttention(heads, head_size, hidden, cross=True, pre=pre,
                                                post=post)
        self.output = RefOutput(hidden, inter, activation, pre=pre, post=post)

    def forward(self, inp):
        if self.add_cross:
            hidden, cross, mask, cross_mask = inp
        else:
            hidden, mask = inp
        out = self.attention((hidden, mask))
        if self.add_cross:
            out = self.cross_attention((out, cross, cross_mask))
        out = self.output(out)
        return (out, cross, mask, cross_mask) if self.add_cross else (out, mask)


class RefTransformer(nn.Module):
    def __init__(self, num_layers, **layer):
        super().__init__()
        self.seq_layers = nn.Sequential(*(RefLayer(**layer) for _ in range(num_layers)))

    def forward(self, inp):
        return self.seq_layers(inp)


class RefLMHead(nn.Module):
    def __init__(self, num_layers, vocab, positions, token_types, final_layernorm=False,
                 mask_value=-1e4, **layer):
        super().__init__()
        hidden = layer["hidden"]
        self.mask_value = mask_value
        self.word_embedding = nn.Embedding(vocab, hidden)
        self.position_embedding = nn.Embedding(positions, hidden)
        self.token_type_embedding = nn.Embedding(token_types, hidden) if token_types else None
        self.transformer = RefTransformer(num_layers, **layer)
        self.layernorm = nn.LayerNorm(hidden) if final_layernorm else None

    def forward(self, inp):
        ids, mask, token_types, positions, labels = inp
        if positions is None:
            positions = torch.arange(ids.shape[1]).expand_as(ids)
        x = self.word_embedding(ids) + self.position_embedding(positions)
        if token_types is not None:
            x = x + self.token_type_embedding(token_types)
        additive = mask[:, None, None, :].float() * self.mask_value
        hidden = self.transformer((x, additive))[0]
        if self.layernorm is not None:
            hidden = self.layernorm(hidden)
        logits = F.linear(hidden, self.word_embedding.weight)
        if labels is None:
            return logits
        loss = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]),
                               labels[:, 1:].reshape(-1))
        return loss, logits


def load_shards(dist: nn.Module, ref: nn.Module) -> None:
    """Fills ``dist``'s parameters with their parts of ``ref``'s same-named ones."""
    full = dict(ref.named_parameters())
    with torch.no_grad():
        for name, param in dist.named_parameters():
            param.copy_(shard_of(dist, name, full[name]))


def shard_of(dist: nn.Module, name: str, full: torch.Tensor) -> torch.Tensor:
    """This rank's part of the full tensor of ``dist``'s parameter ``name``."""
    owner_name, _, leaf = name.rpartition(".")
    owner = dist.get_submodule(owner_name) if owner_name else dist
    split = owner.split_of(leaf) if hasattr(owner, "split_of") else None
    if split is None:
        return full
    return split.shard(full, owner.tp_rank())
