"""``smp.nn.DistributedModule``: the base of every tensor-parallel module.

A distributed module holds this rank's shard of each split parameter and says, per
parameter, how the full tensor is cut (``distribute``): the axis and every rank's extent on
it. ``DistributedModel`` reads those marks to gather full tensors into ``state_dict()``, to
fill shards from a full ``load_state_dict``, to broadcast and reduce each parameter over the
right group, and to answer ``is_distributed_parameter``.

Every parameter of a distributed module sees the TP group's whole batch (unless the batch
is prescaled): SMP calls them scaled-batch parameters; their gradients are reduced over the
reduced-data-parallel group instead of the data-parallel one.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs
import torch
from shoal.modelparallel.torch import state as _state
from shoal.modelparallel.torch.tensorparallel import collectives
from shoal.modelparallel.torch.tensorparallel.collectives import local_offset, local_sizes


@attrs.frozen
class Split:
    """How a parameter is cut: on ``axis``, rank r holding ``sizes[r]`` entries of it."""

    axis: int
    sizes: tuple[int, ...]

    @property
    def total(self) -> int:
        return sum(self.sizes)

    def offset(self, rank: int) -> int:
        return sum(self.sizes[:rank])

    def shard(self, full: torch.Tensor, rank: int) -> torch.Tensor:
        """Rank ``rank``'s part of the full tensor."""
        return full.narrow(self.axis, self.offset(rank), self.sizes[rank])


class DistributedModule(torch.nn.Module):
    """Base of the modules that tensor parallelism puts in place of supported ones.

    Subclasses call :meth:`distribute` for each split parameter and may override
    :meth:`can_distribute` (a classmethod on the constructor's arguments: False keeps the
    original module).
    """

    def __init__(self) -> None:
        super().__init__()
        self._smp_splits: dict[str, Split] = {}

    @classmethod
    def can_distribute(cls, *args, **kwargs) -> bool:  # noqa: ARG003 - per subclass
        return True

    # -- the group ---------------------------------------------------------------------
    tp_rank = staticmethod(collectives.tp_rank)
    tp_size = staticmethod(collectives.tp_size)

    @staticmethod
    def prescaled_batch() -> bool:
        st = _state.current()
        return bool(st is not None and st.cfg.prescaled_batch)

    def local_channels(self, total: int) -> int:
        """This rank's share of ``total`` channels (the first ``total % tp`` get one more)."""
        return local_sizes(total, self.tp_size())[self.tp_rank()]

    def channel_offset(self, total: int) -> int:
        return local_offset(total, self.tp_rank(), self.tp_size())

    # -- parameters ----------------------------------------------------------------------
    def distribute(self, name: str, axis: int, total: int,
                   sizes: Sequence[int] | None = None) -> None:
        """Marks parameter (or buffer) ``name`` of this module as split on ``axis`` over
        the TP group, ``total`` entries in all (default split: SMP's)."""
        sizes = tuple(sizes) if sizes is not None else tuple(local_sizes(total, self.tp_size()))
        if sum(sizes) != total:
            raise ValueError(f"the sizes {sizes} of {name!r} do not add up to {total}")
        self._smp_splits[name] = Split(axis, sizes)

    def split_of(self, name: str) -> Split | None:
        return self._smp_splits.get(name)

    def init_shard(self, param: torch.Tensor, name: str, full_shape: Sequence[int], init) -> None:
        """Fills ``param`` with this rank's part of a full tensor of ``full_shape`` initialised
        by ``init`` (so each shard has the full layer's distribution: fan-in and fan-out are
        the full layer's)."""
        full = torch.empty(tuple(full_shape), dtype=param.dtype)
        init(full)
        split = self._smp_splits.get(name)
        with torch.no_grad():
            param.copy_(split.shard(full, self.tp_rank()) if split is not None else full)

    def load_full(self, name: str, full: torch.Tensor) -> None:
        """Copies this rank's part of ``full`` into parameter or buffer ``name``."""
        target = getattr(self, name)
        split = self._smp_splits.get(name)
        part = split.shard(full, self.tp_rank()) if split is not None else full
        with torch.no_grad():
            target.copy_(part)
