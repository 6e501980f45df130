"""Messages between the ranks of a pipeline: one frame, then what did not fit in it.

Every message goes over the pipeline group's point-to-point transfers in Shoal's core
(shared memory inside a host, the host-to-host connections across hosts). Its first
transfer is a fixed-size frame: a header (kind, metadata length, tensor count), the pickled
metadata with the tensors' specs, and, in order, each tensor whose bytes still fit. Metadata
too long for the frame follows in a transfer of its own, and so does each tensor that did
not fit: up to ``CHUNKED_BYTES`` in pieces of at most one frame's size, larger ones in one
transfer straight from (and into) the tensor's own storage. The frame and the pieces are
the core's inline messages, whose sends complete as soon as they are posted: the sender
goes on without waiting for the receiver, where a transfer read from its memory would hold
it until the receiving thread got to it. Per source and tag the core matches in issue
order, so one lock around each message's sends keeps a message's parts together; the
receiving side has one thread (the ``Mailbox``'s) that takes a frame from any source and
then the rest from that source.
"""

from __future__ import annotations

import pickle
import threading
from collections.abc import Callable
from typing import Any

import attrs
import numpy as np
import torch
from shoal.dataparallel import core
from shoal.errors import ReceiveCancelledError

# Tags of the pipeline's transfers; the object collectives (comm.py) use their own.
TAG_FRAME, TAG_META, TAG_DATA = 7100, 7101, 7102
# The core's inline message (one mailbox slot; its send completes once posted): a frame
# holds a request's metadata and small tensors, and larger tensors up to CHUNKED_BYTES
# leave in pieces of this size.
FRAME_BYTES = 16384
CHUNKED_BYTES = 4 * FRAME_BYTES
_HEADER = np.dtype(np.int64).itemsize * 4  # kind, metadata length, tensor count, reserved


@attrs.frozen
class Pending:
    """A posted frame receive: its handle and the buffer it fills."""

    handle: core.Handle
    frame: np.ndarray


class Message:
    __slots__ = ("kind", "source", "meta", "tensors", "requires_grad")

    def __init__(self, kind: int, source: int, meta: Any, tensors: list[torch.Tensor],
                 requires_grad: tuple[bool, ...] = ()) -> None:
        self.kind = kind
        self.source = source  # rank in the pipeline group
        self.meta = meta
        self.tensors = tensors
        self.requires_grad = requires_grad  # each tensor's flag on the sender


def _bytes_of(tensor: torch.Tensor) -> np.ndarray:
    """The bytes of a contiguous tensor (no grad) as a writeable uint8 array sharing its
    storage: through numpy where it has the dtype (one torch call: every torch call lets
    the rank's other threads take the GIL), else through a uint8 view."""
    if tensor.dtype in _NUMPY_DTYPES:
        return tensor.numpy().reshape(-1).view(np.uint8)
    return tensor.view(-1).view(torch.uint8).numpy()


def _payload(tensor: torch.Tensor) -> np.ndarray:
    """A tensor's bytes to send (a contiguous copy of a non-contiguous one)."""
    tensor = tensor.detach()
    if tensor.is_complex():
        tensor = tensor.resolve_conj()
    if tensor.dtype in _NUMPY_DTYPES:
        return np.ascontiguousarray(tensor.numpy()).reshape(-1).view(np.uint8)
    return _bytes_of(tensor.contiguous())


# Tensors' dtypes travel as their index here (a torch.dtype pickles by name).
_DTYPES = tuple(sorted({d for d in vars(torch).values() if isinstance(d, torch.dtype)}, key=str))
_DTYPE_CODE = {d: i for i, d in enumerate(_DTYPES)}
_NUMPY_DTYPES = frozenset({torch.float32, torch.float64, torch.float16, torch.int64,
                           torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool,
                           torch.complex64, torch.complex128})


def _layout(meta_bytes: int, tensor_bytes: list[int]) -> tuple[bool, list[int | None]]:
    """Whether the metadata rides in the frame, and each tensor's offset in the frame
    (None: a transfer of its own). Sender and receiver both decide by this rule."""
    used = _HEADER
    meta_inline = used + meta_bytes <= FRAME_BYTES
    if meta_inline:
        used += meta_bytes
    offsets: list[int | None] = []
    for n in tensor_bytes:
        if n and used + n <= FRAME_BYTES:
            offsets.append(used)
            used += n
        else:
            offsets.append(None)
    return meta_inline, offsets


def _pieces(data: np.ndarray) -> list[np.ndarray]:
    """A tensor's bytes outside the frame, as the transfers that carry them."""
    n = len(data)
    if n > CHUNKED_BYTES:
        return [data]
    return [data[i:i + FRAME_BYTES] for i in range(0, n, FRAME_BYTES)]


class Transport:
    """Sends messages to, and receives them from, the other ranks of one core group."""

    def __init__(self, group: core.Group | None) -> None:
        self.group = group
        self._send_lock = threading.Lock()

    def send_tensors(self, dst: int, kind: int, meta: Any, tensors: list[torch.Tensor]) -> None:
        """Sends ``meta`` with ``tensors``; the receiver rebuilds them from their specs."""
        # requires_grad from the caller's tensors: the payload is detached.
        specs = [(tuple(t.shape), _DTYPE_CODE[t.dtype], t.requires_grad) for t in tensors]
        payload = [_payload(t) for t in tensors]
        blob = pickle.dumps((meta, specs), protocol=pickle.HIGHEST_PROTOCOL)
        sizes = [data.nbytes for data in payload]
        meta_inline, offsets = _layout(len(blob), sizes)
        frame = np.empty(FRAME_BYTES, dtype=np.uint8)
        frame[:_HEADER].view(np.int64)[:] = (kind, len(blob), len(payload), 0)
        rest: list[tuple[int, np.ndarray]] = []
        if meta_inline:
            frame[_HEADER:_HEADER + len(blob)] = np.frombuffer(blob, np.uint8)
        else:
            rest.append((TAG_META, np.frombuffer(blob, np.uint8).copy()))
        for data, size, offset in zip(payload, sizes, offsets):
            if offset is not None:
                frame[offset:offset + size] = data
            elif size:
                rest += [(TAG_DATA, piece) for piece in _pieces(data)]
        with self._send_lock:  # a message's parts leave in order, unmixed with another's
            handles = [core.isend(frame, dst, TAG_FRAME, self.group)]
            handles += [core.isend(data, dst, tag, self.group) for tag, data in rest]
        for handle in handles:
            handle.wait()

    def post_receive(self) -> Pending:
        """Posts the receive of the next message's frame, from any rank (one receiving
        thread only); ``receive`` completes it. Until a message matches it, the posted
        receive can be withdrawn (``Pending.handle.cancel()``)."""
        frame = np.empty(FRAME_BYTES, dtype=np.uint8)
        return Pending(core.irecv(frame, None, TAG_FRAME, self.group), frame)

    def receive(self, pending: Pending) -> Message:
        """The message whose frame ``pending`` receives (blocks until it is whole)."""
        frame = pending.frame
        pending.handle.wait()
        source = pending.handle.source
        kind, size, count = (int(v) for v in frame[:_HEADER].view(np.int64)[:3])
        if _HEADER + size <= FRAME_BYTES:
            blob = frame[_HEADER:_HEADER + size].tobytes()
        else:
            received = np.empty(size, dtype=np.uint8)
            core.recv(received, source, TAG_META, self.group)
            blob = received.tobytes()
        meta, specs = pickle.loads(blob)
        assert len(specs) == count, "a message's tensor count and its specs disagree"
        tensors = [torch.empty(shape, dtype=_DTYPES[code]) for shape, code, _ in specs]
        views = [_bytes_of(t) for t in tensors]
        _, offsets = _layout(size, [v.nbytes for v in views])
        for view, offset in zip(views, offsets):
            n = view.nbytes
            if offset is not None:
                view[:] = frame[offset:offset + n]
            elif n:
                for piece in _pieces(view):
                    core.recv(piece, source, TAG_DATA, self.group)
        return Message(kind, source, meta, tensors, tuple(flag for _, _, flag in specs))


class Mailbox:
    """The thread that receives every message for this rank and hands each to ``deliver``.

    A failure of the core (a lost peer, a time-out) is handed to ``fail`` once, and the
    thread ends: whatever waits on a reply learns it from there. ``close`` ends the thread
    from this rank alone, whatever the other ranks do: it withdraws the posted receive, so
    a rank leaving after an error does not wait on peers that are still busy, and the
    thread is out of the core before the interpreter finalizes (a daemon thread returning
    from the core then would take the GIL in a finalizing interpreter and abort the rank).
    """

    def __init__(self, transport: Transport, deliver: Callable[[Message], None],
                 fail: Callable[[BaseException], None]) -> None:
        self._transport = transport
        self._deliver = deliver
        self._fail = fail
        self._closing = threading.Event()
        self._lock = threading.Lock()
        self._pending: Pending | None = None
        self._thread = threading.Thread(target=self._run, name="shoal-mp-mailbox", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._closing.is_set():
            try:
                pending = self._transport.post_receive()
                with self._lock:
                    self._pending = pending
                if self._closing.is_set():  # close() ran before the receive was posted
                    pending.handle.cancel()
                message = self._transport.receive(pending)
            except ReceiveCancelledError:
                return
            except BaseException as exc:  # noqa: BLE001 - handed on to the waiting tasks
                self._fail(exc)
                return
            self._deliver(message)

    def close(self, timeout: float = 10.0) -> bool:
        """Ends the receiving thread; True once it has ended. A message already arriving
        is received (and delivered) first."""
        self._closing.set()
        with self._lock:
            pending = self._pending
        if pending is not None:
            pending.handle.cancel()
        self._thread.join(timeout=timeout)
        return not self._thread.is_alive()
