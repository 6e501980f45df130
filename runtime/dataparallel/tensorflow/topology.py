"""Where this process sits in the job: ``init()``, ``size()``, ``rank()``, ``local_size()``,
``local_rank()`` and ``shutdown()`` of the TensorFlow API.

The numbers come from the collective core's communicator (``shoal.dataparallel.core``),
which bootstraps from the rank environment that ``mpirun`` and Shoal's launcher set.
"""

from __future__ import annotations

from shoal.dataparallel import core
from shoal.errors import RuntimeFailure

_state: dict[str, core.Communicator | None] = {"communicator": None}


def init() -> None:
    """Joins the job's communicator. Like the closed library, a second call is an error."""
    if _state["communicator"] is not None:
        raise RuntimeFailure(
            "init() called more than once: Shoal's data-parallel runtime is already initialized"
        )
    _state["communicator"] = core.init()


def is_initialized() -> bool:
    return _state["communicator"] is not None


def communicator() -> core.Communicator:
    """The communicator joined by ``init()``; an error before it."""
    comm = _state["communicator"]
    if comm is None:
        raise RuntimeFailure("call init() before using Shoal's data-parallel TensorFlow API")
    return comm


def size() -> int:
    """Number of processes in the job (one per accelerator)."""
    return communicator().size


def rank() -> int:
    """This process's rank in the job, 0 to ``size() - 1``."""
    return communicator().rank


def local_size() -> int:
    """Number of processes on this host."""
    return communicator().local_size


def local_rank() -> int:
    """This process's rank among the processes of its host (the device to pin)."""
    return communicator().local_rank


def new_group(ranks) -> core.Group | None:
    """A communicator over ``ranks`` (every rank calls it with the same ranks; the others
    get None), for the collectives' ``group=`` argument."""
    communicator()
    return core.new_group(ranks)


def shutdown() -> None:
    """Drains queued work and leaves the communicator; ``init()`` may be called again."""
    core.shutdown()
    _state["communicator"] = None
