"""Rotary position embeddings of the attention's queries and keys (GPT-J, GPT-NeoX).

Each head's first ``rotary_dim`` channels are rotated by angles ``position * base^(-2i/d)``;
the rest pass unchanged. Two pairings of the rotated channels exist: ``interleaved``
(channels 2i and 2i+1, GPT-J's) and halves (channels i and i + d/2, GPT-NeoX's). The
rotation is per head, so a rank holding some of the heads rotates them alone: nothing is
communicated.

Positions default to ``0 .. S-1``; explicit ones (``position_ids``) reach the layers through
``given_positions``, set by ``DistributedTransformerLMHead`` around its stack, in the
block's layout (the rows of the whole TP group where they are gathered).
"""

from __future__ import annotations

import contextlib
import contextvars

import torch

_POSITIONS: contextvars.ContextVar[torch.Tensor | None] = contextvars.ContextVar(
    "smp_rotary_positions", default=None)


@contextlib.contextmanager
def given_positions(positions: torch.Tensor | None):
    token = _POSITIONS.set(positions)
    try:
        yield
    finally:
        _POSITIONS.reset(token)


def _angles(positions: torch.Tensor, rotary_dim: int, base: float) -> torch.Tensor:
    exponents = torch.arange(0, rotary_dim, 2, dtype=torch.int64).float() / rotary_dim
    inv_freq = 1.0 / (base ** exponents)
    return positions[..., None].float() * inv_freq  # [N, S, rotary_dim / 2]


def rotate(x: torch.Tensor, rotary_dim: int, interleaved: bool, base: float = 10000.0) -> torch.Tensor:
    """``x [N, heads, S, head_size]`` with its first ``rotary_dim`` channels rotated."""
    positions = _POSITIONS.get()
    if positions is None:
        positions = torch.arange(x.shape[-2], device=x.device)[None]
    angles = _angles(positions, rotary_dim, base)
    head, rest = x[..., :rotary_dim], x[..., rotary_dim:]
    if interleaved:
        sin, cos = (t.repeat_interleave(2, -1) for t in (angles.sin(), angles.cos()))
        turned = torch.stack((-head[..., 1::2], head[..., ::2]), dim=-1).flatten(-2)
    else:
        sin, cos = (torch.cat((t, t), -1) for t in (angles.sin(), angles.cos()))
        half = rotary_dim // 2
        turned = torch.cat((-head[..., half:], head[..., :half]), dim=-1)
    sin, cos = sin[:, None].to(x.dtype), cos[:, None].to(x.dtype)  # broadcast over heads
    return torch.cat((head * cos + turned * sin, rest), dim=-1)
