"""The local job's directory tree and the config files SageMaker writes into each host.

Pure functions from a ``CreateTrainingJob`` request to data: host names, the contents of
``resourceconfig.json``, ``inputdataconfig.json`` and ``hyperparameters.json`` for one host, and
the paths of the ``/opt/ml``-shaped tree of each simulated host under the job directory::

    <root>/<job>/               job.json (the record), request.json, runner.json, logs.txt
    <root>/<job>/algo-1/        SAGEMAKER_BASE_DIR of host algo-1
        input/config/{hyperparameters,resourceconfig,inputdataconfig}.json
        input/data/<channel>/   model/   output/{data,failure,success}   code/   checkpoints/

and, as SageMaker lays them out on S3, where each job's artifacts go under its output path
(``s3://`` or ``file://`` alike), so that no job writes where another one did::

    <output_path>/<job>/output/{model,output}.tar.gz
    <output_path>/<job>/{profiler-output,rule-output}/
"""

from __future__ import annotations

import os
from pathlib import Path

import attrs

from ..errors import InputError
from . import storage

DEFAULT_GROUP = "homogeneousCluster"
CONTAINER_BASE = "/opt/ml"
DEFAULT_CHECKPOINT_PATH = "/opt/ml/checkpoints"
# Simulated hosts talk over the loopback interface; eth0 may be absent or firewalled.
LOCAL_NETWORK_INTERFACE = "lo"


def local_root() -> Path:
    """Where local jobs live: ``$SHOAL_LOCAL_ROOT`` or ``~/.shoal/local``."""
    return Path(os.environ.get("SHOAL_LOCAL_ROOT") or Path.home() / ".shoal" / "local")


@attrs.frozen
class JobPaths:
    """The paths of one local job."""

    job_dir: Path = attrs.field(converter=Path)

    @classmethod
    def for_job(cls, job_name: str, root: Path | None = None) -> JobPaths:
        return cls(Path(root or local_root()) / job_name)

    @property
    def state_file(self) -> Path:
        return self.job_dir / "job.json"

    @property
    def request_file(self) -> Path:
        return self.job_dir / "request.json"

    @property
    def runner_file(self) -> Path:
        """The supervisor's pid and start time (``process.find`` tells it from a reused pid)."""
        return self.job_dir / "runner.json"

    @property
    def log_file(self) -> Path:
        return self.job_dir / "logs.txt"

    def host_dir(self, host: str) -> Path:
        return self.job_dir / host

    def config_dir(self, host: str) -> Path:
        return self.host_dir(host) / "input" / "config"

    def channel_dir(self, host: str, channel: str) -> Path:
        return self.host_dir(host) / "input" / "data" / channel

    def model_dir(self, host: str) -> Path:
        return self.host_dir(host) / "model"

    def output_dir(self, host: str) -> Path:
        return self.host_dir(host) / "output"

    def checkpoint_dir(self, host: str, local_path: str = DEFAULT_CHECKPOINT_PATH) -> Path:
        """A host's checkpoint directory: the request's LocalPath re-rooted in the host's tree."""
        rel = os.path.relpath(local_path, CONTAINER_BASE) if local_path.startswith(CONTAINER_BASE) \
            else local_path.lstrip("/")
        return self.host_dir(host) / rel


def instance_groups(request: dict) -> list[dict]:
    """``[{instance_group_name, instance_type, hosts}]``: hosts numbered across groups in order."""
    resource = request["ResourceConfig"]
    groups = resource.get("InstanceGroups") or [{
        "InstanceGroupName": DEFAULT_GROUP,
        "InstanceType": resource["InstanceType"],
        "InstanceCount": resource["InstanceCount"],
    }]
    result, next_host = [], 1
    for group in groups:
        hosts = [f"algo-{next_host + i}" for i in range(group["InstanceCount"])]
        next_host += len(hosts)
        result.append({
            "instance_group_name": group["InstanceGroupName"],
            "instance_type": group["InstanceType"],
            "hosts": hosts,
        })
    return result


def host_names(request: dict) -> list[str]:
    return [host for group in instance_groups(request) for host in group["hosts"]]


def resource_config(request: dict, host: str, interface: str = LOCAL_NETWORK_INTERFACE) -> dict:
    """``resourceconfig.json`` for ``host``, with the keys SageMaker writes; ``interface``:
    ``eth0`` for hosts in network namespaces of their own."""
    groups = instance_groups(request)
    own = next(g for g in groups if host in g["hosts"])
    return {
        "current_host": host,
        "current_instance_type": own["instance_type"],
        "current_group_name": own["instance_group_name"],
        "hosts": host_names(request),
        "instance_groups": groups,
        "network_interface_name": interface,
    }


def input_data_config(request: dict) -> dict:
    """``inputdataconfig.json``: per channel, the input mode and S3 settings."""
    default_mode = request["AlgorithmSpecification"].get("TrainingInputMode", "File")
    config = {}
    for channel in request.get("InputDataConfig") or []:
        source = channel.get("DataSource", {})
        s3 = source.get("S3DataSource") or {}
        distribution = s3.get("S3DataDistributionType") or \
            (source.get("FileDataSource") or {}).get("FileDataDistributionType")
        entry = {
            "TrainingInputMode": channel.get("InputMode", default_mode),
            "S3DistributionType": distribution or "FullyReplicated",
            "RecordWrapperType": channel.get("RecordWrapperType", "None"),
        }
        if "ContentType" in channel:
            entry["ContentType"] = channel["ContentType"]
        config[channel["ChannelName"]] = entry
    return config


def hyperparameters(request: dict) -> dict:
    """``hyperparameters.json``: the request's map as sent (values already JSON strings)."""
    return dict(request.get("HyperParameters") or {})


def config_files(request: dict, host: str, interface: str = LOCAL_NETWORK_INTERFACE
                 ) -> dict[str, dict]:
    """The three config files of ``host``, by file name."""
    return {
        "hyperparameters.json": hyperparameters(request),
        "resourceconfig.json": resource_config(request, host, interface),
        "inputdataconfig.json": input_data_config(request),
    }


def channel_sources(request: dict) -> dict[str, str]:
    """Channel name -> data URI (``s3://`` or ``file://``); FSx/EFS channels cannot run locally."""
    sources = {}
    for channel in request.get("InputDataConfig") or []:
        data = channel.get("DataSource", {})
        if "S3DataSource" in data:
            sources[channel["ChannelName"]] = data["S3DataSource"]["S3Uri"]
        elif "FileDataSource" in data:  # what SDK v2 sends for file:// inputs in local mode
            sources[channel["ChannelName"]] = data["FileDataSource"]["FileUri"]
        else:
            kind = next(iter(data), "nothing")
            raise InputError(f"channel {channel['ChannelName']!r}: {kind} inputs cannot run locally")
    return sources


def job_output(request: dict) -> str:
    """``<S3OutputPath>/<job>``: the job's own folder, a ``file://`` path made absolute."""
    path = request["OutputDataConfig"]["S3OutputPath"]
    base = path if storage.is_s3(path) else "file://" + str(storage.file_path(path))
    return storage.join(base, request["TrainingJobName"])


def output_prefix(request: dict) -> str:
    """Where ``model.tar.gz`` and ``output.tar.gz`` go: ``<S3OutputPath>/<job>/output``."""
    return storage.join(job_output(request), "output")


def local_job_output(request: dict) -> Path | None:
    """The job's own folder on this machine under a ``file://`` output path; None on S3."""
    uri = job_output(request)
    return None if storage.is_s3(uri) else storage.file_path(uri)


def checkpoint_config(request: dict) -> tuple[str | None, str]:
    """``(S3Uri or None, LocalPath)`` of the request's CheckpointConfig."""
    config = request.get("CheckpointConfig") or {}
    return config.get("S3Uri"), config.get("LocalPath") or DEFAULT_CHECKPOINT_PATH
