"""Registration of Shoal's torch.distributed backend (``shoal``, alias ``smddp``).

Registering is cheap (no compilation): the c10d extension is built, or loaded from its
cache, the first time a process group is created on the backend.
"""

from __future__ import annotations

import atexit
import re

import torch
import torch.distributed as torch_dist
from shoal.errors import CollectiveError, CollectiveTimeoutError, PeerLostError

BACKEND_NAME = "shoal"
ALIASES = ("smddp",)


def create_process_group(store, rank: int, size: int, timeout, ranks=(), name: str = ""):
    """torch's creator for backend ``shoal``: a c10d Backend on a communicator of its own,
    set up through the group's ``store`` (``createProcessGroupShoal(store, rank, size,
    timeout)``). ``ranks`` are the group's global ranks (none: the world). The first
    world-sized group runs on the core's world communicator, started here unless the
    module API started it.

    ``timeout`` (torch's ``timeout=`` of ``init_process_group`` or ``new_group``) bounds each
    of the group's collectives, barriers and transfers; torch's default (30 minutes, given
    when the user gives none) leaves ``SHOAL_COLLECTIVE_TIMEOUT`` in force. A time-out's error
    names the group (``name``, torch's), the operation, the time-out and the ranks waited for.
    """
    from .build import load_extension

    extension = load_extension()
    _drain_at_exit(extension)
    world = torch_dist.get_world_size() if torch_dist.is_initialized() else size
    timeout_ms = int(timeout.total_seconds() * 1000) if timeout is not None else 0
    return extension.create_backend(store, rank, size, [int(r) for r in ranks], world,
                                    timeout_ms=timeout_ms, name=str(name or ""))


_draining: list = []


def _drain_at_exit(extension) -> None:
    """Let the backend's completion thread finish its futures' callbacks (DDP's hooks are
    Python) while the interpreter is still whole: one that starts during finalization
    aborts the process."""
    if not _draining:
        _draining.append(extension)
        atexit.register(extension.drain)


def take_activity() -> tuple[list[tuple], int]:
    """The backend's operations recorded since the last call, with profiling on
    (``SHOAL_PROFILER_DIR``; see csrc/activity.h), and how many were dropped: nothing
    before this process created a group on the backend."""
    if not _draining:
        return [], 0
    return _draining[0].take_activity()


createProcessGroupShoal = create_process_group  # noqa: N816 - the name c10d backends use


def create_from_options(options, backend_options=None):
    """torch's extended creator: its options also name the group's global ranks."""
    return create_process_group(
        options.store,
        options.group_rank,
        options.group_size,
        options.timeout,
        list(options.global_ranks_in_group),
        getattr(options, "group_id", ""),
    )


def is_registered(name: str = BACKEND_NAME) -> bool:
    return name.upper() in torch_dist.Backend._plugins


def backend_devices() -> list[str]:
    """The tensor devices the backend takes: the CPU, CUDA where this torch is built with it,
    and an accelerator registered under torch's PrivateUse1 type, under its name: their
    tensors are staged through pinned host memory (csrc/staging.h, device-generic). Asked of
    the build, not the driver: nothing here initialises CUDA before a process forks."""
    devices = ["cpu", "cuda"] if torch.backends.cuda.is_built() else ["cpu"]
    private = torch._C._get_privateuse1_backend_name()
    return devices if private == "privateuseone" else [*devices, private]


def register_backend() -> None:
    """Register ``shoal`` and its aliases for CPU (and CUDA) tensors, and give torch's DDP on
    them defaults without gradient copies or a division pass (see ``ddp_defaults``).
    Idempotent."""
    from . import ddp_defaults

    ddp_defaults.install()
    for name in (BACKEND_NAME, *ALIASES):
        if not is_registered(name):
            torch_dist.Backend.register_backend(
                name, create_from_options, extended_api=True, devices=backend_devices()
            )


# The c10d extension prefixes the core's errors with their kind (see csrc).
_KINDS = {
    "CollectiveTimeoutError": CollectiveTimeoutError,
    "PeerLostError": PeerLostError,
    "CollectiveError": CollectiveError,
}
_KIND_PATTERN = re.compile(r"\b(CollectiveTimeoutError|PeerLostError|CollectiveError): (.*)", re.S)


def shoal_error_from(error: BaseException) -> CollectiveError | None:
    """The Shoal error a backend failure stands for, or None if it is not the core's."""
    match = _KIND_PATTERN.search(str(error))
    if match is None:
        return None
    return _KINDS[match.group(1)](match.group(2).strip())
