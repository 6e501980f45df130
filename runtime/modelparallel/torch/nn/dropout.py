"""Dropout inside the tensor-parallel modules.

With tp > 1 a block's activations are either replicated over the TP group (``speed``, and
anything with ``prescaled_batch``) or a split of one logical tensor (heads, hidden shards).
Either way every rank must drop the same elements of the logical tensor, or the replicas
stop agreeing. So each dropout draws its mask for the whole logical tensor from its own
``torch.Generator``, seeded from ``cfg.tensor_parallel_seed`` and the dropout's index among
those built in this process (the same on every rank: every rank builds the same model), and
keeps this rank's part of it. Outside a pipeline the generators advance once per call (the
TP peers call a module's dropouts in the same order, running the same forward). Inside a
pipeline's tasks the peers may take their microbatches in different orders, so the mask of
a call comes from a generator of its own for the step and microbatch, which advances with
that microbatch's calls only.

Tensors that are this rank's own data (``local=True``: embeddings of its own rows) and
everything at tp == 1 use torch's default generator, like ``nn.Dropout``.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from shoal.modelparallel.torch import state as _state
from shoal.modelparallel.torch.scheduler import current_task
from shoal.modelparallel.torch.tensorparallel.collectives import step_index

_built = itertools.count()


class ParallelDropout(torch.nn.Module):
    def __init__(self, p: float) -> None:
        super().__init__()
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"dropout probability has to be between 0 and 1, but got {p}")
        self.p = float(p)
        st = _state.current()
        self._tp_size = st.topology.tp_size if st is not None else 1
        seed = int(st.cfg.tensor_parallel_seed) if st is not None else 0
        index = next(_built)
        self._seed = (seed << 24) + index
        self._generator = torch.Generator().manual_seed(self._seed)
        self._per_microbatch: dict[tuple[int, int], torch.Generator] = {}

    def forward(self, x: torch.Tensor, shard_dim: int | None = None,
                sizes: Sequence[int] | None = None, rank: int = 0,
                local: bool = False) -> torch.Tensor:
        """``x`` is the whole logical tensor, or rank ``rank``'s part ``sizes[rank]`` of it
        on ``shard_dim``."""
        if not self.training or self.p == 0.0:
            return x
        if local or self._tp_size == 1:
            return F.dropout(x, self.p, True)
        if self.p == 1.0:
            return x * 0.0
        shape = list(x.shape)
        if shard_dim is not None:
            shape[shard_dim] = sum(sizes)
        keep = torch.empty(shape, dtype=x.dtype).bernoulli_(1.0 - self.p,
                                                            generator=self._generator_now())
        if shard_dim is not None:
            keep = keep.narrow(shard_dim, sum(sizes[:rank]), sizes[rank])
        return x * keep / (1.0 - self.p)

    def mask_generator(self) -> torch.Generator | None:
        """The generator this dropout's next mask comes from; None where it draws from
        torch's default one (or draws nothing). Activation checkpointing restores it so the
        recomputation drops what the forward dropped."""
        if not self.training or self.p in (0.0, 1.0) or self._tp_size == 1:
            return None
        return self._generator_now()

    def _generator_now(self) -> torch.Generator:
        task = current_task()
        st = _state.current()
        if task is None or st is None or st.topology.pp_size == 1:
            return self._generator
        key = (step_index(), task.microbatch)
        if key not in self._per_microbatch:
            if self._per_microbatch and min(self._per_microbatch)[0] != key[0]:
                self._per_microbatch.clear()  # a new step
            seed = hash((self._seed, key)) & ((1 << 62) - 1)
            self._per_microbatch[key] = torch.Generator().manual_seed(seed)
        return self._per_microbatch[key]

    def extra_repr(self) -> str:
        return f"p={self.p}"
