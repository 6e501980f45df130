"""Gradient bucket planning for Shoal's DDP wrapper (pure: sizes in, index lists out).

Parameters are bucketed in reverse registration order (the order backward usually produces
their gradients), one dtype per bucket, each bucket up to a byte cap, so that the first
buckets are ready, and reduced, while backward still runs for the earlier layers.
"""

from __future__ import annotations

from collections.abc import Sequence

DEFAULT_BUCKET_CAP_MB = 25


def bucket_cap_bytes(bucket_cap_mb: float | None) -> int:
    """The byte cap for a ``bucket_cap_mb`` argument (``None`` means the 25 MB default)."""
    megabytes = DEFAULT_BUCKET_CAP_MB if bucket_cap_mb is None else bucket_cap_mb
    if megabytes <= 0:
        raise ValueError(f"'bucket_cap_mb' must be > 0 (got {bucket_cap_mb})")
    return max(1, int(megabytes * 1024 * 1024))


def plan_buckets(
    nbytes: Sequence[int], dtypes: Sequence[object], cap_bytes: int
) -> list[list[int]]:
    """Indices of the parameters in each bucket, buckets in launch order.

    Walks the parameters from last to first; a bucket closes when adding the next
    parameter would pass ``cap_bytes`` or when the dtype changes. A parameter larger than
    the cap gets a bucket of its own.
    """
    if len(nbytes) != len(dtypes):
        raise ValueError("nbytes and dtypes must have the same length")
    buckets: list[list[int]] = []
    current: list[int] = []
    current_bytes = 0
    current_dtype = None
    for index in reversed(range(len(nbytes))):
        size, dtype = nbytes[index], dtypes[index]
        full = current and current_bytes + size > cap_bytes
        if current and (full or dtype != current_dtype):
            buckets.append(current)
            current, current_bytes = [], 0
        current.append(index)
        current_bytes += size
        current_dtype = dtype
    if current:
        buckets.append(current)
    return buckets
