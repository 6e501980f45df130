"""SMP's object communication: pickled Python objects between ranks and over groups.

``broadcast(obj, group)`` sends to every other member of the group, which each take it with
``recv_from(src, rank_type)``; ``send``/``recv_from`` go between two ranks named by their rank
of a given type; ``allgather``/``gather`` collect from a group in group-rank order; the
barriers wait for a group. Everything runs on the core's world and its sub-communicators,
with tags of its own (the pipeline's transfers use others), and is synchronous as in SMP.
"""

from __future__ import annotations

import pickle
from typing import Any

import numpy as np
from shoal.dataparallel import core
from shoal.modelparallel.topology import CommGroup, RankType
from shoal.modelparallel.torch import state as _state

TAG_SIZE, TAG_BLOB = 7200, 7201


def _dumps(obj: Any) -> np.ndarray:
    return np.frombuffer(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL), np.uint8).copy()


def _send_world(obj: Any, dst: int) -> None:
    blob = _dumps(obj)
    core.send(np.array([blob.size], dtype=np.int64), dst, TAG_SIZE)
    core.send(blob, dst, TAG_BLOB)


def _recv_world(src: int) -> Any:
    size = np.zeros(1, dtype=np.int64)
    core.recv(size, src, TAG_SIZE)
    blob = np.empty(int(size[0]), dtype=np.uint8)
    core.recv(blob, src, TAG_BLOB)
    return pickle.loads(blob.tobytes())


def _members(group: CommGroup) -> list[int]:
    return list(_state.require().topology.group_of(CommGroup(group)))


def broadcast(obj: Any, group: CommGroup = CommGroup.WORLD) -> None:
    """Sends ``obj`` to every other member of ``group``; they call ``recv_from``."""
    me = _state.require().topology.rank
    for member in _members(group):
        if member != me:
            _send_world(obj, member)


def send(obj: Any, dest_rank: int, rank_type: RankType) -> None:
    """Sends ``obj`` to the rank whose rank of ``rank_type`` is ``dest_rank``."""
    _send_world(obj, _state.require().topology.to_global(RankType(rank_type), int(dest_rank)))


def recv_from(src_rank: int, rank_type: RankType) -> Any:
    """Receives what ``send`` or ``broadcast`` sent from that rank."""
    return _recv_world(_state.require().topology.to_global(RankType(rank_type), int(src_rank)))


def allgather(obj: Any, group: CommGroup = CommGroup.WORLD) -> list[Any]:
    """Every member's ``obj``, in group-rank order, on every member."""
    target = _state.require().core_group(CommGroup(group))
    if target is _state.SOLO:
        return [obj]
    blob = _dumps(obj)
    sizes = core.allgather(np.array([blob.size], dtype=np.int64), group=target).reshape(-1)
    width = int(sizes.max())
    padded = np.zeros(width, dtype=np.uint8)
    padded[: blob.size] = blob
    gathered = core.allgather(padded, group=target).reshape(len(sizes), width)
    return [pickle.loads(gathered[i, : int(n)].tobytes()) for i, n in enumerate(sizes)]


def gather(obj: Any, group: CommGroup = CommGroup.WORLD, rank: int = 0) -> list[Any] | None:
    """Every member's ``obj`` on the member of group rank ``rank``; None elsewhere."""
    gathered = allgather(obj, group)
    members = _members(group)
    return gathered if members.index(_state.require().topology.rank) == rank else None


def barrier(group: CommGroup = CommGroup.WORLD) -> None:
    target = _state.require().core_group(CommGroup(group))
    if target is not _state.SOLO:
        core.barrier(group=target)


def dp_barrier() -> None:
    barrier(CommGroup.DP_GROUP)


def mp_barrier() -> None:
    barrier(CommGroup.MP_GROUP)


def pp_barrier() -> None:
    barrier(CommGroup.PP_GROUP)


def tp_barrier() -> None:
    barrier(CommGroup.TP_GROUP)


def rdp_barrier() -> None:
    barrier(CommGroup.RDP_GROUP)


def broadcast_from_world_root(obj: Any) -> Any:
    """World rank 0's ``obj`` on every rank (the partition decision)."""
    st = _state.require()
    blob = _dumps(obj) if st.topology.rank == 0 else np.zeros(0, np.uint8)
    size = np.array([blob.size], dtype=np.int64)
    core.broadcast(size, 0)
    if st.topology.rank != 0:
        blob = np.empty(int(size[0]), dtype=np.uint8)
    core.broadcast(blob, 0)
    return pickle.loads(blob.tobytes())
