"""Tensor fusion plan (pure): which tensors share one flat buffer on the wire.

Reducing a flat buffer per dtype costs one collective and one host round trip, where one
per tensor costs a round trip each (TensorFlow hands every tensor to numpy separately).
Tensors are grouped by dtype in order of first appearance; a group splits into buckets of
at most ``cap_bytes`` (a larger tensor gets a bucket of its own).
"""

from __future__ import annotations

from collections.abc import Sequence


def plan_buckets(dtypes: Sequence[str], nbytes: Sequence[int], cap_bytes: int | None) -> list[list[int]]:
    """Indices of the tensors in each bucket; buckets of one dtype keep the tensors' order."""
    if len(dtypes) != len(nbytes):
        raise ValueError("dtypes and nbytes must have the same length")
    by_dtype: dict[str, list[int]] = {}
    for index, dtype in enumerate(dtypes):
        by_dtype.setdefault(dtype, []).append(index)
    buckets: list[list[int]] = []
    for indices in by_dtype.values():
        current: list[int] = []
        filled = 0
        for index in indices:
            if current and cap_bytes is not None and filled + nbytes[index] > cap_bytes:
                buckets.append(current)
                current, filled = [], 0
            current.append(index)
            filled += nbytes[index]
        buckets.append(current)
    return buckets
