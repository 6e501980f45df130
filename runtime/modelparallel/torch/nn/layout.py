"""Where a transformer block's activations live across the TP group (``optimize``).

Each TP rank brings its own batch ``[B, S, H]`` (unless the batch is prescaled). Inside a
block the activations take one of two layouts, chosen by ``smp.state.cfg.optimize`` when the
module is built:

``speed`` (Megatron's layout)
    The group's batches are gathered: every rank holds the same ``[tp*B, S, H]``. Attention
    heads and the MLP's intermediate channels are split; the projections into them are
    column-parallel (their input's gradient summed over the group), the projections out of
    them row-parallel followed by an all-reduce. LayerNorm is replicated. On the way out
    each rank keeps its own ``B`` rows.

``memory``
    An all-to-all trades rows for hidden channels: rank r holds ``[tp*B, S, H_r]``, its
    share of the hidden dimension for the whole group's batch, so nothing is duplicated.
    Every projection takes this rank's share of its input channels and reduce-scatters the
    partial products to its share of the output channels (local heads, local intermediate
    channels, local hidden channels); LayerNorm is distributed over the hidden shards. An
    all-to-all back gives each rank its rows.

``prescaled_batch`` (speed only): the group already shares one batch ``[N, S, H]``, so there
is no gather on the way in and no narrowing on the way out.

A stack of layers enters the layout once, before its first layer, and leaves it after its
last; masks travel with the rows (gathered like them).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from shoal.modelparallel.torch import state as _state
from shoal.modelparallel.torch.nn.layernorm import DistributedLayerNorm
from shoal.modelparallel.torch.tensorparallel import collectives as tp


class Layout:
    """The layout of one module's activations, fixed when the module is built."""

    def __init__(self, hidden_size: int) -> None:
        st = _state.current()
        self.tp_size = st.topology.tp_size if st is not None else 1
        self.tp_rank = st.topology.tp_rank if st is not None else 0
        self.optimize = str(st.cfg.optimize) if st is not None else "speed"
        self.prescaled = bool(st is not None and st.cfg.prescaled_batch)
        self.hidden_size = int(hidden_size)
        self.hidden_sizes = tp.local_sizes(self.hidden_size, self.tp_size)

    @property
    def memory(self) -> bool:
        """Activations sharded on the hidden dimension (only meaningful with tp > 1)."""
        return self.tp_size > 1 and self.optimize == "memory"

    @property
    def gathers_rows(self) -> bool:
        """Whether the block works on the whole group's rows (each rank brought its own)."""
        return self.tp_size > 1 and not self.prescaled

    @property
    def local_hidden(self) -> int:
        return self.hidden_sizes[self.tp_rank]

    def layernorm(self, eps: float) -> torch.nn.Module:
        """LayerNorm over the hidden dimension: whole and replicated, or over its shards."""
        if self.memory:
            return DistributedLayerNorm(self.hidden_size, eps=eps)
        return torch.nn.LayerNorm(self.hidden_size, eps=eps)

    # -- hidden states ---------------------------------------------------------------------
    def enter(self, x: torch.Tensor) -> torch.Tensor:
        """``[B, S, H]`` of this rank -> the block's layout."""
        if not self.gathers_rows:
            return x
        if self.memory:
            return tp.all_to_all(x, split_dim=-1, cat_dim=0, split_sizes=self.hidden_sizes)
        # Backward keeps this rank's rows: the gradients inside are replicated.
        return tp.gather(x, 0)

    def leave(self, y: torch.Tensor) -> torch.Tensor:
        """The block's layout -> ``[B, S, H]`` of this rank."""
        if not self.gathers_rows:
            return y
        rows = [y.shape[0] // self.tp_size] * self.tp_size
        if not self.memory:
            return tp.scatter(y, 0, rows)
        return self._hidden_to_rows(y, rows)

    def _hidden_to_rows(self, y: torch.Tensor, rows: list[int]) -> torch.Tensor:
        # The all-to-all concatenates equal extents; uneven hidden shards travel padded
        # to the widest, and the padding is dropped on arrival.
        widest = max(self.hidden_sizes)
        if all(h == widest for h in self.hidden_sizes):
            return tp.all_to_all(y, split_dim=0, cat_dim=-1, split_sizes=rows)
        padded = F.pad(y, (0, widest - y.shape[-1]))
        mixed = tp.all_to_all(padded, split_dim=0, cat_dim=-1, split_sizes=rows)
        keep = torch.cat([torch.arange(h) + r * widest for r, h in enumerate(self.hidden_sizes)])
        return mixed.index_select(-1, keep)

    # -- masks (no gradient) -------------------------------------------------------------
    def enter_mask(self, mask: torch.Tensor | None, rows: int) -> torch.Tensor | None:
        """A mask of this rank's ``rows`` rows -> the group's rows (one broadcast over the
        batch stays as it is)."""
        if mask is None or not self.gathers_rows or mask.shape[0] != rows:
            return mask
        return tp.gather(mask.detach(), 0)

    def leave_mask(self, mask: torch.Tensor | None, rows: int) -> torch.Tensor | None:
        if mask is None or not self.gathers_rows or mask.shape[0] != rows * self.tp_size:
            return mask
        return mask.narrow(0, self.tp_rank * rows, rows)
