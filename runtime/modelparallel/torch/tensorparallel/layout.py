"""Where a tensor-parallel model's parameters live: which are split, which see the TP
group's whole batch, and how full state dicts are gathered from shards and cut back.

Built once from the model after replacement. Parameters of distributed modules are
*scaled-batch* parameters (their gradients cover the TP group's batch: reduced over the
reduced-data-parallel group, and divided by the TP degree unless the batch is prescaled);
the split ones among them are *distributed*. Every other parameter is replicated over the
data-parallel group (TP and RDP ranks together).
"""

from __future__ import annotations

from typing import Any

import torch
from shoal.modelparallel.topology import CommGroup
from shoal.modelparallel.torch.nn.module import DistributedModule, Split
from shoal.modelparallel.torch.tensorparallel import collectives as tp


class TensorLayout:
    def __init__(self, root: torch.nn.Module) -> None:
        self.splits: dict[str, Split] = {}  # state-dict key -> split
        self.modules: list[tuple[str, DistributedModule]] = []
        self.scaled_batch: set[int] = set()  # ids of parameters and buffers
        self.distributed: set[int] = set()
        for name, module in root.named_modules(remove_duplicate=False):
            if not isinstance(module, DistributedModule):
                continue
            if not any(m is module for _, m in self.modules):
                self.modules.append((name, module))
            for sub_name, sub in module.named_modules():
                tensors = list(sub.named_parameters(recurse=False)) + \
                    list(sub.named_buffers(recurse=False))
                for leaf, tensor in tensors:
                    if tensor is None:
                        continue
                    self.scaled_batch.add(id(tensor))
                    split = sub.split_of(leaf) if isinstance(sub, DistributedModule) else None
                    if split is not None:
                        self.distributed.add(id(tensor))
                        key = ".".join(p for p in (name, sub_name, leaf) if p)
                        self.splits[key] = split

    # -- gradients -------------------------------------------------------------------------
    def scale_scaled_batch_gradients(self, params, tp_size: int) -> list:
        """Each scaled-batch gradient divided by the TP degree as it is produced (before it
        is accumulated: gradient accumulation stays exact). Returns the hook handles."""
        factor = 1.0 / tp_size
        return [p.register_hook(lambda g: g * factor) for p in params
                if id(p) in self.scaled_batch and p.requires_grad]

    # -- state dicts -------------------------------------------------------------------------
    def gather_full(self, local: dict[str, Any]) -> dict[str, Any]:
        """This pipeline stage's entries with every split tensor gathered whole and every
        entry held by some TP ranks only (the bias of tp_rank 0) present (call on every rank
        of the TP group, with the same keys)."""
        from shoal.modelparallel.torch import comm

        full: dict[str, Any] = {}
        for key in sorted(local):
            value = local[key]
            split = self.splits.get(key)
            if split is None or not isinstance(value, torch.Tensor):
                full[key] = value
                continue
            shapes = []
            for size in split.sizes:
                shape = list(value.shape)
                shape[split.axis] = size
                shapes.append(torch.Size(shape))
            parts = tp.all_gather_objects_free(value.contiguous(), shapes)
            full[key] = torch.cat(parts, dim=split.axis)
        if tp.tp_size() > 1:
            held = comm.allgather(sorted(k for k in full if k not in self.splits),
                                  CommGroup.TP_GROUP)
            everywhere = set.intersection(*(set(h) for h in held))
            extra = {k: v for k, v in full.items() if k not in self.splits and k not in everywhere}
            for part in comm.allgather(extra, CommGroup.TP_GROUP):
                for key, value in part.items():
                    full.setdefault(key, value)
        return full

    def shard(self, key: str, value: torch.Tensor, rank: int) -> torch.Tensor:
        """This rank's part of full entry ``key``."""
        split = self.splits.get(key)
        return split.shard(value, rank) if split is not None else value
