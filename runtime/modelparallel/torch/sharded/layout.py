"""Where each parameter's elements live under sharded data parallelism (pure arithmetic).

A parameter of ``n`` elements is cut into ``parts`` chunks of ``ceil(n / parts)``
elements, the last one padded with zeros; shard rank ``r`` holds chunk ``r`` (DeepSpeed's
``p.ds_tensor``, ``ds_numel`` elements long). An optimizer group's chunks, in the group's
order, make its flat partition (``fp32_partitioned_groups_flat[i]``): a parameter's chunk
starts where the ``ds_numel`` of those before it add up to, which is how SMP's scripts
find it (``build_param_id_to_offset``). The zero padding keeps norms taken over a flat
partition equal to the parameters' norms.
"""

from __future__ import annotations

import torch


def chunk_numel(numel: int, parts: int) -> int:
    """Elements of each of the ``parts`` chunks of a tensor of ``numel`` elements."""
    return -(-numel // parts)


def chunk_of(flat: torch.Tensor, parts: int, rank: int) -> torch.Tensor:
    """Chunk ``rank`` of the 1-D ``flat``, zero-padded, in new storage."""
    chunk = chunk_numel(flat.numel(), parts)
    out = flat.new_zeros(chunk)
    start = min(rank * chunk, flat.numel())
    end = min(start + chunk, flat.numel())
    out[: end - start] = flat[start:end]
    return out


def padded_rows(flat: torch.Tensor, parts: int) -> torch.Tensor:
    """``flat`` as ``(parts, chunk)`` rows, row ``r`` being chunk ``r`` (zero-padded)."""
    chunk = chunk_numel(flat.numel(), parts)
    if flat.numel() == chunk * parts:
        return flat.reshape(parts, chunk)
    out = flat.new_zeros(parts * chunk)
    out[: flat.numel()] = flat
    return out.reshape(parts, chunk)


def offsets(sizes) -> list[int]:
    """Where each of ``sizes`` starts when they are laid end to end."""
    out, at = [], 0
    for size in sizes:
        out.append(at)
        at += size
    return out


def unpad(rows: torch.Tensor, numel: int, shape) -> torch.Tensor:
    """The ``(parts, chunk)`` rows of a gathered tensor back in its shape (a view when no
    padding was added)."""
    return rows.reshape(-1)[:numel].view(shape)
