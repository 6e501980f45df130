"""The ``smdistributed.dataparallel.torch.distributed`` module API over Shoal's backend.

Scripts written for the closed library call ``init_process_group()`` with no arguments,
then ``get_rank()``, ``get_local_rank()``, ``all_reduce(...)`` and so on. Here
``init_process_group()`` reads the rank environment, registers Shoal's torch.distributed
backend and initializes torch's default process group on it, so that this API, plain
``torch.distributed`` calls and ``torch.nn.parallel.DistributedDataParallel`` all share one
communicator. Like the closed library, only the world group exists.
"""

from __future__ import annotations

import atexit
import contextlib
import datetime
import functools
import os

import torch.distributed as torch_dist
from shoal.errors import RuntimeFailure, ValidationError

from . import environment, rendezvous
from .backend import BACKEND_NAME, register_backend, shoal_error_from

__all__ = [
    "ReduceOp",
    "Work",
    "all_gather",
    "all_reduce",
    "barrier",
    "broadcast",
    "destroy_process_group",
    "get_local_rank",
    "get_local_size",
    "get_rank",
    "get_world_size",
    "group",
    "init_process_group",
    "is_available",
    "is_initialized",
    "new_group",
    "reduce",
]


class ReduceOp:
    """The reduction operations of the module API (``AVERAGE`` as in the closed library)."""

    SUM = torch_dist.ReduceOp.SUM
    AVERAGE = torch_dist.ReduceOp.AVG
    AVG = torch_dist.ReduceOp.AVG
    MIN = torch_dist.ReduceOp.MIN
    MAX = torch_dist.ReduceOp.MAX
    PRODUCT = torch_dist.ReduceOp.PRODUCT


class group:  # noqa: N801 - the closed library's name
    """Process groups: only the world exists."""

    WORLD = None


_local: dict[str, int] = {}  # this host's view, from the core's grouping of ranks


def is_available() -> bool:
    """True when this process was started as part of a distributed job."""
    return environment.started_by_a_launcher(os.environ)


def init_process_group(*args, backend: str = BACKEND_NAME, timeout=None, **kwargs) -> None:
    """Initialize the world process group on Shoal's backend (idempotent).

    Positional and other keyword arguments are accepted for parity and ignored, as in the
    closed library; ``backend`` exists so the same script can be compared against gloo.
    """
    env = environment.from_environ(os.environ)
    if torch_dist.is_initialized():  # by an earlier call, or by torch.distributed directly
        group.WORLD = torch_dist.group.WORLD
        _local.clear()
        return
    register_backend()
    if timeout is None:
        timeout = rendezvous.collective_timeout(os.environ)
    elif not isinstance(timeout, datetime.timedelta):
        timeout = datetime.timedelta(seconds=float(timeout))
    store = rendezvous.create_store(env, os.environ, timeout)
    torch_dist.init_process_group(
        backend=backend, store=store, rank=env.rank, world_size=env.world_size, timeout=timeout
    )
    group.WORLD = torch_dist.group.WORLD
    _local.clear()
    # Scripts written for the closed library never tear the group down. torch's gloo groups
    # (which such scripts may add) abort the process if the interpreter finalizes first
    # ("terminate called without an active exception"): tear down while it is still alive.
    atexit.register(_destroy_at_exit)


def _destroy_at_exit() -> None:
    if torch_dist.is_initialized():
        destroy_process_group()


def is_initialized() -> bool:
    """True once ``init_process_group()`` (or torch's) has run."""
    return torch_dist.is_initialized()


@contextlib.contextmanager
def _shoal_errors():
    """Re-raise the core's failures as Shoal's errors (CollectiveTimeoutError, ...)."""
    try:
        yield
    except RuntimeError as error:
        translated = shoal_error_from(error)
        if translated is None:
            raise
        raise translated from error


class Work:
    """The handle of an ``async_op=True`` collective; ``wait()`` raises Shoal's errors."""

    def __init__(self, work):
        self._work = work

    def wait(self, timeout=None) -> bool:
        with _shoal_errors():
            return self._work.wait() if timeout is None else self._work.wait(timeout)

    def is_completed(self) -> bool:
        return self._work.is_completed()

    def get_future(self):
        return self._work.get_future()


def _collective(function):
    """Check initialization, translate errors, wrap async handles."""

    @functools.wraps(function)
    def run(*args, **kwargs):
        _require_initialized()
        with _shoal_errors():
            work = function(*args, **kwargs)
        return None if work is None else Work(work)

    return run


def _require_initialized() -> None:
    if not torch_dist.is_initialized():
        raise RuntimeFailure("call init_process_group() before using the process group")


def _world(group_arg):
    if group_arg is None or group_arg is torch_dist.group.WORLD:
        return None
    try:
        ranks = torch_dist.get_process_group_ranks(group_arg)
    except (RuntimeError, ValueError):
        ranks = None
    if ranks is not None and sorted(ranks) == list(range(torch_dist.get_world_size())):
        return group_arg
    raise ValidationError("only the world group is supported (group.WORLD)")


def get_rank(group=None) -> int:  # noqa: A002 - torch.distributed's parameter name
    """This process's rank in the world, 0..world_size-1."""
    _require_initialized()
    return torch_dist.get_rank(_world(group))


def get_world_size(group=None) -> int:  # noqa: A002
    """The number of processes in the job, across all hosts."""
    _require_initialized()
    return torch_dist.get_world_size(_world(group))


def _local_placement() -> dict[str, int]:
    _require_initialized()
    if not _local:
        env = environment.from_environ(os.environ)
        _local["rank"], _local["size"] = rendezvous.local_placement(env)
    return _local


def get_local_rank() -> int:
    """This process's rank among the processes on its host."""
    return _local_placement()["rank"]


def get_local_size() -> int:
    """The number of processes on this process's host."""
    return _local_placement()["size"]


@_collective
def all_reduce(tensor, op=ReduceOp.SUM, group=None, async_op=False):  # noqa: A002
    """Reduce ``tensor`` across all ranks, in place; a work handle if ``async_op``."""
    return torch_dist.all_reduce(tensor, op=op, group=_world(group), async_op=async_op)


@_collective
def broadcast(tensor, src=0, group=None, async_op=False):  # noqa: A002
    """Copy rank ``src``'s ``tensor`` to every rank, in place."""
    return torch_dist.broadcast(tensor, src=src, group=_world(group), async_op=async_op)


@_collective
def all_gather(tensor_list, tensor, group=None, async_op=False):  # noqa: A002
    """Fill ``tensor_list[i]`` with rank i's ``tensor`` on every rank."""
    return torch_dist.all_gather(tensor_list, tensor, group=_world(group), async_op=async_op)


@_collective
def reduce(tensor, dst=0, op=ReduceOp.SUM, group=None, async_op=False):  # noqa: A002
    """Reduce ``tensor`` across all ranks into rank ``dst``'s ``tensor``."""
    return torch_dist.reduce(tensor, dst=dst, op=op, group=_world(group), async_op=async_op)


@_collective
def barrier(group=None, async_op=False):  # noqa: A002
    """Block until every rank has reached the barrier."""
    return torch_dist.barrier(group=_world(group), async_op=async_op)


def new_group(ranks=None, *args, **kwargs):
    """The world group, when ``ranks`` is ``None`` or every rank; subgroups are not
    supported (as in the closed library)."""
    _require_initialized()
    if ranks is None or sorted(ranks) == list(range(torch_dist.get_world_size())):
        return group.WORLD
    raise ValidationError(f"only the world group is supported (got ranks={list(ranks)})")


def destroy_process_group() -> None:
    """Tear down the world process group."""
    if torch_dist.is_initialized():
        torch_dist.destroy_process_group()
    group.WORLD = None
    _local.clear()
