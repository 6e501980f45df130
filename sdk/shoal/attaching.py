"""Attaching to an existing training job (``shoal.attach``): the estimator that launched it,
rebuilt from DescribeTrainingJob and ListTags, as the SageMaker Python SDK v2's ``attach`` does.

:func:`init_params` is the pure half (description + tags -> estimator arguments);
:func:`attach` does the calls, picks the estimator class from the image (PyTorch,
TensorFlow, else the generic Estimator), and binds ``latest_training_job``.
"""

from __future__ import annotations

import inspect
import json
from typing import Any

from shoal.aws_errors import translated
from shoal.distribution import HYPERPARAMETER_NAMES, Distribution
from shoal.follow import normalize_log_type
from shoal.image_uris import framework_from_image
from shoal.inputs import FileInput, FileSystemInput, ShuffleConfig, TrainingInput
from shoal.request import InstanceGroup

SCRIPT_PARAM = "sagemaker_program"
DIR_PARAM = "sagemaker_submit_directory"
LOG_LEVEL_PARAM = "sagemaker_container_log_level"
REGION_PARAM = "sagemaker_region"

def _decode(value: str) -> Any:
    """v2 JSON-encodes every value; one set by hand (or by a tuner) may be raw text."""
    try:
        return json.loads(value)
    except (TypeError, json.JSONDecodeError):
        return value


def _is_reserved(name: str) -> bool:
    return name.startswith("sagemaker_") or name in HYPERPARAMETER_NAMES


def user_hyperparameters(hyperparameters: dict[str, str]) -> dict[str, Any]:
    """The user's own hyperparameters, decoded; Shoal's reserved ones are left out."""
    return {k: _decode(v) for k, v in hyperparameters.items() if not _is_reserved(k)}


def input_from_channel(channel: dict):
    """A channel of ``InputDataConfig`` back into the input object that makes it."""
    source = channel["DataSource"]
    if "S3DataSource" in source:
        s3 = source["S3DataSource"]
        shuffle = channel.get("ShuffleConfig")
        return TrainingInput(
            s3["S3Uri"],
            distribution=s3.get("S3DataDistributionType"),
            compression=channel.get("CompressionType"),
            content_type=channel.get("ContentType"),
            record_wrapping=channel.get("RecordWrapperType"),
            s3_data_type=s3.get("S3DataType", "S3Prefix"),
            instance_groups=s3.get("InstanceGroupNames"),
            input_mode=channel.get("InputMode"),
            attribute_names=s3.get("AttributeNames"),
            target_attribute_name=channel.get("TargetAttributeName"),
            shuffle_config=ShuffleConfig(shuffle["Seed"]) if shuffle else None,
        )
    if "FileSystemDataSource" in source:
        fs = source["FileSystemDataSource"]
        return FileSystemInput(
            fs["FileSystemId"],
            fs["FileSystemType"],
            fs["DirectoryPath"],
            fs.get("FileSystemAccessMode", "ro"),
            channel.get("ContentType"),
        )
    if "FileDataSource" in source:
        return FileInput(source["FileDataSource"]["FileUri"], channel.get("ContentType"))
    raise ValueError(f"channel {channel.get('ChannelName')!r} has no data source Shoal knows")


def inputs_from_description(description: dict, model_channel_name: str = "model") -> dict:
    """The job's channels (without the model channel) as channel name -> input object."""
    return {
        c["ChannelName"]: input_from_channel(c)
        for c in description.get("InputDataConfig") or []
        if c["ChannelName"] != model_channel_name
    }


def _model_uri(description: dict, model_channel_name: str) -> str | None:
    for c in description.get("InputDataConfig") or []:
        if c["ChannelName"] == model_channel_name:
            return c["DataSource"].get("S3DataSource", {}).get("S3Uri")
    return None


def _resource_params(description: dict) -> dict:
    resources = description.get("ResourceConfig", {})
    params: dict = {"volume_size": resources.get("VolumeSizeInGB")}
    if resources.get("InstanceGroups"):
        params["instance_groups"] = [
            InstanceGroup(g["InstanceGroupName"], g["InstanceType"], g["InstanceCount"])
            for g in resources["InstanceGroups"]
        ]
    else:
        params["instance_count"] = resources.get("InstanceCount")
        params["instance_type"] = resources.get("InstanceType")
    if resources.get("VolumeKmsKeyId"):
        params["volume_kms_key"] = resources["VolumeKmsKeyId"]
    if resources.get("KeepAlivePeriodInSeconds") is not None:
        params["keep_alive_period_in_seconds"] = resources["KeepAlivePeriodInSeconds"]
    return params


def _job_params(description: dict) -> dict:
    algorithm = description.get("AlgorithmSpecification", {})
    stopping = description.get("StoppingCondition", {})
    output = description.get("OutputDataConfig", {})
    params = {
        "role": description.get("RoleArn"),
        "image_uri": algorithm.get("TrainingImage"),
        "input_mode": algorithm.get("TrainingInputMode"),
        "metric_definitions": algorithm.get("MetricDefinitions"),
        "max_run": stopping.get("MaxRuntimeInSeconds"),
        "max_wait": stopping.get("MaxWaitTimeInSeconds"),
        "use_spot_instances": description.get("EnableManagedSpotTraining"),
        "output_path": output.get("S3OutputPath"),
        "output_kms_key": output.get("KmsKeyId"),
        "enable_network_isolation": description.get("EnableNetworkIsolation"),
        "encrypt_inter_container_traffic": description.get(
            "EnableInterContainerTrafficEncryption"
        ),
        "environment": description.get("Environment"),
        "max_retry_attempts": (description.get("RetryStrategy") or {}).get("MaximumRetryAttempts"),
    }
    vpc = description.get("VpcConfig")
    if vpc:
        params["subnets"] = vpc.get("Subnets")
        params["security_group_ids"] = vpc.get("SecurityGroupIds")
    checkpoint = description.get("CheckpointConfig")
    if checkpoint:
        params["checkpoint_s3_uri"] = checkpoint.get("S3Uri")
        params["checkpoint_local_path"] = checkpoint.get("LocalPath")
    return params


def _code_params(hyperparameters: dict[str, str], framework: str | None) -> dict:
    params: dict = {"hyperparameters": user_hyperparameters(hyperparameters)}
    if SCRIPT_PARAM in hyperparameters:
        params["entry_point"] = _decode(hyperparameters[SCRIPT_PARAM])
        params["source_dir"] = _decode(hyperparameters.get(DIR_PARAM, "null"))
    if LOG_LEVEL_PARAM in hyperparameters:
        params["container_log_level"] = _decode(hyperparameters[LOG_LEVEL_PARAM])
    distribution = Distribution.from_hyperparameters(hyperparameters, framework).to_dict()
    if distribution:
        params["distribution"] = distribution
    return params


def init_params(description: dict, tags: list[dict] | None = None,
                model_channel_name: str = "model") -> dict:
    """The estimator arguments that reproduce a described job (None values dropped)."""
    hyperparameters = description.get("HyperParameters") or {}
    found = framework_from_image(description.get("AlgorithmSpecification", {}).get("TrainingImage"))
    framework = found[0] if found else None
    params = {**_job_params(description), **_resource_params(description)}
    params.update(_code_params(hyperparameters, framework))
    if found:
        params["framework_version"], params["py_version"] = found[1], found[2]
    model_uri = _model_uri(description, model_channel_name)
    if model_uri:
        params["model_uri"] = model_uri
        params["model_channel_name"] = model_channel_name
    user_tags = [t for t in tags or [] if not t["Key"].startswith("aws:")]
    if user_tags:
        params["tags"] = user_tags
    return {k: v for k, v in params.items() if v is not None}


def list_tags(sagemaker_client, arn: str) -> list[dict]:
    tags: list[dict] = []
    kwargs = {"ResourceArn": arn}
    with translated(f"ListTags {arn}"):
        while True:
            page = sagemaker_client.list_tags(**kwargs)
            tags.extend(page.get("Tags", []))
            if not page.get("NextToken"):
                return tags
            kwargs["NextToken"] = page["NextToken"]


def estimator_class_for(params: dict):
    """PyTorch or TensorFlow for their images, the generic Estimator otherwise."""
    framework = framework_from_image(params.get("image_uri"))
    if framework and framework[0] == "pytorch":
        from shoal.pytorch import PyTorch

        return PyTorch
    if framework and framework[0] == "tensorflow":
        from shoal.tensorflow import TensorFlow

        return TensorFlow
    from shoal.estimator import Estimator

    return Estimator


def _accepted(cls, params: dict) -> dict:
    """The arguments ``cls`` names in its own or its bases' ``__init__``: a generic
    Estimator takes no entry point or distribution."""
    names: set[str] = set()
    for klass in cls.__mro__[:-1]:  # not object
        if "__init__" in vars(klass):
            parameters = inspect.signature(klass.__init__).parameters.values()
            names.update(p.name for p in parameters if p.kind is not p.VAR_KEYWORD)
    return {k: v for k, v in params.items() if k in names}


def attach(job_name: str, sagemaker_session=None, wait: bool = False, logs="All", *,
           estimator_cls=None, model_channel_name: str = "model"):
    """The estimator behind an existing SageMaker training job, bound to it.

    ``latest_training_job`` follows, describes and stops the job; ``inputs`` holds the
    job's channels as input objects (``fit(est.inputs)`` runs the job again). With
    ``wait=True`` the job is followed to its end (``logs`` as in ``fit``).
    ``local://<job>`` attaches to a local-mode job instead (no AWS call), ``slurm://<job>``
    (or any name with a Slurm session) to a job on the Slurm cluster.
    """
    from shoal.backends.sagemaker import SageMakerBackend
    from shoal.session import Session

    if job_name.startswith(LOCAL_PREFIX):
        return _attach_local(job_name[len(LOCAL_PREFIX):], wait, logs, estimator_cls,
                             model_channel_name)
    if job_name.startswith(SLURM_PREFIX) or getattr(sagemaker_session, "backend", None) == "slurm":
        return _attach_slurm(job_name.removeprefix(SLURM_PREFIX), sagemaker_session, wait, logs,
                             estimator_cls, model_channel_name)

    session = sagemaker_session or Session()
    client = session.sagemaker_client
    with translated(f"DescribeTrainingJob {job_name}"):
        description = client.describe_training_job(TrainingJobName=job_name)
    tags = list_tags(client, description["TrainingJobArn"])
    params = init_params(description, tags, model_channel_name)
    cls = estimator_cls or estimator_class_for(params)
    estimator = cls(sagemaker_session=session, **_accepted(cls, params))
    estimator.inputs = inputs_from_description(description, model_channel_name)
    estimator._current_job_name = job_name
    estimator.latest_training_job = SageMakerBackend(session).job(job_name)
    if wait:
        estimator.latest_training_job.wait(logs=normalize_log_type(logs))
    return estimator


LOCAL_PREFIX = "local://"
SLURM_PREFIX = "slurm://"


def _attach_local(job_name: str, wait: bool, logs, estimator_cls, model_channel_name: str):
    """A local job's record is DescribeTrainingJob-shaped: the same restoration applies."""
    from shoal.backends.local import LocalTrainingJob

    return _bind(LocalTrainingJob.attach(job_name), None, wait, logs, estimator_cls,
                 model_channel_name)


def _attach_slurm(job_name: str, session, wait: bool, logs, estimator_cls,
                  model_channel_name: str):
    """A Slurm job's record lives in the cluster's shared directory, shaped as a local one's."""
    from shoal.backends.slurm import SlurmTrainingJob
    from shoal.session import Session

    if getattr(session, "backend", None) != "slurm":
        session = Session(backend="slurm")
    job = SlurmTrainingJob.attach(job_name, session.slurm_settings().shared_dir)
    return _bind(job, session, wait, logs, estimator_cls, model_channel_name)


def _bind(job, session, wait: bool, logs, estimator_cls, model_channel_name: str):
    description = job.describe()
    params = init_params(description, [], model_channel_name)
    cls = estimator_cls or estimator_class_for(params)
    extra = {"sagemaker_session": session} if session is not None else {}
    estimator = cls(**extra, **_accepted(cls, params))
    estimator.inputs = inputs_from_description(description, model_channel_name)
    estimator._current_job_name = job.name
    estimator.latest_training_job = job
    if wait:
        job.wait(logs=normalize_log_type(logs))
    return estimator
