"""The runtime's configuration: SMP v1's parameters, parsed once at ``smp.init``.

:func:`resolve` merges the JSON object in ``SM_HP_MP_PARAMETERS`` (what SageMaker hands
the training process) over the dict the script passes to ``smp.init`` (the environment
wins, key by key), checks every parameter against the table in
``shoal.modelparallel.parameters`` with SMP's own messages, and returns a frozen
:class:`Config`. HF ``transformers`` reads ``smp.state.cfg.<key>``, so every parameter is
an attribute under its SMP name.

A parameter this runtime does not implement is refused with ``SMPUnsupportedError``
rather than silently ignored (a script asking for it expects different numerics or memory
behaviour); today every SMP v1 PyTorch parameter is implemented or listed here. Parameters that only tune SMP's GPU machinery are
accepted and have no effect; :data:`ACCEPTED_WITHOUT_EFFECT` says why for each.
"""

from __future__ import annotations

import difflib
import json
import logging
import math
import os
import warnings
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

import attrs
from shoal.modelparallel.errors import SMPConfigError, SMPUnsupportedError
from shoal.modelparallel.parameters import (
    ALIASES,
    PLACEMENT_ALIASES,
    TENSOR_PLACEMENTS,
    V1_PARAMETERS,
    V2_PARAMETERS,
    v1_parameters,
)
from shoal.modelparallel.topology import check_divisible

ENV_VAR = "SM_HP_MP_PARAMETERS"

_LOG = logging.getLogger(__name__)
_TABLE = v1_parameters("pytorch")

# SMP checks types by exact type (so a bool is no int); an int is also taken for a float,
# and a float without fraction for a count (5e8 as written in SMP's own defaults).
_TYPES: Mapping[str, tuple[type, ...]] = MappingProxyType({
    "int": (int,),
    "count": (int, float),
    "float": (float, int),
    "bool": (bool,),
    "str": (str,),
    "choice": (str,),
})  # fmt: skip

# SMP's "requires": setting the first parameter to anything but its default needs the
# second to hold the given value.
_REQUIRES: tuple[tuple[str, str, Any], ...] = (
    ("tensor_parallel_degree", "ddp", True),
    ("sharded_data_parallel_degree", "pipeline_parallel_degree", 1),
    ("sharded_data_parallel_degree", "shard_optimizer_state", False),
    ("sharded_data_parallel_degree", "ddp", True),
    ("shard_optimizer_state", "ddp", True),
    ("ddp_port", "ddp", True),
    ("ddp_dist_backend", "ddp", True),
    ("prescaled_batch", "optimize", "speed"),
    ("bf16", "fp16", False),
    ("bf16", "fp16_params", False),
)

# Features of SMP that this runtime does not have, with the test for "asked for" (none
# today: the table is what refuses the next one by name).
_UNSUPPORTED: tuple[tuple[str, Any], ...] = ()

# Accepted so that scripts written for SMP run unchanged, with no effect here. Every
# other accepted parameter is in effect: the degrees, microbatches, pipeline and
# active_microbatches (the schedule), placement_strategy (the rank layout),
# auto_partition, default_partition and memory_weight (partitioning), ddp (torch
# process groups and gradient allreduce across replicas), tensor_parallel_degree,
# optimize, prescaled_batch and tensor_parallel_seed (smp.nn's distributed modules),
# offload_activations and activation_loading_horizon (offload.py),
# delayed_parameter_initialization (smp.model_creation, delayed.py),
# shard_optimizer_state (optstate.py), sharded_data_parallel_degree and the sdp_* keys
# (torch/sharded/).
ACCEPTED_WITHOUT_EFFECT: Mapping[str, str] = MappingProxyType({
    "ddp_dist_backend": "NCCL and SMDDP need GPUs; torch process groups use Shoal's backend",
    "ddp_port": "torch process groups run over Shoal's collective core, which opens no port",
    "skip_tracing": "only changes how auto-partitioning gathers its costs",
    "static_mode": "an SMP-internal shortcut for its GPU message exchange",
    "fast_mode": "an SMP-internal shortcut for its GPU message exchange",
    "deterministic_server": "orders a server's requests alike across replicas; no effect on results",
    "load_partition": "a TensorFlow partition file feature (internal to SMP)",
    "partition_file": "a TensorFlow partition file feature (internal to SMP)",
    "predefined_hooks": "Hugging Face models are translated by smp.nn's own registry",
})  # fmt: skip


def _default(key: str) -> Any:
    return V1_PARAMETERS[key].default


def _active_microbatches(value: int | None, self: Config) -> int:
    """SMP's default: two more than the pipeline's stages, at most every microbatch."""
    if value is None:
        return min(self.pipeline_parallel_degree + 2, self.microbatches)
    return value


def _effective_pipeline(self: Config) -> str:
    # SMP runs "simple" only when every microbatch may be in flight at once.
    if self.active_microbatches != self.microbatches:
        return "interleaved"
    return self.pipeline_requested


@attrs.frozen(kw_only=True)
class Config:
    """Every SMP v1 PyTorch parameter, under its SMP name, with SMP's defaults.

    ``pipeline_requested`` is the schedule asked for and ``pipeline`` the one that runs;
    ``active_microbatches`` is resolved (never None).
    """

    pipeline_parallel_degree: int = _default("pipeline_parallel_degree")
    microbatches: int = _default("microbatches")
    pipeline_requested: str = _default("pipeline")
    optimize: str = _default("optimize")
    placement_strategy: str = _default("placement_strategy")
    auto_partition: bool = _default("auto_partition")
    default_partition: int | None = _default("default_partition")
    load_partition: bool = _default("load_partition")
    partition_file: str | None = _default("partition_file")
    deterministic_server: bool = _default("deterministic_server")
    memory_weight: float = attrs.field(default=_default("memory_weight"), converter=float)
    ddp: bool = _default("ddp")
    ddp_port: int | None = _default("ddp_port")
    ddp_dist_backend: str = _default("ddp_dist_backend")
    active_microbatches: int = attrs.field(
        default=_default("active_microbatches"),
        converter=attrs.Converter(_active_microbatches, takes_self=True),
    )
    pipeline: str = attrs.field(
        init=False, default=attrs.Factory(_effective_pipeline, takes_self=True)
    )
    offload_activations: bool = _default("offload_activations")
    activation_loading_horizon: int = _default("activation_loading_horizon")
    tensor_parallel_degree: int = _default("tensor_parallel_degree")
    fp16: bool = _default("fp16")
    bf16: bool = _default("bf16")
    fp16_params: bool = _default("fp16_params")
    shard_optimizer_state: bool = _default("shard_optimizer_state")
    prescaled_batch: bool = _default("prescaled_batch")
    tensor_parallel_seed: int = _default("tensor_parallel_seed")
    skip_tracing: bool = _default("skip_tracing")
    delayed_parameter_initialization: bool = _default("delayed_parameter_initialization")
    static_mode: bool = _default("static_mode")
    fast_mode: bool = _default("fast_mode")
    predefined_hooks: bool = _default("predefined_hooks")
    sharded_data_parallel_degree: int = _default("sharded_data_parallel_degree")
    sdp_reduce_bucket_size: int = attrs.field(
        default=_default("sdp_reduce_bucket_size"), converter=int
    )
    sdp_param_persistence_threshold: int = attrs.field(
        default=_default("sdp_param_persistence_threshold"), converter=int
    )
    sdp_max_live_parameters: int = attrs.field(
        default=_default("sdp_max_live_parameters"), converter=int
    )
    sdp_hierarchical_allgather: bool = _default("sdp_hierarchical_allgather")
    sdp_gradient_clipping: float = attrs.field(
        default=_default("sdp_gradient_clipping"), converter=float
    )

    def __attrs_post_init__(self) -> None:
        values = self.to_dict()
        values["pipeline"] = self.pipeline_requested  # its choices are checked as asked
        for key, value in values.items():
            _check_value(key, value)
        self._check_rules()

    @property
    def partitions(self) -> int:
        """SMP's other name for ``pipeline_parallel_degree``."""
        return self.pipeline_parallel_degree

    @property
    def mp_size(self) -> int:
        """Processes holding one model replica: pipeline stages times tensor shards."""
        return self.pipeline_parallel_degree * self.tensor_parallel_degree

    def to_dict(self) -> dict[str, Any]:
        """Every parameter under its SMP name with the value in effect (table order)."""
        values = attrs.asdict(self)
        values.pop("pipeline_requested")
        return {key: values[key] for key in _TABLE if key in values}

    def _check_rules(self) -> None:
        for key, needed, wanted in _REQUIRES:
            _check_requires(self, key, needed, wanted)
        if not self.auto_partition and self.default_partition is None:
            raise SMPConfigError(
                "Setting config parameter auto_partition to non-default value False "
                "requires default_partition to not be None."
            )
        if self.default_partition is not None:
            _check_upper(
                "default_partition",
                self.default_partition,
                "pipeline_parallel_degree - 1",
                self.pipeline_parallel_degree - 1,
            )
        _check_upper(
            "active_microbatches", self.active_microbatches, "microbatches", self.microbatches
        )


def _check_requires(cfg: Config, key: str, needed: str, wanted: Any) -> None:
    value = getattr(cfg, key)
    if value != _default(key) and getattr(cfg, needed) != wanted:
        raise SMPConfigError(
            f"Setting config parameter {key} to non-default value {value} requires "
            f"{needed} to be set to {wanted}. Found: {getattr(cfg, needed)}"
        )


def _check_upper(key: str, value: Any, bound_name: str, bound: Any) -> None:
    if value > bound:
        raise SMPConfigError(
            f"Config parameter {key} ({value}) cannot be larger than {bound_name} ({bound})."
        )


def _options(key: str) -> tuple[str, ...]:
    if key == "placement_strategy":
        return PLACEMENT_ALIASES + TENSOR_PLACEMENTS
    return _TABLE[key].choices


def _check_value(key: str, value: Any) -> None:
    """One parameter's allowed values and bounds (types were checked on input)."""
    options = _options(key)
    if options and value not in options:
        raise SMPConfigError(
            f"Config parameter {key} must be one of {list(options)}. Found: {value}."
        )
    param = _TABLE[key]
    if value is None or param.kind not in ("int", "count", "float"):
        return
    if key == "memory_weight" and not 0.0 <= value <= 1.0:
        raise SMPConfigError("Memory weight must between 0.0 and 1.0.")
    if param.kind == "float" and not math.isfinite(value):
        raise SMPConfigError(f"Config parameter {key} must be a finite number. Found: {value}.")
    # Written as "not >=" so that NaN fails too.
    if param.minimum is not None and not value >= param.minimum:
        raise SMPConfigError(
            f"Config parameter {key} ({value}) cannot be less than {param.minimum}."
        )
    if param.maximum is not None and not value <= param.maximum:
        _check_upper(key, value, str(param.maximum), param.maximum)


def resolve(
    config: Mapping[str, Any] | None = None, environ: Mapping[str, str] | None = None
) -> Config:
    """The configuration of this process: ``config`` with ``SM_HP_MP_PARAMETERS`` over it.

    ``environ`` defaults to ``os.environ``. Raises SMPConfigError for an unknown, mistyped
    or out-of-range parameter and SMPUnsupportedError for a feature this runtime lacks.
    """
    values = _merge(config, os.environ if environ is None else environ)
    _resolve_aliases(values)
    for key, value in values.items():
        _check_known(key)
        _check_type(key, value)
    _fp16_params_alias(values)
    if "pipeline" in values:
        values["pipeline_requested"] = values.pop("pipeline")
    cfg = Config(**values)
    _refuse_unsupported(cfg)
    if cfg.pipeline != cfg.pipeline_requested:
        _LOG.info(
            "Simple pipeline is only supported when 'active_microbatches' is equal to "
            "'microbatches'. Using interleaved pipeline instead."
        )
    return cfg


def _merge(config: Mapping[str, Any] | None, environ: Mapping[str, str]) -> dict[str, Any]:
    if config is None:
        config = {}
    if not isinstance(config, Mapping):
        raise SMPConfigError(f"smp.init's config must be a dict. Found: {type(config).__name__}.")
    return {**config, **_from_environment(environ)}


def _from_environment(environ: Mapping[str, str]) -> dict[str, Any]:
    raw = environ.get(ENV_VAR)
    if raw is None:
        return {}
    try:
        parsed = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise SMPConfigError(f"{ENV_VAR} is not valid JSON ({exc}): {raw!r}") from exc
    if not isinstance(parsed, dict):
        raise SMPConfigError(f"{ENV_VAR} must hold a JSON object. Found: {type(parsed).__name__}.")
    return parsed


def _resolve_aliases(values: dict[str, Any]) -> None:
    for alias, name in ALIASES.items():
        if alias not in values:
            continue
        if name in values and values[name] != values[alias]:
            raise SMPConfigError(
                f"Conflicting values {values[name]} and {values[alias]} are provided for "
                f"config parameter {name} and its alias {alias}."
            )
        values[name] = values.pop(alias)


def _fp16_params_alias(values: dict[str, Any]) -> None:
    """SMP's deprecated ``fp16_params`` asks for ``fp16`` (left alone next to ``bf16``, whose
    rule then refuses it by name)."""
    if values.get("fp16_params") and not values.get("bf16"):
        warnings.warn("Config parameter fp16_params is deprecated and will be removed in a "
                      "future release; use fp16 instead.", FutureWarning, stacklevel=3)
        values["fp16"] = True


def _check_known(key: Any) -> None:
    if key in _TABLE and key not in ALIASES:
        return
    message = f"Unrecognized config parameter {key}."
    if key in V1_PARAMETERS:
        message += (
            f" {key} is a TensorFlow parameter of the model parallel library; "
            "smdistributed.modelparallel.torch does not take it."
        )
    elif key in V2_PARAMETERS:
        message += (
            f" {key} is a parameter of SMP v2 (torch.sagemaker, launched with "
            "torch_distributed), not of smdistributed.modelparallel."
        )
    else:
        close = difflib.get_close_matches(str(key), list(_TABLE), n=1, cutoff=0.6)
        if close:
            message += f" Did you mean {close[0]}?"
    raise SMPConfigError(message)


def _check_type(key: str, value: Any) -> None:
    kind = _TABLE[key].kind
    allowed = _TYPES[kind]
    if type(value) not in allowed:
        raise SMPConfigError(
            f"Config parameter {key} type needs to be one of "
            f"{[t.__name__ for t in allowed]}. Found: {type(value).__name__}."
        )
    if kind == "count" and not (isinstance(value, int) or value.is_integer()):
        raise SMPConfigError(f"Config parameter {key} must be a whole number. Found: {value}.")


def unsupported(cfg: Config) -> list[str]:
    """``name=value`` for each parameter ``cfg`` asks for that this runtime lacks."""
    return [f"{key}={getattr(cfg, key)}" for key, asked in _UNSUPPORTED if asked(getattr(cfg, key))]


def _refuse_unsupported(cfg: Config) -> None:
    refused = unsupported(cfg)
    if refused:
        raise SMPUnsupportedError(
            "Shoal's model-parallel runtime does not implement: "
            + ", ".join(refused)
            + ". Leave these parameters at their defaults."
        )


def validate_world(cfg: Config, size: int, local_size: int) -> None:
    """Check that ``size`` processes (``local_size`` on this host) can hold ``cfg``'s layout."""
    if size < 1 or not 1 <= local_size <= size:
        raise SMPConfigError(
            f"Invalid process counts: size={size}, local_size={local_size} "
            "(need 1 <= local_size <= size)."
        )
    check_divisible(size, cfg.pipeline_parallel_degree, cfg.tensor_parallel_degree)
