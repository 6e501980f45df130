"""How torch's store and Shoal's collective core find their peers without colliding.

Both rendezvous at ``MASTER_ADDR``: the core bootstraps over TCP on ``MASTER_PORT`` and
torch's ``TCPStore`` wants a port too, so whichever starts second gets a fresh port that
rank 0 picks and publishes through the one already running:

- the module API (``init_process_group()``) starts the core first (it works under a plain
  ``mpirun`` too, where no ``MASTER_PORT`` exists) and broadcasts the store's port with it;
- ``torch.distributed.init_process_group(backend="shoal")`` starts torch's store first, and
  the backend's creator publishes the core's port through that store.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import socket
from collections.abc import Mapping

import numpy as np
from shoal.errors import ValidationError

from .environment import RankEnvironment

CORE_PORT_KEY = "shoal/core_port"
DEFAULT_TIMEOUT = datetime.timedelta(minutes=30)


def collective_timeout(environ: Mapping[str, str] = os.environ) -> datetime.timedelta:
    """``SHOAL_COLLECTIVE_TIMEOUT`` seconds, else torch's default of 30 minutes."""
    raw = environ.get("SHOAL_COLLECTIVE_TIMEOUT")
    if not raw:
        return DEFAULT_TIMEOUT
    try:
        seconds = float(raw)
    except ValueError:
        raise ValidationError(f"'SHOAL_COLLECTIVE_TIMEOUT' must be a number (got {raw!r})") from None
    if seconds <= 0:
        raise ValidationError(f"'SHOAL_COLLECTIVE_TIMEOUT' must be > 0 (got {raw})")
    return datetime.timedelta(seconds=seconds)


def free_port(host: str = "") -> int:
    """A TCP port nobody listens on right now (the kernel's choice)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((host, 0))
        return probe.getsockname()[1]


def core():
    """The collective core's Python API (imported late: it loads the compiled library)."""
    from shoal.dataparallel import core as core_api

    return core_api


def core_is_initialized() -> bool:
    return bool(core().is_initialized())


def local_placement(env: RankEnvironment) -> tuple[int, int]:
    """(local_rank, local_size) as the core groups ranks into hosts (by ``SHOAL_HOST``)."""
    if core_is_initialized():
        communicator = core().init()
        return communicator.local_rank, communicator.local_size
    return env.local_rank, env.local_size


def create_store(env: RankEnvironment, environ: Mapping[str, str], timeout):
    """Start the core, then torch's TCPStore on a port rank 0 broadcasts through the core."""
    import torch.distributed as torch_dist

    core().init()
    port = np.array([free_port() if env.rank == 0 else 0], dtype=np.int64)
    core().broadcast(port, 0)
    return torch_dist.TCPStore(
        env.master_addr,
        int(port[0]),
        env.world_size,
        is_master=env.rank == 0,
        timeout=timeout,
    )


@contextlib.contextmanager
def _master_port(port: int):
    previous = os.environ.get("MASTER_PORT")
    os.environ["MASTER_PORT"] = str(port)
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop("MASTER_PORT", None)
        else:
            os.environ["MASTER_PORT"] = previous


def start_core_through_store(store, rank: int) -> None:
    """Start the core on a port rank 0 publishes in torch's store (the store holds
    ``MASTER_PORT`` already). Does nothing if the core already runs."""
    if core_is_initialized():
        return
    if rank == 0:
        store.set(CORE_PORT_KEY, str(free_port()))
    port = int(store.get(CORE_PORT_KEY).decode())
    with _master_port(port):
        core().init()
