"""The ``CreateTrainingJob`` request. An estimator's arguments are parsed once into a
frozen, validated :class:`TrainingConfig` (the API's limits and the platform's rules,
checked before any call); what the estimator resolves for one job (name, role ARN,
image, output path, hyperparameters) is a :class:`Resolved`; :func:`build_request` turns
both and ``fit()``'s inputs into the request, key for key what the SageMaker Python SDK
v2 sends, optional keys omitted when unset. It does no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping

import attrs

from shoal import inputs as inputs_
from shoal import limits, secrets
from shoal.debugger import request as debugger
from shoal.errors import InputError, ValidationError
from shoal.frameworks import LOCAL_INSTANCE_TYPES, REMOTE_BACKENDS
from shoal.limits import between, boolean, fail, items, kms_key, one_of, s3_uri, text

# ---- converters and validators of the structured arguments ----

def _tags(value):
    """v2 accepts a dict or a list of ``{"Key", "Value"}``."""
    if value is None:
        return None
    if isinstance(value, Mapping):
        return tuple({"Key": str(k), "Value": str(v)} for k, v in value.items())
    return tuple(dict(tag) if isinstance(tag, Mapping) else tag for tag in value)


def _tag(_, name, tag):
    if not isinstance(tag, Mapping) or set(tag) != {"Key", "Value"}:
        fail(name, 'must be a dict with "Key" and "Value"', tag)
    text(limits.TAG_PATTERN, limits.TAG_KEY_MAX, min_len=1)(_, f"{name}.Key", tag["Key"])
    text(limits.TAG_PATTERN, limits.TAG_VALUE_MAX)(_, f"{name}.Value", tag["Value"])


def _metric(_, name, metric):
    if not isinstance(metric, Mapping) or set(metric) != {"Name", "Regex"}:
        fail(name, 'must be a dict with "Name" and "Regex"', metric)
    text(max_len=limits.METRIC_NAME_MAX, min_len=1)(_, f"{name}.Name", metric["Name"])
    text(max_len=limits.METRIC_REGEX_MAX, min_len=1)(_, f"{name}.Regex", metric["Regex"])


def _environment(_, attribute, env):
    if env is None:
        return
    if not isinstance(env, Mapping):
        fail("environment", "must be a dict", env)
    if len(env) > limits.ENVIRONMENT_MAX:
        fail("environment", f"must have at most {limits.ENVIRONMENT_MAX} entries",
             limits.Count(len(env)))
    for key, value in env.items():
        text(limits.ENVIRONMENT_KEY_PATTERN, limits.ENVIRONMENT_KEY_MAX)(_, "environment key", key)
        text(max_len=limits.ENVIRONMENT_VALUE_MAX)(_, f"environment[{key!r}]", value)


def _hook_config(_, attribute, value):
    from shoal.debugger import DebuggerHookConfig

    if not (value is None or isinstance(value, (bool, Mapping, DebuggerHookConfig))):
        fail("debugger_hook_config", "must be a bool, a DebuggerHookConfig or the request's "
             "DebugHookConfig dict", value)


def _tensorboard_config(_, attribute, value):
    from shoal.debugger import TensorBoardOutputConfig

    if value is not None and not isinstance(value, TensorBoardOutputConfig):
        fail("tensorboard_output_config", "must be a TensorBoardOutputConfig", value)


def _optional_tuple(value):
    return None if value is None else tuple(value)


def _instance_types(_, attribute, value):
    one_of(limits.INSTANCE_TYPES + LOCAL_INSTANCE_TYPES)(_, attribute, value)


@attrs.frozen
class InstanceGroup:
    """A named group of instances of one type (heterogeneous clusters), as v2's."""

    instance_group_name: str = attrs.field(
        validator=text(max_len=limits.INSTANCE_GROUP_NAME_MAX, min_len=1))
    instance_type: str = attrs.field(validator=[attrs.validators.instance_of(str),
                                                one_of(limits.INSTANCE_TYPES)])
    instance_count: int = attrs.field(validator=[attrs.validators.instance_of(int), between(1)])

    def to_request(self) -> dict:
        return {"InstanceGroupName": self.instance_group_name,
                "InstanceType": self.instance_type, "InstanceCount": self.instance_count}

    _to_request_dict = to_request  # v2's name


def _vpc_ids(max_items):
    return items(max_items, text(limits.VPC_ID_PATTERN, limits.VPC_ID_MAX), min_items=1)


def _role(_, attribute, value):
    if not value:
        fail("role", "is required (an IAM role ARN or name)", value)
    if not isinstance(value, str):
        fail("role", "must be a str", value)
    if value.startswith("arn:"):
        text(limits.ROLE_ARN_PATTERN, 2048)(_, attribute, value)


def _output_path(_, attribute, value):
    if value is not None and not str(value).startswith("file://"):
        s3_uri()(_, attribute, value)


@attrs.frozen
class TrainingConfig:
    """Every estimator argument that shapes the request, validated when built."""

    role: str = attrs.field(validator=_role)
    instance_count: int | None = attrs.field(default=None, validator=between(1))
    instance_type: str | None = attrs.field(default=None, validator=_instance_types)
    instance_groups: tuple[InstanceGroup, ...] | None = attrs.field(
        default=None, converter=_optional_tuple, validator=items(
            limits.INSTANCE_GROUPS_MAX, attrs.validators.instance_of(InstanceGroup), min_items=1))
    volume_size: int = attrs.field(default=30, validator=between(
        limits.bound("ResourceConfig.VolumeSizeInGB", "min")))
    volume_kms_key: str | None = attrs.field(default=None, validator=kms_key)
    max_run: int = attrs.field(default=24 * 60 * 60, validator=between(limits.MAX_RUN_MIN))
    input_mode: str = attrs.field(default="File", validator=one_of(limits.INPUT_MODES))
    output_path: str | None = attrs.field(default=None, validator=_output_path)
    output_kms_key: str | None = attrs.field(default=None, validator=kms_key)
    base_job_name: str | None = attrs.field(default=None, validator=text(
        max_len=limits.JOB_NAME_MAX))
    tags: tuple[dict, ...] | None = attrs.field(default=None, converter=_tags,
                                                validator=items(limits.TAGS_MAX, _tag))
    subnets: tuple[str, ...] | None = attrs.field(
        default=None, converter=_optional_tuple, validator=_vpc_ids(limits.SUBNETS_MAX))
    security_group_ids: tuple[str, ...] | None = attrs.field(
        default=None, converter=_optional_tuple, validator=_vpc_ids(limits.SECURITY_GROUPS_MAX))
    model_uri: str | None = attrs.field(default=None, validator=text())
    model_channel_name: str = attrs.field(default="model", validator=text(
        limits.CHANNEL_NAME_PATTERN, limits.CHANNEL_NAME_MAX, min_len=1))
    metric_definitions: tuple[dict, ...] | None = attrs.field(
        default=None, converter=_optional_tuple,
        validator=items(limits.METRIC_DEFINITIONS_MAX, _metric))
    encrypt_inter_container_traffic: bool = attrs.field(default=False, validator=boolean)
    use_spot_instances: bool = attrs.field(default=False, validator=boolean)
    max_wait: int | None = attrs.field(default=None, validator=between(1))
    checkpoint_s3_uri: str | None = attrs.field(default=None, validator=lambda i, a, v: (
        _checkpoint_uri(i, a, v)))
    checkpoint_local_path: str | None = attrs.field(default=None, validator=text(
        max_len=limits.LOCAL_PATH_MAX))
    enable_network_isolation: bool = attrs.field(default=False, validator=boolean)
    environment: dict | None = attrs.field(default=None, validator=_environment)
    max_retry_attempts: int | None = attrs.field(default=None, validator=between(
        limits.RETRY_MIN, limits.RETRY_MAX))
    keep_alive_period_in_seconds: int | None = attrs.field(default=None, validator=between(
        0, limits.KEEP_ALIVE_MAX))
    disable_profiler: bool = attrs.field(default=False, validator=boolean)
    debugger_hook_config: object = attrs.field(default=None, validator=_hook_config)
    rules: tuple | None = attrs.field(
        default=None, validator=lambda _, a, v: debugger.check_rules(v),
        converter=lambda v: tuple(v) if isinstance(v, list) else v)
    profiler_config: object = attrs.field(
        default=None, validator=lambda _, a, v: debugger.check_profiler_config(v))
    tensorboard_output_config: object = attrs.field(default=None, validator=_tensorboard_config)
    enable_sagemaker_metrics: bool | None = attrs.field(default=None, validator=boolean)
    disable_output_compression: bool = attrs.field(default=False, validator=boolean)
    source_dir: str | None = attrs.field(default=None, validator=text())
    entry_point: str | None = attrs.field(default=None, validator=text())
    dependencies: tuple[str, ...] = attrs.field(default=(), converter=lambda v: tuple(v or ()))
    code_location: str | None = attrs.field(default=None, validator=s3_uri())
    container_log_level: int = attrs.field(default=20, validator=between())
    allow_secrets: bool = attrs.field(default=False, validator=boolean)
    # where the job runs when not on a local instance type: None (SageMaker) or "slurm", set
    # by the estimator from its session or SHOAL_BACKEND; not part of the request
    backend: str | None = attrs.field(default=None, validator=attrs.validators.optional(
        attrs.validators.in_(REMOTE_BACKENDS)))

    def __attrs_post_init__(self):
        for rule in CONFIG_RULES:
            rule(self)

    @property
    def local_mode(self) -> bool:
        return self.instance_type in LOCAL_INSTANCE_TYPES

    @property
    def files_in_place(self) -> bool:
        """file:// data, output and code used where they are, no AWS needed: on this machine
        and on a Slurm cluster (whose nodes share a filesystem)."""
        return self.local_mode or self.backend == "slurm"

    def evolve(self, **changes) -> TrainingConfig:
        """A copy with some arguments changed, validated again."""
        return attrs.evolve(self, **changes)


def _checkpoint_uri(instance, attribute, value):
    """An S3 URI; on a Slurm cluster a file:// directory on its shared filesystem too."""
    if value is not None and value.startswith("file://") and instance.backend == "slurm":
        return
    s3_uri()(instance, attribute, value)


# ---- rules across arguments: where v2 is silent and the service would reject later ----

def _instances_rule(c: TrainingConfig):
    if c.instance_groups is not None:
        if c.instance_count is not None or c.instance_type is not None:
            fail("instance_groups", "cannot be combined with instance_count/instance_type",
                 [g.instance_group_name for g in c.instance_groups])
        names = [g.instance_group_name for g in c.instance_groups]
        if len(set(names)) != len(names):
            fail("instance_groups", "must have unique names", names)
    elif c.instance_count is None or c.instance_type is None:
        fail("instance_count", "and 'instance_type' are required unless instance_groups is set",
             (c.instance_count, c.instance_type))


def _vpc_rule(c: TrainingConfig):
    if (c.subnets is None) != (c.security_group_ids is None):
        fail("subnets", "and 'security_group_ids' must be set together",
             {"subnets": c.subnets, "security_group_ids": c.security_group_ids})


def _spot_rule(c: TrainingConfig):
    if c.use_spot_instances:
        if c.max_wait is None:
            fail("max_wait", "is required with use_spot_instances=True", None)
        if c.max_wait < c.max_run:
            fail("max_wait", f"must be >= max_run ({c.max_run}) with spot instances", c.max_wait)
        if c.keep_alive_period_in_seconds:
            fail("keep_alive_period_in_seconds", "cannot be used with spot instances (warm "
                 "pools need on-demand capacity)", c.keep_alive_period_in_seconds)
    elif c.max_wait is not None:
        fail("max_wait", "is only valid with use_spot_instances=True", c.max_wait)


def _checkpoint_rule(c: TrainingConfig):
    if c.checkpoint_local_path and not c.checkpoint_s3_uri:
        fail("checkpoint_local_path", "needs checkpoint_s3_uri (the S3 side of the checkpoints)",
             c.checkpoint_local_path)


def _local_rule(c: TrainingConfig):
    if not c.local_mode:
        if c.output_path and c.output_path.startswith("file://") and not c.files_in_place:
            fail("output_path", "may be a file:// path only in local mode or on Slurm",
                 c.output_path)
        return
    if c.instance_type == "local_gpu" and (c.instance_count or 1) > 1:
        fail("instance_count", "must be 1 with local_gpu", c.instance_count)
    for name in ("use_spot_instances", "checkpoint_s3_uri", "checkpoint_local_path"):
        if getattr(c, name):
            fail(name, "is not supported in local mode", getattr(c, name))


CONFIG_RULES = (_instances_rule, _vpc_rule, _spot_rule, _checkpoint_rule, _local_rule)


# ---- what the estimator resolved for one job ----

def _hyperparameters(_, attribute, hps):
    if len(hps) > limits.HYPERPARAMETERS_MAX:
        fail("hyperparameters", f"must have at most {limits.HYPERPARAMETERS_MAX} entries "
             "(the distribution's and Shoal's own included)", limits.Count(len(hps)))
    for key, value in hps.items():
        text(max_len=limits.HYPERPARAMETER_KEY_MAX)(_, "hyperparameter name", key)
        text(max_len=limits.HYPERPARAMETER_VALUE_MAX)(_, f"hyperparameters[{key!r}]", value)


@attrs.frozen
class Resolved:
    """The per-job values an estimator resolves before building the request."""

    job_name: str = attrs.field(validator=text(limits.JOB_NAME_PATTERN, limits.JOB_NAME_MAX))
    role_arn: str = attrs.field(validator=text(min_len=1))  # an ARN outside local mode
    image_uri: str = attrs.field(validator=text(max_len=limits.IMAGE_URI_MAX, min_len=1))
    output_path: str
    region: str
    hyperparameters: dict = attrs.field(factory=dict, validator=_hyperparameters)
    enable_sagemaker_metrics: bool | None = None
    debug_hook: bool = True  # False when the framework turns SageMaker Debugger off
    # SageMaker Profiler's processing rule, when profile_params adds it (a timestamped name)
    detailed_profiler_rule: str | None = None
    # custom rules' local sources: rule name -> the S3 URI they are uploaded to
    rule_sources: dict = attrs.field(factory=dict)
    code_uri: str | None = None  # the archive as a "code" channel (network isolation)


# ---- the builder ----

def _resource_config(c: TrainingConfig) -> dict:
    config = {"VolumeSizeInGB": c.volume_size}
    if c.volume_kms_key is not None:
        config["VolumeKmsKeyId"] = c.volume_kms_key
    if c.keep_alive_period_in_seconds is not None:
        config["KeepAlivePeriodInSeconds"] = c.keep_alive_period_in_seconds
    if c.instance_groups is not None:
        config["InstanceGroups"] = [g.to_request() for g in c.instance_groups]
    else:
        config["InstanceCount"] = c.instance_count
        config["InstanceType"] = c.instance_type
    return config


def _algorithm(c: TrainingConfig, r: Resolved, input_mode: str) -> dict:
    spec = {"TrainingInputMode": input_mode, "TrainingImage": r.image_uri}
    if c.metric_definitions is not None:
        spec["MetricDefinitions"] = [dict(m) for m in c.metric_definitions]
    if r.enable_sagemaker_metrics is not None:
        spec["EnableSageMakerMetricsTimeSeries"] = r.enable_sagemaker_metrics
    return spec


def _output_config(c: TrainingConfig, r: Resolved) -> dict:
    config = {"S3OutputPath": r.output_path}
    if c.output_kms_key is not None:
        config["KmsKeyId"] = c.output_kms_key
    if c.disable_output_compression:
        config["CompressionType"] = "NONE"
    return config


def _stopping_condition(c: TrainingConfig) -> dict:
    condition = {"MaxRuntimeInSeconds": c.max_run}
    if c.max_wait:
        condition["MaxWaitTimeInSeconds"] = c.max_wait
    return condition


def debugger_keys(c: TrainingConfig, r: Resolved) -> dict:
    """The request's Debugger keys (hook, rules, profiler, TensorBoard), v2's way."""
    disabled = debugger.profiler_disabled(c.disable_profiler, c.instance_type, r.region)
    profiler, profiler_rules = debugger.profiler_request(
        rules=c.rules, profiler_config=c.profiler_config, disabled=disabled,
        output_path=r.output_path, region=r.region, detailed_rule_name=r.detailed_profiler_rule,
        sources=r.rule_sources)
    hook, debug_rules = debugger.debug_request(
        rules=c.rules, hook=c.debugger_hook_config, allowed=r.debug_hook,
        output_path=r.output_path, region=r.region, job_name=r.job_name, sources=r.rule_sources)
    return {
        "DebugHookConfig": hook,
        "DebugRuleConfigurations": debug_rules,
        "TensorBoardOutputConfig": debugger.tensorboard_request(c.tensorboard_output_config),
        "ProfilerRuleConfigurations": profiler_rules,
        "ProfilerConfig": profiler,
    }


def _checkpoint_config(c: TrainingConfig) -> dict | None:
    if not c.checkpoint_s3_uri:
        return None
    config = {"S3Uri": c.checkpoint_s3_uri}
    if c.checkpoint_local_path:
        config["LocalPath"] = c.checkpoint_local_path
    return config


def _vpc_config(c: TrainingConfig) -> dict | None:
    if c.subnets is None or c.security_group_ids is None:
        return None
    return {"Subnets": list(c.subnets), "SecurityGroupIds": list(c.security_group_ids)}


def check_inputs(c: TrainingConfig, parsed: dict, input_mode: str) -> None:
    """Rules on channels the service would enforce only after the job was created."""
    groups = {g.instance_group_name for g in c.instance_groups or ()}
    for name, value in parsed.items():
        where = f"inputs[{name!r}]"
        if isinstance(value, inputs_.FileSystemInput):
            kind = value.file_system_type
            if _vpc_config(c) is None:
                fail(where, f"is an {kind} file system, which the job reaches only inside its "
                     "VPC: set subnets and security_group_ids", value.file_system_id, InputError)
            if input_mode == "Pipe":
                fail(where, f"is an {kind} file system, which cannot be read in Pipe mode "
                     "(use File or FastFile)", value.file_system_id, InputError)
        if isinstance(value, inputs_.FileInput) and not c.files_in_place:
            fail(where, "may be a file:// URI only in local mode or on Slurm (use an S3 URI)",
                 value.file_uri, InputError)
        if isinstance(value, inputs_.TrainingInput) and value.instance_groups:
            unknown = sorted(set(value.instance_groups) - groups)
            if unknown:
                fail(f"{where}.instance_groups", f"must name the estimator's instance groups "
                     f"{sorted(groups)}", unknown, InputError)


def channels(c: TrainingConfig, r: Resolved, inputs) -> tuple[list | None, str]:
    """``InputDataConfig`` (None when empty) and the job's input mode."""
    parsed = inputs_.parse_inputs(inputs)
    input_mode = inputs_.lone_input_mode(inputs) or c.input_mode
    model = {c.model_channel_name: c.model_uri} if c.model_uri else {}
    check_inputs(c, {**parsed, **{k: inputs_.model_input(v) for k, v in model.items()}},
                 input_mode)
    config = inputs_.input_config(parsed, c.model_uri, c.model_channel_name)
    if r.code_uri:
        if any(ch["ChannelName"] == "code" for ch in config or ()):
            fail("inputs", "must not have a 'code' channel with enable_network_isolation", "code",
                 InputError)
        config = (config or []) + [inputs_.channel("code", inputs_.TrainingInput(r.code_uri))]
    return config, input_mode


def build_request(c: TrainingConfig, r: Resolved, inputs=None) -> dict:
    """The ``CreateTrainingJob`` request for this config, resolution and inputs."""
    input_config, input_mode = channels(c, r, inputs)
    secrets.check_no_secrets(r.hyperparameters, c.environment, c.allow_secrets)
    request = {
        "AlgorithmSpecification": _algorithm(c, r, input_mode),
        "OutputDataConfig": _output_config(c, r),
        "TrainingJobName": r.job_name,
        "StoppingCondition": _stopping_condition(c),
        "ResourceConfig": _resource_config(c),
        "RoleArn": r.role_arn,
    }
    optional = {
        "InputDataConfig": input_config,
        "HyperParameters": dict(r.hyperparameters) or None,
        "Environment": None if c.environment is None else dict(c.environment),
        "Tags": None if c.tags is None else [dict(t) for t in c.tags],
        "VpcConfig": _vpc_config(c),
        "EnableNetworkIsolation": c.enable_network_isolation or None,
        "EnableInterContainerTrafficEncryption": c.encrypt_inter_container_traffic or None,
        "EnableManagedSpotTraining": c.use_spot_instances or None,
        "CheckpointConfig": _checkpoint_config(c),
        **debugger_keys(c, r),
        "RetryStrategy": None if c.max_retry_attempts is None
        else {"MaximumRetryAttempts": c.max_retry_attempts},
    }
    request.update({k: v for k, v in optional.items() if v is not None})
    return request


def validate_with_botocore(request: dict) -> None:
    """Check a request against botocore's own model of the API (raises ValidationError)."""
    import botocore.exceptions
    import botocore.validate

    try:
        botocore.validate.validate_parameters(request, limits._input_shape())
    except botocore.exceptions.ParamValidationError as error:
        raise ValidationError(str(error)) from None
