"""``smp.nn.DistributedEmbedding``: an embedding table split over the TP group.

By default (as SMP documents) the embedding dimension is split: each rank gathers the TP
group's token ids, looks up its columns for all of them, and an all-to-all gives every rank
its own rows with every column. ``vocab_parallel=True`` splits the vocabulary instead
(Megatron's layout): each rank looks up the ids it holds, zeros for the others, and the
partial rows are summed (reduce-scattered over the batch, or all-reduced when the batch is
prescaled).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from shoal.modelparallel.torch.nn.module import DistributedModule
from shoal.modelparallel.torch.tensorparallel import collectives as tp

_MAX_NORM = ("Passing max_norm is not supported for DistributedEmbedding module. Please use "
             "torch.nn.Embedding instead.")
_WEIGHT = "Passing not None _weight is not supported with DistributedEmbedding"


class DistributedEmbedding(DistributedModule):
    def __init__(self, num_embeddings: int, embedding_dim: int, padding_idx: int | None = None,
                 max_norm: float | None = None, norm_type: float = 2.0,
                 scale_grad_by_freq: bool = False, sparse: bool = False, _weight=None,
                 initializer_range: float = 0.02, _skip_allgather: bool = False,
                 _skip_scatter_and_merge: bool = False, vocab_parallel: bool = False,
                 _output_full_batch: bool = False, **_ignored) -> None:
        super().__init__()
        if max_norm is not None:
            raise ValueError(_MAX_NORM)
        if _weight is not None:
            raise ValueError(_WEIGHT)
        if sparse:
            raise ValueError("sparse gradients are not supported by DistributedEmbedding")
        self.num_embeddings, self.embedding_dim = int(num_embeddings), int(embedding_dim)
        if padding_idx is not None and padding_idx < 0:
            padding_idx += self.num_embeddings
        self.padding_idx = padding_idx
        self.scale_grad_by_freq = scale_grad_by_freq
        self.vocab_parallel = bool(vocab_parallel)
        self.initializer_range = initializer_range
        if self.vocab_parallel:
            self.weight = torch.nn.Parameter(
                torch.empty(self.local_channels(self.num_embeddings), self.embedding_dim))
            self.distribute("weight", 0, self.num_embeddings)
        else:
            self.weight = torch.nn.Parameter(
                torch.empty(self.num_embeddings, self.local_channels(self.embedding_dim)))
            self.distribute("weight", 1, self.embedding_dim)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """nn.Embedding's N(0, 1) (padding row zero), this rank's part of it."""
        def init(w):
            torch.nn.init.normal_(w)
            if self.padding_idx is not None:
                w[self.padding_idx].zero_()
        self.init_shard(self.weight, "weight", (self.num_embeddings, self.embedding_dim), init)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if self.tp_size() == 1:
            return F.embedding(ids, self.weight, self.padding_idx, None, 2.0,
                               self.scale_grad_by_freq)
        if self.vocab_parallel:
            return self._vocab_parallel(ids)
        if self.prescaled_batch():
            return tp.gather(self._lookup(ids, self.padding_idx), -1,
                             self._smp_splits["weight"].sizes)
        batch = ids.shape[0]
        everyone = tp.gather(ids, 0)
        columns = self._lookup(everyone, self.padding_idx)
        return tp.all_to_all(columns, split_dim=0, cat_dim=-1, split_sizes=[batch] * self.tp_size(),
                             cat_sizes=self._smp_splits["weight"].sizes)

    def _lookup(self, ids: torch.Tensor, padding_idx) -> torch.Tensor:
        return F.embedding(ids, self.weight, padding_idx, None, 2.0, self.scale_grad_by_freq)

    def _vocab_parallel(self, ids: torch.Tensor) -> torch.Tensor:
        split = self._smp_splits["weight"]
        first = split.offset(self.tp_rank())
        last = first + split.sizes[self.tp_rank()]
        prescaled = self.prescaled_batch()
        everyone = ids if prescaled else tp.gather(ids, 0)
        outside = (everyone < first) | (everyone >= last)
        local = (everyone - first).masked_fill(outside, 0)
        padding = None
        if self.padding_idx is not None and first <= self.padding_idx < last:
            padding = self.padding_idx - first
        rows = self._lookup(local, padding).masked_fill(outside.unsqueeze(-1), 0.0)
        if prescaled:
            return tp.reduce_from(rows)
        return tp.reduce_scatter(rows, 0, [ids.shape[0]] * self.tp_size())

    def extra_repr(self) -> str:
        return (f"{self.num_embeddings}, {self.embedding_dim}, tp_size={self.tp_size()}, "
                f"vocab_parallel={self.vocab_parallel}")
