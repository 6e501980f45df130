"""Job files and Shoal's configuration layers.

A job file is YAML with the estimator's keyword arguments plus ``framework``, ``inputs``,
``job_name``, ``region`` and ``processes_per_host``; its relative ``source_dir`` (or lone
``entry_point``) and ``dependencies`` are relative to the file. The same keys, all optional, make the configuration layers that supply defaults.
Precedence, highest first:

1. command-line flags,
2. the job file given to ``shoal run``,
3. the file named by ``$SHOAL_CONFIG``,
4. the user config ``~/.config/shoal/config.yaml`` (``$XDG_CONFIG_HOME`` honoured),
5. the project config ``./shoal.yaml``.

Every layer is checked strictly: an unknown key is rejected with the nearest known key, and a
value of the wrong type is named with what was expected and what was found.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs
import yaml

from .errors import ConfigError
from .frameworks import LOCAL_INSTANCE_TYPES, REMOTE_BACKENDS
from .local.network import NETWORK_MODES

FRAMEWORKS = ("pytorch", "tensorflow", "estimator")
PROCESSES_PER_HOST_HP = "sagemaker_mpi_num_of_processes_per_host"

_opt = attrs.validators.optional
_is = attrs.validators.instance_of


def _positive(instance, attribute, value):
    if value is not None and value < 1:
        raise ConfigError(f"'{attribute.name}' must be >= 1 (got {value!r})")


def _str_map(instance, attribute, value):
    if value is None:
        return
    if not isinstance(value, Mapping) or not all(isinstance(k, str) for k in value):
        raise ConfigError(f"'{attribute.name}' must be a mapping with string keys (got {value!r})")


def _inputs(instance, attribute, value):
    if value is None or isinstance(value, str):
        return
    _str_map(instance, attribute, value)
    for channel, uri in value.items():
        if not isinstance(uri, str):
            raise ConfigError(f"'inputs.{channel}' must be a URI string (got {uri!r})")


def _typed(kind, *extra):
    return [_opt(_is(kind)), *extra]


def _field(kind, *extra, default=None):
    return attrs.field(default=default, validator=_typed(kind, *extra))


@attrs.frozen(kw_only=True)
class JobSpec:
    """One training job as a user writes it: estimator arguments plus where the data is."""

    framework: str | None = attrs.field(default=None, validator=_opt(attrs.validators.in_(FRAMEWORKS)))
    entry_point: str | None = _field(str)
    source_dir: str | None = _field(str)
    dependencies: list | None = _field(list)
    framework_version: str | None = _field(str)
    py_version: str | None = _field(str)
    image_uri: str | None = _field(str)
    role: str | None = _field(str)
    region: str | None = _field(str)
    instance_type: str | None = _field(str)
    instance_count: int | None = _field(int, _positive)
    processes_per_host: int | None = _field(int, _positive)
    volume_size: int | None = _field(int, _positive)
    max_run: int | None = _field(int, _positive)
    hyperparameters: dict | None = attrs.field(default=None, validator=_str_map)
    environment: dict | None = attrs.field(default=None, validator=_str_map)
    allow_secrets: bool | None = _field(bool)  # send secret-looking values anyway
    distribution: dict | None = attrs.field(default=None, validator=_str_map)
    inputs: Any = attrs.field(default=None, validator=_inputs)
    output_path: str | None = _field(str)
    code_location: str | None = _field(str)
    checkpoint_s3_uri: str | None = _field(str)
    checkpoint_local_path: str | None = _field(str)
    base_job_name: str | None = _field(str)
    job_name: str | None = _field(str)
    tags: list | None = _field(list)
    # local jobs only: hosts on loopback (simulated) or in network namespaces of their own,
    # and the link emulated between namespaced hosts ("rate=10gbit,delay=50us")
    local_network: str | None = attrs.field(
        default=None, validator=_opt(attrs.validators.in_(NETWORK_MODES)))
    local_link: str | None = _field(str)
    # where a non-local job runs: SageMaker (the default) or a Slurm cluster, with the
    # cluster's settings (shoal.slurm.settings.SlurmSettings: shared_dir, partitions, ...)
    backend: str | None = attrs.field(
        default=None, validator=_opt(attrs.validators.in_(REMOTE_BACKENDS)))
    slurm: dict | None = attrs.field(default=None, validator=_opt(_is(dict)))

    @classmethod
    def keys(cls) -> list[str]:
        return [f.name for f in attrs.fields(cls)]

    def to_dict(self) -> dict:
        """The keys that are set, in field order (what ``shoal config show`` prints)."""
        return {k: v for k, v in attrs.asdict(self, recurse=False).items() if v is not None}

    @property
    def is_local(self) -> bool:
        return self.instance_type in LOCAL_INSTANCE_TYPES

    @property
    def on_slurm(self) -> bool:
        return not self.is_local and (self.backend or os.environ.get("SHOAL_BACKEND")) == "slurm"


def did_you_mean(key: str, known: list[str]) -> str:
    close = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def parse_spec(data: Any, source: str = "job file") -> JobSpec:
    """Check a loose mapping strictly and build a ``JobSpec`` from it."""
    if data is None:
        return JobSpec()
    if not isinstance(data, Mapping):
        raise ConfigError(f"{source}: expected a mapping of keys to values (got {type(data).__name__})")
    known = JobSpec.keys()
    for key in data:
        if key not in known:
            raise ConfigError(f"{source}: unknown key {key!r}{did_you_mean(str(key), known)}")
    try:
        return JobSpec(**data)
    except (TypeError, ValueError) as error:
        raise ConfigError(f"{source}: {_attrs_message(error)}") from error


def _attrs_message(error: Exception) -> str:
    # attrs' instance_of error carries (message, attribute, expected, value) in args.
    if isinstance(error, TypeError) and len(error.args) == 4:
        _, attribute, expected, value = error.args
        names = getattr(expected, "__name__", None) or "/".join(t.__name__ for t in expected)
        return f"'{attribute.name}' must be {names} (got {value!r})"
    return str(error.args[0] if error.args else error)


def load_yaml(path: str | os.PathLike) -> Any:
    path = Path(path)
    try:
        return yaml.safe_load(path.read_text())
    except FileNotFoundError as error:
        raise ConfigError(f"{path}: no such file") from error
    except yaml.YAMLError as error:
        raise ConfigError(f"{path}: not valid YAML: {error}") from error


def load_spec(path: str | os.PathLike) -> JobSpec:
    """A file's spec; its relative code paths are relative to the file, not the shell."""
    spec = parse_spec(load_yaml(path), source=str(path))
    return anchor_paths(spec, Path(path).resolve().parent)


def anchor_paths(spec: JobSpec, base: Path) -> JobSpec:
    """``source_dir``, ``dependencies`` and a lone ``entry_point`` made absolute from ``base``.

    With ``source_dir``, ``entry_point`` stays relative to it, as in the estimator.
    """
    def anchor(value):
        return value if "://" in value or os.path.isabs(value) else str(base / value)

    changes = {}
    if spec.source_dir:
        changes["source_dir"] = anchor(spec.source_dir)
    elif spec.entry_point:
        changes["entry_point"] = anchor(spec.entry_point)
    if spec.dependencies:
        changes["dependencies"] = [anchor(d) if isinstance(d, str) else d for d in spec.dependencies]
    return attrs.evolve(spec, **changes)


def user_config_path() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config"
    return Path(base) / "shoal" / "config.yaml"


def config_layers(cwd: str | os.PathLike | None = None) -> list[tuple[str, Path]]:
    """The configuration files that exist, lowest precedence first, with their names."""
    candidates = [("project", Path(cwd or Path.cwd()) / "shoal.yaml"), ("user", user_config_path())]
    if os.environ.get("SHOAL_CONFIG"):
        candidates.append(("SHOAL_CONFIG", Path(os.environ["SHOAL_CONFIG"])))
    found = []
    for name, path in candidates:
        if path.exists():
            found.append((name, path))
        elif name == "SHOAL_CONFIG":
            raise ConfigError(f"$SHOAL_CONFIG names {path}, which does not exist")
    return found


def merge(*specs: JobSpec) -> JobSpec:
    """Later specs win key by key; mappings (hyperparameters, inputs...) are replaced whole."""
    merged: dict = {}
    for spec in specs:
        merged.update(spec.to_dict())
    return JobSpec(**merged)


def resolve(job_file=None, flags: Mapping | None = None, cwd=None) -> JobSpec:
    """The effective job: config layers, then the job file, then flags (``None`` = not given)."""
    layers = [load_spec(path) for _, path in config_layers(cwd)]
    if job_file:
        layers.append(load_spec(job_file))
    layers.append(parse_spec({k: v for k, v in (flags or {}).items() if v is not None}, "flags"))
    return merge(*layers)


LOCAL_ROLE = "arn:aws:iam::000000000000:role/shoal-local"
# JobSpec keys that are not estimator arguments.
NOT_ESTIMATOR_KEYS = ("framework", "inputs", "job_name", "region", "processes_per_host",
                      "local_network", "local_link", "backend", "slurm")


def local_environment(spec: JobSpec) -> dict[str, str]:
    """What a local job's supervisor reads from its environment for ``local_network`` and
    ``local_link`` (set in the process that submits it, which the supervisor inherits)."""
    out = {}
    if spec.local_network:
        out["SHOAL_LOCAL_NETWORK"] = spec.local_network
    if spec.local_link:
        from shoal.local.network.links import LinkSpec

        LinkSpec.parse(spec.local_link)  # refused here, not in the job
        out["SHOAL_LOCAL_LINK"] = spec.local_link
    return out


def estimator_kwargs(spec: JobSpec) -> dict:
    """The estimator's keyword arguments for ``spec`` (pure)."""
    kwargs = {k: v for k, v in spec.to_dict().items() if k not in NOT_ESTIMATOR_KEYS}
    if spec.processes_per_host:
        # The launcher's knob on SageMaker and locally alike (default: one per GPU, else 1).
        kwargs["hyperparameters"] = {**(spec.hyperparameters or {}),
                                     PROCESSES_PER_HOST_HP: spec.processes_per_host}
    if (spec.is_local or spec.on_slurm) and not spec.role:
        kwargs["role"] = LOCAL_ROLE  # a local job assumes no role; the API shape needs one
    return kwargs


def build_estimator(spec: JobSpec, sagemaker_session=None):
    """The estimator the job file describes (``framework`` picks the class)."""
    import shoal

    if sagemaker_session is None and spec.on_slurm:
        sagemaker_session = shoal.Session(backend="slurm", slurm=spec.slurm)
    elif sagemaker_session is None and spec.region:
        import boto3

        sagemaker_session = shoal.Session(boto_session=boto3.Session(region_name=spec.region))
    name = {"pytorch": "PyTorch", "tensorflow": "TensorFlow", "estimator": "Estimator"}
    cls = getattr(shoal, name[spec.framework or "pytorch"])
    kwargs = estimator_kwargs(spec)
    if sagemaker_session is not None:
        kwargs["sagemaker_session"] = sagemaker_session
    return cls(**kwargs)
