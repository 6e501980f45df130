"""Python API of Shoal's compiled collective core.

The core (``libshoal_core``, C++) keeps one communicator per process; this
module is a thin layer over its binding ``shoal.dataparallel._core`` that maps
numpy dtypes and op names, keeps buffers alive for asynchronous work and
raises Shoal's errors (``CollectiveTimeoutError``, ``PeerLostError``).

    from shoal.dataparallel import core
    comm = core.init()                 # from the rank environment; idempotent
    core.allreduce(grads, op="average")
    handle = core.allreduce_async(other); ...; handle.wait()
    pair = core.new_group([0, 1])      # every rank calls; None where not a member
    if pair is not None:
        core.allreduce(grads, group=pair)

bfloat16 arrays are ``ml_dtypes.bfloat16`` arrays, or uint16 arrays holding the
bits with ``dtype="bfloat16"``.
"""

from __future__ import annotations

import atexit
import os
from typing import Any

import attrs
import numpy as np
from shoal.errors import ValidationError

try:  # the binding is compiled by the package build
    from shoal.dataparallel import _core
except ImportError as exc:  # pragma: no cover - only without a build
    _core = None
    _IMPORT_ERROR = exc

# Codes of shoal::DType and shoal::ReduceOp (csrc/shoal/core.h).
DTYPES = {"float32": 0, "float64": 1, "float16": 2, "bfloat16": 3, "int32": 4, "int64": 5}
OPS = {"sum": 0, "average": 1, "avg": 1, "mean": 1, "min": 2, "max": 3, "product": 4, "prod": 4}
_BYTES = 6  # shoal::DType::UInt8, for raw payloads
# By dtype object: `dtype.name` builds a string on every call, a microsecond per collective.
_NATIVE = {np.dtype(name): code for name, code in DTYPES.items() if name != "bfloat16"}


@attrs.frozen
class Communicator:
    """Where this process sits in the job (see ``init``)."""

    rank: int
    size: int
    local_rank: int
    local_size: int
    host_index: int
    num_hosts: int
    host: str
    # The rank in the job (a group's rank is in the group): the world's own rank by default.
    global_rank: int = attrs.field(default=attrs.Factory(lambda self: self.rank, takes_self=True))


@attrs.define
class Handle:
    """An asynchronous allreduce; ``wait()`` returns the reduced array."""

    _handle: Any
    array: np.ndarray

    def test(self) -> bool:
        return self._handle.test()

    def wait(self) -> np.ndarray:
        self._handle.wait()
        return self.array

    @property
    def source(self) -> int:
        """A completed receive's source rank (in its group)."""
        return self._handle.source()

    def cancel(self) -> bool:
        """Withdraws a receive no message has matched yet: its ``wait()`` then raises
        ``ReceiveCancelledError`` and True is returned; False for anything else (a send,
        a collective, a receive already matched), which completes as it would have."""
        return self._handle.cancel()


@attrs.define(eq=False)
class Group:
    """A communicator over some ranks (see ``new_group``); pass it as ``group=``."""

    _group: Any = attrs.field(repr=False)
    ranks: tuple[int, ...]

    @property
    def topology(self) -> Communicator:
        return Communicator(**self._group.topology())

    @property
    def rank(self) -> int:
        return self.topology.rank

    @property
    def size(self) -> int:
        return len(self.ranks)

    def destroy(self) -> None:
        """Releases the group's memory, sockets and thread (local, not a collective)."""
        self._group.destroy()


def _binding():
    if _core is None:
        raise ImportError(f"the collective core is not built: {_IMPORT_ERROR}")
    return _core


def include_dir() -> str:
    """The directory to put on the include path for ``#include "shoal/core.h"``."""
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "csrc")


def library_path() -> str:
    """Absolute path of the core shared library that framework glue links."""
    import sysconfig

    name = "libshoal_core" + sysconfig.get_config_var("EXT_SUFFIX")
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), name)


def link_flags() -> list[str]:
    """Linker flags for glue code: the core by file name, found at run time by rpath."""
    path = library_path()
    directory = os.path.dirname(path)
    return [f"-L{directory}", f"-l:{os.path.basename(path)}", f"-Wl,-rpath,{directory}"]


def init() -> Communicator:
    """Bootstraps from the rank environment (idempotent) and returns the topology."""
    topo = _binding().init()
    return Communicator(**topo)


def is_initialized() -> bool:
    return _core is not None and _core.is_initialized()


def shutdown() -> None:
    """Drains queued work and releases the communicator (local, not a collective)."""
    if _core is not None:
        _core.shutdown()


def new_group(ranks, group: Group | None = None) -> Group | None:
    """A communicator over ``ranks`` (ranks of ``group``, default the world), in their
    order. Every rank of the parent calls it with the same ranks; the others get None."""
    ranks = tuple(int(r) for r in ranks)
    made = _binding().new_group(_target(group), list(ranks))
    return None if made is None else Group(made, ranks)


def _target(group: Group | None):
    return _binding().world() if group is None else group._group


def _dtype_code(array: np.ndarray, dtype: str | None) -> int:
    if dtype is None and array.dtype in _NATIVE:
        return _NATIVE[array.dtype]
    if not array.dtype.isnative:
        raise ValidationError(f"the array must be in native byte order (got {array.dtype.str})")
    name = dtype or array.dtype.name
    if name == "bfloat16" and array.dtype.name not in ("bfloat16", "uint16", "int16"):
        raise ValidationError(f"'dtype' bfloat16 needs a uint16 array of bits (got {array.dtype})")
    if dtype and name != "bfloat16" and name != array.dtype.name:
        raise ValidationError(f"'dtype' {name!r} does not match the array's {array.dtype.name}")
    if name not in DTYPES:
        raise ValidationError(f"'dtype' must be one of {sorted(DTYPES)} (got {name!r})")
    return DTYPES[name]


def _op_code(op: str) -> int:
    if op not in OPS:
        raise ValidationError(f"'op' must be one of {sorted(set(OPS))} (got {op!r})")
    return OPS[op]


def _checked(array: Any) -> np.ndarray:
    if not isinstance(array, np.ndarray):
        raise ValidationError(f"expected a numpy array (got {type(array).__name__})")
    if not array.flags.c_contiguous or not array.flags.writeable:
        raise ValidationError("the array must be C-contiguous and writeable")
    return array


def _raw(array: np.ndarray) -> np.ndarray:
    # Extension dtypes (ml_dtypes) do not export a buffer format; their bytes do.
    return array.reshape(-1).view(np.uint8)


# Every collective runs on ``group`` (a ``Group`` from ``new_group``), default the world;
# ranks and roots are ranks in that communicator.


def allreduce(
    array: np.ndarray, op: str = "sum", dtype: str | None = None, group: Group | None = None
) -> np.ndarray:
    """Reduces ``array`` in place across the group's ranks and returns it."""
    array = _checked(array)
    _binding().allreduce(_target(group), _raw(array), _dtype_code(array, dtype), _op_code(op))
    return array


def allreduce_async(
    array: np.ndarray, op: str = "sum", dtype: str | None = None, group: Group | None = None
) -> Handle:
    """Queues an in-place allreduce (fused with its neighbours); ``.wait()`` on the handle."""
    array = _checked(array)
    code = _dtype_code(array, dtype)
    handle = _binding().allreduce_async(_target(group), _raw(array), code, _op_code(op))
    return Handle(handle, array)


def broadcast(array: np.ndarray, root: int = 0, group: Group | None = None) -> np.ndarray:
    """Every rank's ``array`` becomes root's, in place."""
    array = _checked(array)
    _binding().broadcast(_target(group), _raw(array), int(root))
    return array


def allgather(array: np.ndarray, group: Group | None = None,
              out: np.ndarray | None = None) -> np.ndarray:
    """An array of shape ``(size, *array.shape)``: row r is rank r's array. ``out``, if
    given, receives it (C-contiguous, that shape and dtype); ``array`` may be this rank's
    own row of it, which then is not copied: the gather needs no second buffer."""
    array = np.ascontiguousarray(array)
    if not is_initialized():
        raise ValidationError("shoal collectives are not initialized: call init() first")
    size = init().size if group is None else group.size
    shape = (size, *array.shape)
    if out is None:
        out = np.empty(shape, dtype=array.dtype)
    elif out.shape != shape or out.dtype != array.dtype or not out.flags.c_contiguous:
        raise ValidationError(f"allgather: 'out' must be a C-contiguous {array.dtype} array of "
                              f"shape {shape} (got {out.dtype} {out.shape})")
    _binding().allgather(_target(group), _raw(array), _raw(out))
    return out


def reduce(
    array: np.ndarray,
    op: str = "sum",
    root: int = 0,
    dtype: str | None = None,
    group: Group | None = None,
) -> np.ndarray:
    """Reduces into root's ``array`` in place; the others' arrays are unchanged."""
    array = _checked(array)
    code = _dtype_code(array, dtype)
    _binding().reduce(_target(group), _raw(array), code, _op_code(op), int(root))
    return array


def barrier(group: Group | None = None) -> None:
    _binding().barrier(_target(group))


def flush(group: Group | None = None) -> None:
    """Starts the queued allreduces now instead of waiting for a full fusion buffer."""
    _binding().flush(_target(group))


def reduce_scatter(
    array: np.ndarray, op: str = "sum", dtype: str | None = None, group: Group | None = None
) -> np.ndarray:
    """Rank r's block (``array`` split in size equal blocks) reduced across the group."""
    array = _checked(array)
    size = init().size if group is None else group.size
    if array.shape[0] % size:
        raise ValidationError(f"reduce_scatter: the first dimension ({array.shape[0]}) must divide by {size}")
    out = np.empty((array.shape[0] // size, *array.shape[1:]), dtype=array.dtype)
    code = _dtype_code(array, dtype)
    _binding().reduce_scatter(_target(group), _raw(array), _raw(out), code, _op_code(op))
    return out


def alltoall(array: np.ndarray, send_splits=None, recv_splits=None, group: Group | None = None):
    """Rows of ``array`` to every rank (``send_splits[r]`` rows to rank r; default equal
    parts); returns the rows received, in rank order (``recv_splits[r]`` from rank r)."""
    array = np.ascontiguousarray(array)
    size = init().size if group is None else group.size
    row = array[0:1].nbytes if array.shape[0] else array.itemsize * int(np.prod(array.shape[1:]))
    sends = list(send_splits) if send_splits is not None else [array.shape[0] // size] * size
    recvs = list(recv_splits) if recv_splits is not None else sends
    out = np.empty((sum(recvs), *array.shape[1:]), dtype=array.dtype)
    sc = [n * row for n in sends]
    rc = [n * row for n in recvs]
    offsets = lambda counts: [sum(counts[:r]) for r in range(len(counts))]  # noqa: E731
    _binding().alltoall(_target(group), _raw(array), sc, offsets(sc), _raw(out), rc, offsets(rc))
    return out


def gather(array: np.ndarray, root: int = 0, group: Group | None = None) -> np.ndarray | None:
    """Root gets ``(size, *array.shape)``: row r is rank r's array; the others get None."""
    array = np.ascontiguousarray(array)
    target = _target(group)
    topo = target.topology()
    is_root = topo["rank"] == root
    out = np.empty((topo["size"] if is_root else 0, *array.shape), dtype=array.dtype)
    _binding().gather(target, _raw(array), _raw(out), int(root))
    return out if is_root else None


def scatter(array: np.ndarray | None, out: np.ndarray, root: int = 0, group: Group | None = None) -> np.ndarray:
    """Root's ``array`` (``size`` rows of ``out``'s shape): rank r receives row r in ``out``."""
    out = _checked(out)
    send = np.ascontiguousarray(array) if array is not None else np.empty(0, dtype=out.dtype)
    _binding().scatter(_target(group), _raw(send), _raw(out), int(root))
    return out


# Point-to-point: ``dst``/``src`` are ranks of ``group`` (default the world); ``src=None``
# receives from any rank. Per source and tag, messages match receives in issue order.


def isend(array: np.ndarray, dst: int, tag: int = 0, group: Group | None = None) -> Handle:
    """Starts sending ``array``'s bytes; it must stay untouched until ``wait()``."""
    array = _checked(array)
    return Handle(_binding().send_async(_target(group), _raw(array), int(dst), int(tag)), array)


def irecv(array: np.ndarray, src: int | None = None, tag: int = 0, group: Group | None = None) -> Handle:
    """Starts receiving into ``array`` (same byte size as the message)."""
    array = _checked(array)
    peer = -1 if src is None else int(src)
    return Handle(_binding().recv_async(_target(group), _raw(array), peer, int(tag)), array)


def send(array: np.ndarray, dst: int, tag: int = 0, group: Group | None = None) -> None:
    isend(array, dst, tag, group).wait()


def recv(array: np.ndarray, src: int | None = None, tag: int = 0, group: Group | None = None) -> int:
    """Receives into ``array``; returns the source rank."""
    handle = irecv(array, src, tag, group)
    handle.wait()
    return handle.source


atexit.register(shutdown)
