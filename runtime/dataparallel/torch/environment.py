"""The rank environment as the torch glue reads it, parsed once into a frozen value.

Three starters set it: Shoal's per-rank wrapper ``shoal-rank`` and torchrun (torch names:
``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR``,
``MASTER_PORT``), and a plain ``mpirun`` (Open MPI's ``OMPI_COMM_WORLD_*``). Torch names win.
A process started by none of them is a world of one.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

import attrs
from shoal.errors import ValidationError

_SOURCES = {
    "rank": ("RANK", "OMPI_COMM_WORLD_RANK"),
    "world_size": ("WORLD_SIZE", "OMPI_COMM_WORLD_SIZE"),
    "local_rank": ("LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK"),
    "local_size": ("LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE"),
}
_DEFAULTS = {"rank": 0, "world_size": 1, "local_rank": 0, "local_size": 1}


def _below(bound_field: str):
    def check(instance, attribute, value):
        bound = getattr(instance, bound_field)
        if not 0 <= value < bound:
            raise ValidationError(
                f"'{attribute.name}' must be >= 0 and < {bound_field} {bound} (got {value})"
            )

    return check


def _port(instance, attribute, value):
    if value is not None and not 0 < value < 65536:
        raise ValidationError(f"'{attribute.name}' must be in 1..65535 (got {value})")


@attrs.frozen
class RankEnvironment:
    """Where this process sits in the job, and where the job's rendezvous is."""

    world_size: int = attrs.field(validator=attrs.validators.ge(1))
    rank: int = attrs.field(validator=_below("world_size"))
    local_size: int = attrs.field(validator=attrs.validators.ge(1))
    local_rank: int = attrs.field(validator=_below("local_size"))
    master_addr: str = "127.0.0.1"
    master_port: int | None = attrs.field(default=None, validator=_port)

    @property
    def is_distributed(self) -> bool:
        """True when a starter (launcher, torchrun, mpirun) placed this process in a job."""
        return self.world_size > 1


def _integer(environ: Mapping[str, str], field: str) -> int:
    for name in _SOURCES[field]:
        raw = environ.get(name)
        if raw is not None and raw.strip() != "":
            try:
                return int(raw)
            except ValueError:
                raise ValidationError(f"'{name}' must be an integer (got {raw!r})") from None
    return _DEFAULTS[field]


def started_by_a_launcher(environ: Mapping[str, str] = os.environ) -> bool:
    """True when any starter's rank variables are present."""
    return any(name in environ for names in _SOURCES.values() for name in names)


def from_environ(environ: Mapping[str, str] = os.environ) -> RankEnvironment:
    """Parse the rank environment; raise ``ValidationError`` naming the bad variable."""
    port = environ.get("MASTER_PORT")
    try:
        master_port = int(port) if port else None
    except ValueError:
        raise ValidationError(f"'MASTER_PORT' must be an integer (got {port!r})") from None
    try:
        return RankEnvironment(
            world_size=_integer(environ, "world_size"),
            rank=_integer(environ, "rank"),
            local_size=_integer(environ, "local_size"),
            local_rank=_integer(environ, "local_rank"),
            master_addr=environ.get("MASTER_ADDR") or "127.0.0.1",
            master_port=master_port,
        )
    except ValueError as error:
        if isinstance(error, ValidationError):
            raise
        raise ValidationError(str(error)) from None
