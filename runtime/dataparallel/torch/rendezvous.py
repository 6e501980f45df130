"""How torch's store and Shoal's collective core find their peers without colliding.

No port is chosen by one process and bound later by another (another process may take it
in between):

- ``torch.distributed.init_process_group(backend="shoal")``, whatever its init method, starts
  torch's store first; the backend's creator then sets up each group's communicator through
  that store (group rank 0 binds a port, then publishes it there);
- the module API (``init_process_group()``) starts the core first (it works under a plain
  ``mpirun`` too, where only the launcher's ``MASTER_PORT`` exists); rank 0 starts torch's
  ``TCPStore`` on a port the kernel picks and broadcasts it with the core.
"""

from __future__ import annotations

import datetime
import os
from collections.abc import Mapping

import numpy as np
from shoal.errors import ValidationError

from .environment import RankEnvironment

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
    """Start the core, then torch's TCPStore: rank 0's on a port the kernel picks, which
    the core broadcasts to the others."""
    import torch.distributed as torch_dist

    core().init()
    store = None
    if env.rank == 0:
        store = torch_dist.TCPStore(
            env.master_addr, 0, env.world_size, is_master=True, timeout=timeout,
            wait_for_workers=False,
        )
    port = np.array([store.port if store is not None else 0], dtype=np.int64)
    core().broadcast(port, 0)
    if store is not None:
        return store
    return torch_dist.TCPStore(
        env.master_addr, int(port[0]), env.world_size, is_master=False, timeout=timeout
    )
