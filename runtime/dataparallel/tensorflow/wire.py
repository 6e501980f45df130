"""The numpy side of the TensorFlow collectives: what runs inside ``tf.numpy_function``.

Each function takes the arrays TensorFlow hands over (read-only views of tensor memory),
works on private copies through the collective core and returns new arrays of the same
dtypes and shapes. None of them knows TensorFlow. ``group``: a ``core.Group`` (None: the
world).
"""

from __future__ import annotations

import numpy as np
from shoal.dataparallel import core


def _writable(array) -> np.ndarray:
    return np.array(array, copy=True, order="C")


def reduce_arrays(arrays, op: str, bucket_bytes: int | None = None, group=None) -> list[np.ndarray]:
    """Reduces every array across ranks with one fused pass of the core's async allreduce.

    All arrays are queued before any wait, so many small gradients share a few fused
    collectives. ``bucket_bytes`` starts the queued work whenever that many bytes are
    pending (a smaller fusion buffer than the core's own).
    """
    buffers = [_writable(a) for a in arrays]
    handles, pending = [], 0
    for buffer in buffers:
        handles.append(core.allreduce_async(buffer, op=op, group=group))
        pending += buffer.nbytes
        if bucket_bytes is not None and pending >= bucket_bytes:
            core.flush(group=group)
            pending = 0
    for handle in handles:
        handle.wait()
    return buffers


def broadcast_arrays(arrays, root: int, group=None) -> list[np.ndarray]:
    """Every rank's arrays become root's, packed into one byte buffer so one collective moves them all."""
    buffers = [np.asarray(a, order="C") for a in arrays]  # ascontiguousarray would make 0-d arrays 1-d
    sizes = [b.nbytes for b in buffers]
    packed = np.empty(sum(sizes), dtype=np.uint8)
    offset = 0
    for buffer, nbytes in zip(buffers, sizes):
        packed[offset:offset + nbytes] = buffer.reshape(-1).view(np.uint8)
        offset += nbytes
    if packed.size:
        core.broadcast(packed, root=root, group=group)
    out, offset = [], 0
    for buffer, nbytes in zip(buffers, sizes):
        chunk = packed[offset:offset + nbytes].copy()  # aligned, owned memory for TensorFlow
        out.append(chunk.view(buffer.dtype).reshape(buffer.shape))
        offset += nbytes
    return out


def gather_rows(array, group=None) -> np.ndarray:
    """Concatenates every rank's array along the first axis (row counts may differ by rank)."""
    array = np.ascontiguousarray(array)
    if array.ndim == 0:
        array = array.reshape(1)
    counts = core.allgather(np.array([array.shape[0]], dtype=np.int64), group=group).reshape(-1)
    longest = int(counts.max())
    padded = np.zeros((longest, *array.shape[1:]), dtype=array.dtype)
    padded[: array.shape[0]] = array
    gathered = core.allgather(padded, group=group)
    return np.concatenate([gathered[r, : int(n)] for r, n in enumerate(counts)], axis=0)
