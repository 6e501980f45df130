"""The estimator's ``distribution`` dict, parsed once into typed, validated configuration.

Users port from the SageMaker Python SDK v2 and write the same dict:
``{"smdistributed": {"dataparallel": {"enabled": True}}}``, ``{"mpi": {...}}``,
``{"torch_distributed": {...}}``, ``{"pytorchddp": {...}}``, ``{"parameter_server": {...}}``,
``{"multi_worker_mirrored_strategy": {...}}``, ``{"instance_groups": [...]}``.
:func:`parse_distribution` checks it against v2's rules (and rejects, earlier and more
clearly, what the service or the containers would reject later) and returns a frozen
:class:`Distribution`, which knows the hyperparameters v2 adds for it, the runner the
training container picks, and how to read itself back from a described job.
"""

from __future__ import annotations

import difflib
import json
import logging
import shlex
from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from shoal import frameworks, secrets
from shoal.errors import DistributionError
from shoal.smp import ModelParallelParameters, parse_parameters

log = logging.getLogger(__name__)

# Hyperparameter names: the training containers read exactly these.
HP_INSTANCE_GROUPS = "sagemaker_distribution_instance_groups"
HP_PARAMETER_SERVER = "sagemaker_parameter_server_enabled"
HP_MPI_ENABLED = "sagemaker_mpi_enabled"
HP_MPI_PROCESSES_PER_HOST = "sagemaker_mpi_num_of_processes_per_host"
HP_MPI_CUSTOM_OPTIONS = "sagemaker_mpi_custom_mpi_options"
HP_SMDDP_ENABLED = "sagemaker_distributed_dataparallel_enabled"
HP_SMDDP_CUSTOM_OPTIONS = "sagemaker_distributed_dataparallel_custom_mpi_options"
HP_INSTANCE_TYPE = "sagemaker_instance_type"
HP_MP_PARAMETERS = "mp_parameters"
HP_MWMS = "sagemaker_multi_worker_mirrored_strategy_enabled"
HP_TORCH_DISTRIBUTED = "sagemaker_torch_distributed_enabled"
HP_PYTORCH_DDP = "sagemaker_pytorch_ddp_enabled"

#: Every hyperparameter a distribution may add.
HYPERPARAMETER_NAMES = (
    HP_INSTANCE_GROUPS, HP_PARAMETER_SERVER, HP_MPI_ENABLED, HP_MPI_PROCESSES_PER_HOST,
    HP_MPI_CUSTOM_OPTIONS, HP_SMDDP_ENABLED, HP_SMDDP_CUSTOM_OPTIONS, HP_INSTANCE_TYPE,
    HP_MP_PARAMETERS, HP_MWMS, HP_TORCH_DISTRIBUTED, HP_PYTORCH_DDP,
)  # fmt: skip

#: Top-level keys each estimator accepts (None: a generic estimator with a custom image).
STRATEGY_KEYS: dict[str | None, tuple[str, ...]] = {
    "pytorch": ("smdistributed", "mpi", "torch_distributed", "pytorchddp", "instance_groups"),
    "tensorflow": (
        "smdistributed", "mpi", "parameter_server", "multi_worker_mirrored_strategy",
        "instance_groups",
    ),
    None: ("smdistributed", "mpi", "parameter_server", "instance_groups"),
}  # fmt: skip
_ALL_KEYS = (
    "smdistributed", "mpi", "torch_distributed", "pytorchddp", "parameter_server",
    "multi_worker_mirrored_strategy", "instance_groups", "pytorchxla",
)  # fmt: skip
_SMDISTRIBUTED_KEYS = ("dataparallel", "modelparallel")
# Environment variables whose values are AWS credentials: never forwarded to ranks.
CREDENTIAL_VARIABLES = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN",
                        "AWS_SECURITY_TOKEN")  # fmt: skip
# The service's limit on one hyperparameter value.
MAX_HYPERPARAMETER_VALUE = 2500

#: What ``Distribution.runner`` returns. ``pytorchddp`` runs on the data-parallel launcher
#: ("smddp"), as the PyTorch containers do.
RUNNERS = ("process", "mpi", "smddp", "torch_distributed", "parameter_server", "mwms")


def where(*path: str) -> str:
    """The user-facing path of a key: ``distribution['mpi']['enabled']``."""
    return "distribution" + "".join(f"[{key!r}]" for key in path)


# ---------------------------------------------------------------- the typed configuration


@attrs.frozen
class Toggle:
    """A strategy that is only switched on or off (torch_distributed, parameter_server, ...)."""

    enabled: bool = False


@attrs.frozen
class DataParallel:
    """``smdistributed.dataparallel`` (also what ``pytorchddp`` becomes)."""

    enabled: bool = False
    custom_mpi_options: str | None = None


@attrs.frozen
class ModelParallel:
    """``smdistributed.modelparallel``: the library and its parameters."""

    enabled: bool = False
    parameters: ModelParallelParameters | None = None


@attrs.frozen
class SMDistributed:
    """``smdistributed``: one of the two libraries."""

    dataparallel: DataParallel | None = None
    modelparallel: ModelParallel | None = None


@attrs.frozen
class MPI:
    """``mpi``: launch the script with mpirun."""

    enabled: bool = False
    processes_per_host: int | None = None
    custom_mpi_options: str | None = None


@attrs.frozen
class Distribution:
    """A parsed, validated ``distribution``. Build it with :func:`parse_distribution`."""

    framework: str | None = None
    instance_type: str | None = None
    smdistributed: SMDistributed | None = None
    mpi: MPI | None = None
    torch_distributed: Toggle | None = None
    pytorchddp: Toggle | None = None  # only from a described job's hyperparameters
    parameter_server: Toggle | None = None
    multi_worker_mirrored_strategy: Toggle | None = None
    instance_groups: tuple[str, ...] | None = None

    @property
    def smdataparallel_enabled(self) -> bool:
        dp = self.smdistributed.dataparallel if self.smdistributed else None
        return bool(dp and dp.enabled)

    @property
    def modelparallel_enabled(self) -> bool:
        mp = self.smdistributed.modelparallel if self.smdistributed else None
        return bool(mp and mp.enabled)

    @property
    def mpi_enabled(self) -> bool:
        return bool(self.mpi and self.mpi.enabled)

    @property
    def torch_distributed_enabled(self) -> bool:
        return bool(self.torch_distributed and self.torch_distributed.enabled)

    @property
    def parameter_server_enabled(self) -> bool:
        return bool(self.parameter_server and self.parameter_server.enabled)

    @property
    def mwms_enabled(self) -> bool:
        return bool(
            self.multi_worker_mirrored_strategy and self.multi_worker_mirrored_strategy.enabled
        )

    @property
    def mp_parameters(self) -> dict[str, Any] | None:
        """The model-parallel parameters sent as ``mp_parameters``, or None."""
        mp = self.smdistributed.modelparallel if self.smdistributed else None
        if mp and mp.enabled and mp.parameters is not None and mp.parameters.values:
            return mp.parameters.to_dict()
        return None

    @property
    def runner(self) -> str:
        """How the training container launches the script, in the containers' order.

        One of RUNNERS. The containers run a parameter server only with more than one
        host; on one host the script runs as one process.
        """
        if self.framework == "tensorflow" and self.parameter_server_enabled:
            return "parameter_server"
        if self.framework == "tensorflow" and self.mwms_enabled:
            return "mwms"
        if self.mpi_enabled:
            return "mpi"
        if self.smdataparallel_enabled or (self.pytorchddp and self.pytorchddp.enabled):
            return "smddp"  # pytorchddp runs on the data-parallel launcher, as in v2
        if self.torch_distributed_enabled:
            return "torch_distributed"
        if self.parameter_server_enabled:
            return "parameter_server"
        return "process"

    @property
    def processes_per_host(self) -> int | None:
        """Ranks per host when ``mpi`` fixes them; None means one per GPU (or one)."""
        return self.mpi.processes_per_host if self.mpi_enabled else None

    def hyperparameters(self) -> dict[str, Any]:
        """Exactly the hyperparameters v2 adds for this distribution (values not JSON-encoded)."""
        return _hyperparameters(self)

    def to_dict(self) -> dict[str, Any]:
        """The canonical distribution dict; ``parse_distribution`` accepts it back."""
        return _to_dict(self)

    @classmethod
    def from_hyperparameters(
        cls, hyperparameters: Mapping[str, str], framework: str | None = None
    ) -> Distribution:
        """The distribution of a described job, from its JSON-encoded hyperparameters."""
        return _from_hyperparameters(hyperparameters, framework)


# ---------------------------------------------------------------- parsing the loose dict


def parse_distribution(
    raw: Mapping[str, Any] | None,
    framework: str | None = None,
    framework_version: str | None = None,
    py_version: str | None = None,
    instance_type: str | None = None,
    instance_count: int | None = None,
    image_uri: str | None = None,
    instance_groups: Sequence[Any] | None = None,
    entry_point: str | None = None,
) -> Distribution:
    """Parse and validate the user's ``distribution`` for this estimator.

    ``framework`` is "pytorch", "tensorflow" or None (a generic estimator with ``image_uri``);
    an ``image_uri`` relaxes the framework/Python version checks the way v2 does.
    ``instance_groups`` are the estimator's InstanceGroup-like objects (with
    ``instance_group_name``, ``instance_type``, ``instance_count``). ``entry_point``, when
    given, must be a Python file for ``torch_distributed``. Raises DistributionError.
    """
    if framework not in STRATEGY_KEYS:
        raise DistributionError(
            f"framework must be one of {list(STRATEGY_KEYS)} (got {framework!r})"
        )
    if raw is None:
        raw = {}
    if not isinstance(raw, Mapping):
        raise DistributionError(f"distribution must be a dict (got {raw!r})")
    _check_top_keys(raw, framework)
    groups = _resolve_instance_groups(raw.get("instance_groups"), instance_groups)
    dist = _build(raw, framework, instance_type, groups)
    context = _Context(framework, framework_version, py_version, image_uri, entry_point)
    if groups is None:
        _check_for_instance_type(raw, dist, instance_type, context)
    else:
        for group in groups:
            _check_for_instance_type(raw, dist, group.instance_type, context)
    _check_combinations(dist, context, instance_type, instance_groups)
    hosts = instance_count if groups is None else sum(g.instance_count for g in groups)
    _check_model_parallel_layout(dist, hosts)
    return dist


@attrs.frozen
class _Context:
    framework: str | None
    framework_version: str | None
    py_version: str | None
    image_uri: str | None
    entry_point: str | None


def _check_top_keys(raw: Mapping[str, Any], framework: str | None) -> None:
    allowed = STRATEGY_KEYS[framework]
    for key in raw:
        if key in allowed:
            continue
        if key == "pytorchxla":
            raise DistributionError(
                f"{where('pytorchxla')}: distributed training through PyTorch XLA needs "
                "SageMaker Training Compiler, which Shoal does not provide"
            )
        if key == "multi_worker_mirrored_strategy":
            raise DistributionError(
                f"{where(key)}: MultiWorkerMirroredStrategy is only supported by the "
                f"TensorFlow estimator (framework='tensorflow'), not {framework!r}"
            )
        if key in _ALL_KEYS:
            raise DistributionError(_wrong_framework(key, framework, allowed))
        raise DistributionError(
            f"distribution has an unknown key {key!r}{_did_you_mean(key, _ALL_KEYS)} "
            f"(this estimator accepts {list(allowed)})"
        )


def _wrong_framework(key: str, framework: str | None, allowed) -> str:
    owners = [fw for fw, keys in STRATEGY_KEYS.items() if fw and key in keys]
    name = framework or "a generic estimator"
    if key == "parameter_server" and framework == "pytorch":
        return (
            f"{where(key)}: the PyTorch containers have no parameter server; "
            f"use one of {list(allowed)}"
        )
    return f"{where(key)} is only supported by the {' and '.join(owners)} estimator, not {name}"


def _did_you_mean(key: Any, known: Sequence[str]) -> str:
    close = difflib.get_close_matches(str(key), list(known), n=1, cutoff=0.6)
    return f": did you mean {close[0]!r}?" if close else ""


def _section(raw: Mapping[str, Any], key: str, allowed: Sequence[str], *path: str,
             noun: str = "key", listing: str = "allowed") -> dict:
    value = raw[key]
    here = where(*path, key)
    if not isinstance(value, Mapping):
        raise DistributionError(f"{here} must be a dict (got {value!r})")
    for sub in value:
        if sub not in allowed:
            raise DistributionError(
                f"{here} has an unknown {noun} {sub!r}{_did_you_mean(sub, allowed)} "
                f"({listing}: {list(allowed)})"
            )
    return dict(value)


def _enabled(section: Mapping[str, Any], *path: str) -> bool:
    value = section.get("enabled", False)
    if not isinstance(value, bool):
        raise DistributionError(f"{where(*path, 'enabled')} must be a bool (got {value!r})")
    return value


def _build(raw, framework, instance_type, groups) -> Distribution:
    if "pytorchddp" in raw and "smdistributed" in raw:
        raise DistributionError(
            "distribution cannot hold both 'pytorchddp' and 'smdistributed': pytorchddp "
            "runs on smdistributed.dataparallel; keep one of them"
        )
    return Distribution(
        framework=framework,
        instance_type=instance_type,
        smdistributed=_build_smdistributed(raw, framework),
        mpi=_build_mpi(raw),
        torch_distributed=_build_toggle(raw, "torch_distributed"),
        parameter_server=_build_toggle(raw, "parameter_server"),
        multi_worker_mirrored_strategy=_build_toggle(raw, "multi_worker_mirrored_strategy"),
        instance_groups=None if groups is None else tuple(g.instance_group_name for g in groups),
    )


def _build_toggle(raw, key: str) -> Toggle | None:
    if key not in raw:
        return None
    return Toggle(_enabled(_section(raw, key, ("enabled",)), key))


def _build_mpi(raw) -> MPI | None:
    if "mpi" not in raw:
        return None
    section = _section(raw, "mpi", ("enabled", "processes_per_host", "custom_mpi_options"))
    processes = section.get("processes_per_host")
    if processes is not None:
        if isinstance(processes, bool) or not isinstance(processes, int):
            raise DistributionError(
                f"{where('mpi', 'processes_per_host')} must be an int (got {processes!r})"
            )
        if processes < 1:
            raise DistributionError(
                f"{where('mpi', 'processes_per_host')} must be >= 1 (got {processes!r})"
            )
    options = _mpi_options(section.get("custom_mpi_options"), "mpi")
    return MPI(_enabled(section, "mpi"), processes, options)


def _build_smdistributed(raw, framework) -> SMDistributed | None:
    if "pytorchddp" in raw:  # v2 runs pytorchddp as smdistributed.dataparallel
        return SMDistributed(dataparallel=_build_dataparallel(raw, ("pytorchddp",)))
    if "smdistributed" not in raw:
        return None
    section = _section(raw, "smdistributed", _SMDISTRIBUTED_KEYS,
                       noun="strategy", listing="supported")
    if len(section) > 1:
        raise DistributionError(
            f"{where('smdistributed')} holds {sorted(section)}: use one smdistributed "
            f"strategy at a time, one of {list(_SMDISTRIBUTED_KEYS)}"
        )
    dp = _build_dataparallel(section, ("smdistributed", "dataparallel"))
    mp = _build_modelparallel(section, raw, framework)
    return SMDistributed(dataparallel=dp, modelparallel=mp)


def _build_dataparallel(parent, path: tuple[str, ...]) -> DataParallel | None:
    key = path[-1]
    if key not in parent:
        return None
    section = _section(parent, key, ("enabled", "custom_mpi_options"), *path[:-1])
    options = _mpi_options(section.get("custom_mpi_options"), *path)
    return DataParallel(_enabled(section, *path), options)


def _build_modelparallel(section, raw, framework) -> ModelParallel | None:
    path = ("smdistributed", "modelparallel")
    if "modelparallel" not in section:
        return None
    mp = _section(section, "modelparallel", ("enabled", "parameters"), "smdistributed")
    enabled = _enabled(mp, *path)
    torchrun = _torch_distributed_requested(raw)
    parameters = None
    if "parameters" in mp:
        parameters = parse_parameters(
            mp["parameters"],
            where=where(*path, "parameters"),
            framework=framework,
            torchrun=torchrun,
        )
        _check_hyperparameter_size(parameters.to_dict(), where(*path, "parameters"))
    return ModelParallel(enabled, parameters)


def _torch_distributed_requested(raw) -> bool:
    section = raw.get("torch_distributed")
    return isinstance(section, Mapping) and section.get("enabled") is True


def _mpi_options(value: Any, *path: str) -> str | None:
    """Check custom mpirun options: a string that forwards no credential or secret to the ranks.

    The options travel as a hyperparameter, which the service stores and shows: messages
    name the variable, never its value.
    """
    if value is None:
        return None
    here = where(*path, "custom_mpi_options")
    if not isinstance(value, str):
        raise DistributionError(f"{here} must be a str (got {value!r})")
    try:
        tokens = shlex.split(value)
    except ValueError as exc:
        raise DistributionError(f"{here} is not a valid mpirun option string ({exc})") from exc
    for name in CREDENTIAL_VARIABLES:
        if any(name in token for token in tokens):
            raise DistributionError(
                f"{here} must not forward {name} to the ranks: "
                "credentials reach the job through its IAM role"
            )
    _check_exported_secrets(tokens, here)
    _check_hyperparameter_size(value, here)
    return value


def _check_exported_secrets(tokens: list[str], here: str) -> None:
    kind = secrets.value_kind(" ".join(tokens))
    if kind:
        raise DistributionError(f"{here} holds what looks like a secret ({kind})")
    for flag, assignment in zip(tokens, tokens[1:]):
        name, has_value, val = assignment.partition("=")
        if flag in ("-x", "--x") and has_value and val and secrets.secret_key_name(name):
            raise DistributionError(
                f"{here} sets {name} on the command line (a secret-looking variable): "
                "the options are stored with the job; pass the secret another way"
            )


def _check_hyperparameter_size(value: Any, here: str) -> None:
    size = len(json.dumps(value))
    if size > MAX_HYPERPARAMETER_VALUE:
        raise DistributionError(
            f"{here} must encode to <= {MAX_HYPERPARAMETER_VALUE} characters as a "
            f"hyperparameter (got {size})"
        )


# ---------------------------------------------------------------- instance groups


def _resolve_instance_groups(requested: Any, groups: Sequence[Any] | None):
    """The estimator's groups that train, as v2 picks them (None: not heterogeneous)."""
    if requested is None:
        requested = []
    if not isinstance(requested, (list, tuple)):
        raise DistributionError(
            f"{where('instance_groups')} must be a list of instance groups (got {requested!r})"
        )
    if groups is None:
        if requested:
            raise DistributionError(
                f"{where('instance_groups')} names training groups, but the estimator "
                "has no instance_groups"
            )
        return None
    groups = list(groups)
    if len(requested) > len(groups):
        raise DistributionError(
            f"{where('instance_groups')} lists {len(requested)} groups, more than the "
            f"estimator's {len(groups)}"
        )
    if not requested:
        if len(groups) == 1:
            return groups  # one group trains without being named, as in v2
        raise DistributionError(_one_group_message(groups, requested))
    if len(groups) > 1 and len(requested) != 1:
        raise DistributionError(_one_group_message(groups, requested))
    return [_find_group(item, groups) for item in requested]


def _one_group_message(groups, requested) -> str:
    names = [g.instance_group_name for g in groups]
    return (
        f"{where('instance_groups')} must name exactly one of the estimator's "
        f"instance groups {names} (got {len(requested)})"
    )


def _find_group(item: Any, groups: list[Any]):
    name = item if isinstance(item, str) else getattr(item, "instance_group_name", None)
    if not isinstance(name, str):
        raise DistributionError(
            f"{where('instance_groups')} must hold instance group names or InstanceGroup "
            f"objects (got {item!r})"
        )
    names = [g.instance_group_name for g in groups]
    for group in groups:
        if group is item or (name is not None and group.instance_group_name == name):
            return group
    raise DistributionError(
        f"{where('instance_groups')} names {name!r}, which is not one of the estimator's "
        f"instance groups {names}{_did_you_mean(name, names)}"
    )


# ---------------------------------------------------------------- v2's rules


def _check_for_instance_type(raw, dist: Distribution, instance_type, context: _Context) -> None:
    """The rules v2 applies per training instance type (each group's, when heterogeneous)."""
    _check_trainium(raw, instance_type)
    _check_smddp(dist, instance_type, context, "pytorchddp" in raw)
    if context.framework == "pytorch":
        _check_torch_distributed(dist, instance_type, context)
    if dist.parameter_server_enabled and frameworks.is_multi_gpu_instance(instance_type):
        log.warning(
            "A parameter server uses one GPU per host: on %s the other GPUs stay idle. "
            "Consider 'smdistributed' dataparallel or 'mpi' instead.",
            instance_type,
        )


def _check_trainium(raw, instance_type) -> None:
    if not frameworks.is_trainium_instance(instance_type) or not raw:
        return
    keys = list(raw)
    if len(keys) > 1 or keys[0] not in frameworks.TRAINIUM_STRATEGIES:
        raise DistributionError(
            f"distribution {keys} is not supported on Trainium instances ({instance_type}): "
            f"use exactly one of {list(frameworks.TRAINIUM_STRATEGIES)}"
        )


def _check_smddp(dist: Distribution, instance_type, context: _Context, ddp: bool) -> None:
    if not dist.smdataparallel_enabled:
        return
    problems = []
    if not instance_type:
        problems.append("it needs an instance_type")
    if not context.image_uri and context.framework is not None:
        supported = frameworks.smddp_versions(context.framework)
        version = context.framework_version
        if version not in supported:
            problems.append(_version_problem(version, supported, "the data-parallel library"))
        if not frameworks.is_python3(context.py_version):
            problems.append(f"py_version {context.py_version!r} is not supported: use py3 or later")
    if problems:
        here = where("pytorchddp") if ddp else where("smdistributed", "dataparallel")
        raise DistributionError(f"{here}: " + "; ".join(problems))


def _version_problem(version, supported: Sequence[str], what: str) -> str:
    hint = frameworks.suggest_version(version, tuple(supported)) if version else None
    hint_text = f" (did you mean {hint!r}?)" if hint else ""
    return (
        f"framework_version {version!r} is not supported by {what}{hint_text}; "
        f"supported: {list(supported)}"
    )


def _check_torch_distributed(dist: Distribution, instance_type, context: _Context) -> None:
    if not dist.torch_distributed_enabled:
        return
    problems = []
    if not context.image_uri:
        if not frameworks.is_python3(context.py_version):
            problems.append(f"py_version {context.py_version!r} is not supported: use py3 or later")
        supported = frameworks.torch_distributed_versions(instance_type)
        if supported is None:
            problems.append(f"it runs only on GPU and Trainium instances (got {instance_type!r})")
        elif context.framework_version not in supported:
            problems.append(
                _version_problem(
                    context.framework_version, supported, f"torch_distributed on {instance_type}"
                )
            )
    if context.entry_point is not None and not str(context.entry_point).endswith(".py"):
        problems.append(
            f"the entry point must be a Python file (*.py) (got {context.entry_point!r})"
        )
    if problems:
        raise DistributionError(f"{where('torch_distributed')}: " + "; ".join(problems))


def _check_combinations(dist: Distribution, context: _Context, instance_type, groups) -> None:
    """The rules v2 applies when it builds the hyperparameters, and Shoal's own."""
    if dist.smdistributed is not None:
        _check_p5_and_image(dist, context, instance_type, groups)
    if dist.modelparallel_enabled and not dist.torch_distributed_enabled and not dist.mpi_enabled:
        raise DistributionError(
            f"{where('smdistributed', 'modelparallel')} runs under MPI: add "
            "'mpi': {'enabled': True, 'processes_per_host': <GPUs per host>} "
            "(or, for the PyTorch library launched by torchrun, 'torch_distributed')"
        )
    if dist.torch_distributed_enabled and dist.mpi_enabled:
        # v2 would silently drop 'mpi' and the container would run torchrun.
        raise DistributionError(
            f"{where('torch_distributed')} and {where('mpi')} both launch the training "
            "script: enable one of them"
        )
    if dist.mwms_enabled:
        _check_mwms(dist, context)
    _check_groups_have_strategy(dist)


def _check_model_parallel_layout(dist: Distribution, hosts: int | None) -> None:
    """The MPI-launched library splits the ranks into pipeline x tensor x data groups."""
    if not (dist.modelparallel_enabled and dist.mpi_enabled) or dist.torch_distributed_enabled:
        return
    params = dist.smdistributed.modelparallel.parameters
    processes = dist.mpi.processes_per_host
    if params is None or not processes or not isinstance(hosts, int) or hosts < 1:
        return
    ranks = processes * hosts
    model = params.pipeline_parallel_degree * params.tensor_parallel_degree
    here = where("smdistributed", "modelparallel", "parameters")
    if ranks % model:
        raise DistributionError(
            f"{here}: pipeline_parallel_degree ({params.pipeline_parallel_degree}) x "
            f"tensor_parallel_degree ({params.tensor_parallel_degree}) = {model} must divide "
            f"the {ranks} ranks (processes_per_host {processes} x {hosts} hosts)"
        )
    sharded = params.get("sharded_data_parallel_degree", 1)
    if (ranks // model) % sharded:
        raise DistributionError(
            f"{here}: sharded_data_parallel_degree ({sharded}) must divide the data-parallel "
            f"degree ({ranks // model} = {ranks} ranks / {model} model-parallel ranks)"
        )


def _check_p5_and_image(dist: Distribution, context: _Context, instance_type, groups) -> None:
    if dist.torch_distributed_enabled:
        return
    if not frameworks.smdistributed_supports_image(context.image_uri):
        raise DistributionError(
            f"{where('smdistributed')} does not run on image {context.image_uri!r}: "
            "its CUDA is newer than the smdistributed libraries support"
        )
    types = (
        [instance_type]
        if isinstance(instance_type, str)
        else [g.instance_type for g in (groups or [])]
    )
    if any(frameworks.is_p5_instance(t) for t in types):
        raise DistributionError(
            f"{where('smdistributed')}: the model-parallel and data-parallel libraries do not "
            "support p5 instances (ml.p5.48xlarge); use 'torch_distributed'"
        )


def _check_mwms(dist: Distribution, context: _Context) -> None:
    if context.framework_version is not None and not frameworks.mwms_supports(
        context.framework_version
    ):
        raise DistributionError(
            f"{where('multi_worker_mirrored_strategy')} needs TensorFlow >= "
            f"{frameworks.MWMS_MIN_TENSORFLOW_VERSION} (got {context.framework_version!r})"
        )
    others = [k for k in ("smdistributed", "parameter_server") if getattr(dist, k) is not None]
    if others:
        raise DistributionError(
            f"{where('multi_worker_mirrored_strategy')} cannot be combined with {others}"
        )


def _check_groups_have_strategy(dist: Distribution) -> None:
    # v2 checks this only where it builds the generic hyperparameters: not for PyTorch's
    # torch_distributed without smdistributed.
    if not dist.instance_groups:
        return
    if dist.framework == "pytorch" and dist.torch_distributed_enabled and not dist.smdistributed:
        return
    if not (dist.mpi_enabled or dist.smdataparallel_enabled):
        raise DistributionError(
            f"{where('instance_groups')} {list(dist.instance_groups)} needs a strategy that "
            "launches across the group: enable 'mpi' or smdistributed 'dataparallel'"
        )


# ---------------------------------------------------------------- hyperparameters


def _hyperparameters(dist: Distribution) -> dict[str, Any]:
    if dist.framework == "pytorch" or dist.pytorchddp is not None:
        if dist.pytorchddp is not None and dist.pytorchddp.enabled:
            hps: dict[str, Any] = {HP_PYTORCH_DDP: True}
            if dist.instance_type is not None:
                hps[HP_INSTANCE_TYPE] = dist.instance_type
            return hps
        if dist.torch_distributed_enabled:
            hps = _generic_hyperparameters(dist) if dist.smdistributed is not None else {}
            hps[HP_TORCH_DISTRIBUTED] = True
            if dist.instance_type is not None:
                hps[HP_INSTANCE_TYPE] = dist.instance_type
            return hps
    return _generic_hyperparameters(dist)


def _generic_hyperparameters(dist: Distribution) -> dict[str, Any]:
    hps: dict[str, Any] = {}
    if dist.instance_groups is not None:
        hps[HP_INSTANCE_GROUPS] = list(dist.instance_groups)
    if dist.parameter_server is not None:
        hps[HP_PARAMETER_SERVER] = dist.parameter_server.enabled
    if dist.mpi is not None:
        hps[HP_MPI_ENABLED] = dist.mpi.enabled
        if dist.mpi.processes_per_host:
            hps[HP_MPI_PROCESSES_PER_HOST] = dist.mpi.processes_per_host
        hps[HP_MPI_CUSTOM_OPTIONS] = dist.mpi.custom_mpi_options or ""
    if dist.smdistributed is not None:
        if dist.mp_parameters:
            hps[HP_MP_PARAMETERS] = dist.mp_parameters
        hps[HP_SMDDP_ENABLED] = dist.smdataparallel_enabled
        hps[HP_INSTANCE_TYPE] = dist.instance_type
        if dist.smdataparallel_enabled:
            hps[HP_SMDDP_CUSTOM_OPTIONS] = dist.smdistributed.dataparallel.custom_mpi_options or ""
    if dist.multi_worker_mirrored_strategy is not None:
        hps[HP_MWMS] = dist.multi_worker_mirrored_strategy.enabled
    return hps


# ---------------------------------------------------------------- canonical dict and back


def _to_dict(dist: Distribution) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if dist.smdistributed is not None:
        out["smdistributed"] = _smdistributed_dict(dist.smdistributed)
    if dist.mpi is not None:
        out["mpi"] = _drop_none(attrs.asdict(dist.mpi))
    for key in (
        "torch_distributed",
        "pytorchddp",
        "parameter_server",
        "multi_worker_mirrored_strategy",
    ):
        toggle = getattr(dist, key)
        if toggle is not None:
            out[key] = {"enabled": toggle.enabled}
    if dist.instance_groups is not None:
        out["instance_groups"] = list(dist.instance_groups)
    return out


def _smdistributed_dict(smd: SMDistributed) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if smd.dataparallel is not None:
        out["dataparallel"] = _drop_none(attrs.asdict(smd.dataparallel))
    if smd.modelparallel is not None:
        mp: dict[str, Any] = {"enabled": smd.modelparallel.enabled}
        if smd.modelparallel.parameters is not None:
            mp["parameters"] = smd.modelparallel.parameters.to_dict()
        out["modelparallel"] = mp
    return out


def _drop_none(values: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in values.items() if v is not None}


def _from_hyperparameters(hps: Mapping[str, str], framework: str | None) -> Distribution:
    values = {k: _decode(v) for k, v in hps.items() if k in HYPERPARAMETER_NAMES}
    if framework is None and (HP_TORCH_DISTRIBUTED in values or HP_PYTORCH_DDP in values):
        framework = "pytorch"
    groups = values.get(HP_INSTANCE_GROUPS)
    return Distribution(
        framework=framework,
        instance_type=values.get(HP_INSTANCE_TYPE),
        smdistributed=_smdistributed_from(values),
        mpi=_mpi_from(values),
        torch_distributed=_toggle_from(values, HP_TORCH_DISTRIBUTED),
        pytorchddp=_toggle_from(values, HP_PYTORCH_DDP),
        parameter_server=_toggle_from(values, HP_PARAMETER_SERVER),
        multi_worker_mirrored_strategy=_toggle_from(values, HP_MWMS),
        instance_groups=None if groups is None else tuple(groups),
    )


def _decode(value: Any) -> Any:
    if not isinstance(value, str):
        return value
    try:
        return json.loads(value)
    except json.JSONDecodeError:
        return value  # a value set by hand, not JSON-encoded


def _toggle_from(values: dict[str, Any], key: str) -> Toggle | None:
    return Toggle(values[key] is True) if key in values else None


def _mpi_from(values: dict[str, Any]) -> MPI | None:
    if HP_MPI_ENABLED not in values:
        return None
    return MPI(
        values[HP_MPI_ENABLED] is True,
        values.get(HP_MPI_PROCESSES_PER_HOST),
        values.get(HP_MPI_CUSTOM_OPTIONS) or None,
    )


def _smdistributed_from(values: dict[str, Any]) -> SMDistributed | None:
    if HP_MP_PARAMETERS in values:
        torchrun = values.get(HP_TORCH_DISTRIBUTED) is True
        params = ModelParallelParameters(values[HP_MP_PARAMETERS], torchrun=torchrun)
        return SMDistributed(modelparallel=ModelParallel(True, params))
    if HP_SMDDP_ENABLED not in values:
        return None
    enabled = values[HP_SMDDP_ENABLED] is True
    options = values.get(HP_SMDDP_CUSTOM_OPTIONS) or None
    return SMDistributed(dataparallel=DataParallel(enabled, options if enabled else None))
