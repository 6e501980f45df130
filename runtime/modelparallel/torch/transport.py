"""Messages between the ranks of a pipeline: a small header, pickled metadata, then tensors.

Every message goes over the pipeline group's point-to-point transfers in Shoal's core
(shared memory inside a host, the host-to-host connections across hosts). A message is
three or more transfers to the same peer: a fixed header (kind, metadata length, tensor
count), the metadata bytes, and each tensor's bytes straight from (and into) the tensor's
own storage. Per source and tag the core matches in issue order, so one lock around each
message's sends keeps a message's parts together; the receiving side has one thread (the
``Mailbox``'s) that takes the header from any source and then the rest from that source.
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

# Tags of the pipeline's transfers; the object collectives (comm.py) use their own.
TAG_HEADER, TAG_META, TAG_DATA = 7100, 7101, 7102


@attrs.frozen
class TensorSpec:
    """What the receiver needs to allocate a tensor before its bytes arrive."""

    shape: tuple[int, ...]
    dtype: torch.dtype
    requires_grad: bool = False

    @classmethod
    def of(cls, tensor: torch.Tensor) -> TensorSpec:
        return cls(tuple(tensor.shape), tensor.dtype, tensor.requires_grad)


@attrs.frozen
class Message:
    kind: int
    source: int  # rank in the pipeline group
    meta: Any
    tensors: list[torch.Tensor]


def _bytes_of(tensor: torch.Tensor) -> np.ndarray:
    """The tensor's bytes as a writeable uint8 array sharing its storage."""
    return tensor.view(-1).view(torch.uint8).numpy()


class Transport:
    """Sends messages to, and receives them from, the other ranks of one core group."""

    def __init__(self, group: core.Group | None) -> None:
        self.group = group
        self._send_lock = threading.Lock()

    def send(self, dst: int, kind: int, meta: Any, tensors: list[torch.Tensor]) -> None:
        blob = np.frombuffer(pickle.dumps(meta, protocol=pickle.HIGHEST_PROTOCOL), np.uint8).copy()
        payload = [t.detach().contiguous() for t in tensors]
        header = np.array([kind, blob.size, len(payload), 0], dtype=np.int64)
        with self._send_lock:  # a message's parts leave in order, unmixed with another's
            handles = [core.isend(header, dst, TAG_HEADER, self.group)]
            handles.append(core.isend(blob, dst, TAG_META, self.group))
            handles += [core.isend(_bytes_of(t), dst, TAG_DATA, self.group)
                        for t in payload if t.numel()]
        for handle in handles:
            handle.wait()

    def receive(self) -> Message:
        """The next message from any rank (blocks; one receiving thread only)."""
        header = np.zeros(4, dtype=np.int64)
        source = core.recv(header, None, TAG_HEADER, self.group)
        kind, size, count = (int(v) for v in header[:3])
        blob = np.empty(size, dtype=np.uint8)
        core.recv(blob, source, TAG_META, self.group)
        meta, specs = pickle.loads(blob.tobytes())
        assert len(specs) == count, "a message's tensor count and its specs disagree"
        tensors = [torch.empty(s.shape, dtype=s.dtype) for s in specs]
        for tensor in tensors:
            if tensor.numel():
                core.recv(_bytes_of(tensor), source, TAG_DATA, self.group)
        return Message(kind, source, meta, tensors)

    def send_tensors(self, dst: int, kind: int, meta: Any, tensors: list[torch.Tensor]) -> None:
        """Sends ``meta`` with ``tensors``; the receiver rebuilds them from their specs."""
        self.send(dst, kind, (meta, [TensorSpec.of(t) for t in tensors]), tensors)


class Mailbox:
    """The thread that receives every message for this rank and hands each to ``deliver``.

    A failure of the core (a lost peer, a time-out) is handed to ``fail`` once, and the
    thread ends: whatever waits on a reply learns it from there.
    """

    def __init__(self, transport: Transport, deliver: Callable[[Message], None],
                 fail: Callable[[BaseException], None]) -> None:
        self._transport = transport
        self._deliver = deliver
        self._fail = fail
        self._thread = threading.Thread(target=self._run, name="shoal-mp-mailbox", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            try:
                message = self._transport.receive()
            except BaseException as exc:  # noqa: BLE001 - handed on to the waiting tasks
                self._fail(exc)
                return
            if message.kind == KIND_CLOSE:
                return
            self._deliver(message)

    def close(self, neighbour: int) -> None:
        """Ends the neighbour's mailbox thread (the core sends to no rank itself): each rank
        of the pipeline closes the next one's, once no step is running anywhere."""
        self._transport.send_tensors(neighbour, KIND_CLOSE, None, [])
        self._thread.join(timeout=30)


KIND_CLOSE = 0
