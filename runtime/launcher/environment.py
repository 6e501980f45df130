"""The training environment: the /opt/ml config files read once, and the ``SM_*`` variables.

``load_environment`` reads ``input/config/{hyperparameters,resourceconfig,inputdataconfig}.json``
into a frozen :class:`TrainingEnvironment`; ``sm_env_vars`` is the pure mapping to the
SageMaker training toolkit's ``SM_*`` variables with its exact names and encodings: strings
as they are, ``None`` as the empty string, anything else as compact JSON with sorted keys.
``SM_TRAINING_ENV`` holds every property of the environment (as the toolkit's does), plus
Shoal's ``SM_IS_MASTER`` and ``SM_MASTER_ADDR``.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping
from typing import Any

import attrs
from shoal.errors import LaunchError
from shoal.launcher import gpus
from shoal.launcher import hyperparameters as hp
from shoal.launcher.paths import JobPaths, rebase_all

log = logging.getLogger(__name__)

DEFAULT_INTERFACE = "eth0"
DEFAULT_GROUP = "homogeneousCluster"

# Framework flags whose presence puts the current instance group into the distribution.
DISTRIBUTION_FLAGS = (
    "sagemaker_mpi_enabled",
    "sagemaker_parameter_server_enabled",
    "sagemaker_distributed_dataparallel_enabled",
    "sagemaker_pytorch_ddp_enabled",
    "sagemaker_pytorch_xla_multi_worker_enabled",
    "sagemaker_multi_worker_mirrored_strategy_enabled",
    "sagemaker_torch_distributed_enabled",
)


def _read_json(path: str) -> Any:
    try:
        with open(path) as f:
            return json.load(f)
    except FileNotFoundError:
        raise LaunchError(f"missing job configuration file: {path}") from None
    except ValueError as e:
        raise LaunchError(f"{path} is not valid JSON: {e}") from None


def count_gpus() -> int:
    """The GPUs this host's ranks may use: the machine's, narrowed by CUDA_VISIBLE_DEVICES."""
    return gpus.count(os.environ)


def _check_hosts(instance, attribute, hosts):
    if not hosts:
        raise ValueError(f"'{attribute.name}' must not be empty (got {list(hosts)!r})")


def _check_current_host(instance, attribute, value):
    if value not in instance.hosts:
        raise ValueError(
            f"'{attribute.name}' must be one of {list(instance.hosts)!r} (got {value!r})"
        )


@attrs.frozen
class TrainingEnvironment:
    """A read-only snapshot of one host's job configuration."""

    paths: JobPaths
    hosts: tuple[str, ...] = attrs.field(converter=tuple, validator=_check_hosts)
    current_host: str = attrs.field(validator=_check_current_host)
    resource_config: dict = attrs.field(factory=dict)
    input_data_config: dict = attrs.field(factory=dict)
    framework: dict = attrs.field(factory=dict)
    hyperparameters: dict = attrs.field(factory=dict)
    num_gpus: int = attrs.field(default=0, validator=attrs.validators.ge(0))
    num_cpus: int = attrs.field(default=1, validator=attrs.validators.ge(1))
    num_neurons: int = attrs.field(default=0, validator=attrs.validators.ge(0))
    job_name: str | None = None
    framework_module: str | None = None
    environ_program: str | None = None
    # Hyperparameters whose /opt/ml path was moved under SAGEMAKER_BASE_DIR (keys only).
    rebased_keys: tuple[str, ...] = ()

    @property
    def network_interface_name(self) -> str:
        return self.resource_config.get("network_interface_name", DEFAULT_INTERFACE)

    @property
    def current_instance_type(self) -> str:
        return self.resource_config.get("current_instance_type", "local")

    @property
    def current_instance_group(self) -> str:
        return self.resource_config.get("current_group_name", DEFAULT_GROUP)

    @property
    def additional_framework_parameters(self) -> dict:
        return hp.additional_framework_parameters(self.framework)

    @property
    def instance_groups_dict(self) -> dict:
        groups = self.resource_config.get("instance_groups", [])
        return {g["instance_group_name"]: g for g in groups}

    @property
    def instance_groups(self) -> list[str]:
        return list(self.instance_groups_dict)

    @property
    def current_instance_group_hosts(self) -> list[str]:
        group = self.instance_groups_dict.get(self.current_instance_group, {})
        return list(group.get("hosts", []))

    @property
    def distribution_instance_groups(self) -> list[str]:
        params = self.additional_framework_parameters
        if "sagemaker_distribution_instance_groups" in params:
            return list(params["sagemaker_distribution_instance_groups"])
        if any(params.get(flag, False) for flag in DISTRIBUTION_FLAGS):
            return [self.current_instance_group]
        return []

    @property
    def distribution_hosts(self) -> list[str]:
        groups = self.resource_config.get("instance_groups", [])
        if not groups:
            return list(self.hosts)
        wanted = self.distribution_instance_groups
        return [h for g in groups if g["instance_group_name"] in wanted for h in g["hosts"]]

    @property
    def is_hetero(self) -> bool:
        return len(self.instance_groups) > 1

    @property
    def master_hostname(self) -> str:
        """The first host in sorted order (SageMaker lists hosts sorted already)."""
        return min(self.distribution_hosts or self.hosts)

    @property
    def is_master(self) -> bool:
        return self.current_host == self.master_hostname

    @property
    def user_entry_point(self) -> str | None:
        return self.environ_program or self.framework.get("sagemaker_program")

    @property
    def module_name(self) -> str | None:
        name = self.environ_program or self.framework.get("sagemaker_program")
        name = None if name is None else str(name)
        return name[:-3] if name and name.endswith(".py") else name

    @property
    def module_dir(self) -> str:
        return str(self.framework.get("sagemaker_submit_directory", self.paths.code_dir))

    @property
    def log_level(self) -> int:
        return int(self.framework.get("sagemaker_container_log_level", logging.INFO))

    @property
    def channel_input_dirs(self) -> dict[str, str]:
        return {name: self.paths.channel_dir(name) for name in self.input_data_config}

    @property
    def is_modelparallel_enabled(self) -> bool:
        return bool(self.hyperparameters.get("mp_parameters"))

    def to_cmd_args(self) -> list[str]:
        return hp.to_cmd_args(self.hyperparameters)

    def properties(self) -> dict[str, Any]:
        """Every property, as the toolkit's ``dict(env)`` (the ``SM_TRAINING_ENV`` content)."""
        p = self.paths
        return {
            "additional_framework_parameters": self.additional_framework_parameters,
            "channel_input_dirs": self.channel_input_dirs,
            "current_host": self.current_host,
            "current_instance_group": self.current_instance_group,
            "current_instance_group_hosts": self.current_instance_group_hosts,
            "current_instance_type": self.current_instance_type,
            "distribution_hosts": self.distribution_hosts,
            "distribution_instance_groups": self.distribution_instance_groups,
            "framework_module": self.framework_module,
            "hosts": list(self.hosts),
            "hyperparameters": self.hyperparameters,
            "input_config_dir": p.input_config_dir,
            "input_data_config": self.input_data_config,
            "input_dir": p.input_dir,
            "instance_groups": self.instance_groups,
            "instance_groups_dict": self.instance_groups_dict,
            "is_hetero": self.is_hetero,
            "is_master": self.is_master,
            "is_modelparallel_enabled": self.is_modelparallel_enabled,
            "is_smddpmprun_installed": False,
            "job_name": self.job_name,
            "log_level": self.log_level,
            "master_hostname": self.master_hostname,
            "model_dir": p.model_dir,
            "module_dir": self.module_dir,
            "module_name": self.module_name,
            "network_interface_name": self.network_interface_name,
            "num_cpus": self.num_cpus,
            "num_gpus": self.num_gpus,
            "num_neurons": self.num_neurons,
            "output_data_dir": p.output_data_dir,
            "output_dir": p.output_dir,
            "output_intermediate_dir": p.output_intermediate_dir,
            "resource_config": self.resource_config,
            "user_entry_point": self.user_entry_point,
        }


def encode_value(value: Any) -> str:
    """The toolkit's encoding of one ``SM_*`` value."""
    if isinstance(value, bytes):
        return value.decode("latin1")
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True)


def sm_env_vars(env: TrainingEnvironment) -> dict[str, str]:
    """The ``SM_*`` variables of a training environment (pure)."""
    p = env.paths
    fields: dict[str, Any] = {
        "hosts": list(env.hosts),
        "network_interface_name": env.network_interface_name,
        "hps": env.hyperparameters,
        "user_entry_point": env.user_entry_point,
        "framework_params": env.additional_framework_parameters,
        "resource_config": env.resource_config,
        "input_data_config": env.input_data_config,
        "output_data_dir": p.output_data_dir,
        "channels": sorted(env.channel_input_dirs),
        "current_host": env.current_host,
        "current_instance_type": env.current_instance_type,
        "current_instance_group": env.current_instance_group,
        "current_instance_group_hosts": env.current_instance_group_hosts,
        "instance_groups": env.instance_groups,
        "instance_groups_dict": env.instance_groups_dict,
        "distribution_instance_groups": env.distribution_instance_groups,
        "is_hetero": env.is_hetero,
        "module_name": env.module_name,
        "log_level": env.log_level,
        "framework_module": env.framework_module,
        "input_dir": p.input_dir,
        "input_config_dir": p.input_config_dir,
        "output_dir": p.output_dir,
        "num_cpus": env.num_cpus,
        "num_gpus": env.num_gpus,
        "num_neurons": env.num_neurons,
        "model_dir": p.model_dir,
        "module_dir": env.module_dir,
        "training_env": env.properties(),
        "user_args": env.to_cmd_args(),
        "output_intermediate_dir": p.output_intermediate_dir,
        "is_master": env.is_master,
        "master_addr": env.master_hostname,
    }
    for name, path in env.channel_input_dirs.items():
        fields[f"channel_{name}"] = path
    for key, value in env.hyperparameters.items():
        fields[f"hp_{key}"] = value
    return {f"SM_{str(k).upper()}": encode_value(v) for k, v in fields.items() if k}


def load_environment(
    paths: JobPaths,
    environ: Mapping[str, str] = os.environ,
    *,
    num_gpus: int | None = None,
    num_cpus: int | None = None,
) -> TrainingEnvironment:
    """Read the three config files under ``paths`` into a :class:`TrainingEnvironment`."""
    resource = _read_json(paths.resource_config_file)
    data_config = (
        _read_json(paths.input_data_config_file)
        if os.path.exists(paths.input_data_config_file)
        else {}
    )
    raw_hps = (
        _read_json(paths.hyperparameters_file) if os.path.exists(paths.hyperparameters_file) else {}
    )
    framework, user = hp.split(hp.decode(raw_hps))
    user, rebased = rebase_all(user, paths.base_dir)
    try:
        return TrainingEnvironment(
            paths=paths,
            hosts=resource.get("hosts", ()),
            current_host=resource.get("current_host", ""),
            resource_config=resource,
            input_data_config=data_config,
            framework=framework,
            hyperparameters=user,
            num_gpus=count_gpus() if num_gpus is None else num_gpus,
            num_cpus=(os.cpu_count() or 1) if num_cpus is None else num_cpus,
            job_name=environ.get("TRAINING_JOB_NAME"),
            framework_module=environ.get("SAGEMAKER_TRAINING_MODULE"),
            environ_program=environ.get("SAGEMAKER_PROGRAM"),
            rebased_keys=rebased,
        )
    except (TypeError, ValueError) as e:
        raise LaunchError(f"{paths.resource_config_file}: {e}") from None


def process_env_vars(env: TrainingEnvironment, environ: Mapping[str, str]) -> dict[str, str]:
    """The non-``SM_`` variables the toolkit also exports for the script."""
    region = env.framework.get("sagemaker_region") or environ.get("AWS_REGION") or ""
    code_dir = env.paths.code_dir
    pythonpath = environ.get("PYTHONPATH", "")
    return {
        "SAGEMAKER_JOB_NAME": str(env.framework.get("sagemaker_job_name", "")),
        "CURRENT_HOST": env.current_host,
        "SAGEMAKER_REGION": str(region),
        "PYTHONPATH": code_dir + (os.pathsep + pythonpath if pythonpath else ""),
    }
