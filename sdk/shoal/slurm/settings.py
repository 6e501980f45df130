"""Where and how a Slurm cluster runs Shoal's jobs: ``SlurmSettings``, parsed once from the
config file's ``slurm:`` section, ``shoal.Session(backend="slurm", slurm=...)`` or the
environment (``SHOAL_SLURM_SHARED_DIR``, ``SHOAL_SLURM_PARTITION``, ``SHOAL_SLURM_ACCOUNT``,
``SHOAL_SLURM_QOS``).

- ``shared_dir``: a directory every node sees at the same path (a cluster's shared
  filesystem; on the local cluster, any directory). Each job gets ``<shared_dir>/<job>/``.
- ``partitions``: instance type (or instance group) -> partition, as SageMaker HyperPod names a
  partition after each instance group; ``default_partition`` for the rest, else the cluster's
  default partition.
- ``account``, ``qos``, ``sbatch_options`` (extra ``--key=value`` options, passed as given).
- ``python``: the interpreter the nodes run Shoal with (default: this one; on a cluster it
  lives on the shared filesystem, as a virtual environment there).
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Mapping
from pathlib import Path

import attrs

from shoal.errors import ConfigError

ENV_PREFIX = "SHOAL_SLURM_"
_OPTION = re.compile(r"--[a-z][a-z0-9-]*(=.+)?")


def _default_shared_dir() -> Path:
    return Path(os.environ.get(f"{ENV_PREFIX}SHARED_DIR")
                or Path.home() / ".shoal" / "slurm").expanduser()


def _options(_, attribute, value) -> None:
    for option in value:
        if not _OPTION.fullmatch(option):
            raise ConfigError(f"'{attribute.name}' entries must read --name or --name=value "
                              f"(got {option!r})")
        if option.split("=", 1)[0] in ("--wrap", "--export", "--output", "--chdir"):
            raise ConfigError(f"'{attribute.name}' may not set {option.split('=', 1)[0]}: Shoal "
                              f"sets it for the job (got {option!r})")


def _name(_, attribute, value) -> None:
    if value is not None and not re.fullmatch(r"[A-Za-z0-9_.-]+", value):
        raise ConfigError(f"'{attribute.name}' must be a Slurm name (letters, digits, _ . -) "
                          f"(got {value!r})")


def _partitions(value: Mapping) -> None:
    for key, partition in value.items():
        if not isinstance(partition, str) or not re.fullmatch(r"[A-Za-z0-9_.-]+", partition):
            raise ConfigError(f"'partitions' maps {key!r} to {partition!r}, which is not a "
                              "Slurm partition name (letters, digits, _ . -)")


@attrs.frozen
class SlurmSettings:
    shared_dir: Path = attrs.field(factory=_default_shared_dir,
                                   converter=lambda p: Path(p).expanduser().absolute())
    partitions: Mapping[str, str] = attrs.field(factory=dict, converter=dict,
                                                validator=lambda i, a, v: _partitions(v))
    default_partition: str | None = attrs.field(default=None, validator=_name)
    account: str | None = attrs.field(default=None, validator=_name)
    qos: str | None = attrs.field(default=None, validator=_name)
    sbatch_options: tuple[str, ...] = attrs.field(default=(), converter=tuple, validator=_options)
    python: str = attrs.field(default=sys.executable)

    def partition_for(self, instance_type: str | None) -> str | None:
        """The partition of an instance type; None: the cluster's default partition."""
        return self.partitions.get(instance_type or "", self.default_partition)

    @classmethod
    def from_mapping(cls, data: Mapping | None) -> SlurmSettings:
        """The config file's ``slurm:`` section (loose input: unknown keys are refused)."""
        data = dict(data or {})
        known = {f.name for f in attrs.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(f"unknown 'slurm' setting(s) {', '.join(unknown)} (known: "
                              f"{', '.join(sorted(known))})")
        return cls(**data)

    @classmethod
    def resolve(cls, section: Mapping | None) -> SlurmSettings:
        """A configuration's ``slurm:`` section when it has one, else the environment."""
        return cls.from_mapping(section) if section else cls.from_env()

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> SlurmSettings:
        fields = {"default_partition": "PARTITION", "account": "ACCOUNT", "qos": "QOS",
                  "shared_dir": "SHARED_DIR", "python": "PYTHON"}
        return cls(**{k: environ[ENV_PREFIX + v] for k, v in fields.items()
                      if environ.get(ENV_PREFIX + v)})
