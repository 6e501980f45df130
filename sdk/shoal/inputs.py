"""Training inputs (channels): ``TrainingInput`` (S3), ``FileSystemInput`` (FSx for
Lustre, EFS) and ``file://`` URIs (local mode), with the constructor arguments of the
SageMaker Python SDK v2's classes, checked against the API's limits when built. Each
has a ``config`` dict, the ``Channel`` of the request without its ``ChannelName``.

``input_config()`` turns what ``fit(inputs)`` accepts (a URI string, one input object, or
a dict of channel name -> either) plus the model channel into ``InputDataConfig``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Union

import attrs

from shoal import limits
from shoal.errors import InputError

MODEL_CONTENT_TYPE = "application/x-sagemaker-model"
DEFAULT_CHANNEL = "training"


def _text(regex=None, max_len=None):
    return limits.text(regex, max_len, error=InputError)


def _one_of(options):
    return limits.one_of(options, error=InputError)


@attrs.frozen
class ShuffleConfig:
    """The seed with which the service shuffles an S3 channel's objects each epoch."""

    seed: int = attrs.field(validator=limits.between(error=InputError))


def _s3_data(_, attribute, value):
    if not isinstance(value, str) or not limits.S3_URI_PATTERN.fullmatch(value):
        limits.fail(attribute.name, "must be an S3 URI (s3://bucket/prefix)", value, InputError)
    _text(max_len=limits.S3_URI_MAX)(_, attribute, value)


def _in_api(_, attribute, value):
    # v2 still sends TargetAttributeName; the API (botocore's model) no longer has it
    if value is not None and "TargetAttributeName" not in limits.shape("InputDataConfig[]").members:
        limits.fail(attribute.name, "is not accepted by the CreateTrainingJob API", value,
                    InputError)


def _tuple_or_none(value):
    return None if value is None else tuple(value)


@attrs.frozen
class TrainingInput:
    """An S3 channel, as v2's ``sagemaker.inputs.TrainingInput``."""

    s3_data: str = attrs.field(validator=_s3_data)
    distribution: str | None = attrs.field(default=None,
                                           validator=_one_of(limits.S3_DISTRIBUTIONS))
    compression: str | None = attrs.field(default=None, validator=_one_of(limits.COMPRESSION_TYPES))
    content_type: str | None = attrs.field(default=None,
                                           validator=_text(max_len=limits.CONTENT_TYPE_MAX))
    record_wrapping: str | None = attrs.field(default=None,
                                              validator=_one_of(limits.RECORD_WRAPPERS))
    s3_data_type: str = attrs.field(default="S3Prefix", validator=_one_of(limits.S3_DATA_TYPES))
    instance_groups: tuple[str, ...] | None = attrs.field(
        default=None, converter=_tuple_or_none,
        validator=limits.items(limits.CHANNEL_INSTANCE_GROUPS_MAX, error=InputError))
    input_mode: str | None = attrs.field(default=None, validator=_one_of(limits.INPUT_MODES))
    attribute_names: tuple[str, ...] | None = attrs.field(
        default=None, converter=_tuple_or_none,
        validator=limits.items(limits.ATTRIBUTE_NAMES_MAX, error=InputError))
    target_attribute_name: str | None = attrs.field(default=None, validator=[_text(), _in_api])
    shuffle_config: ShuffleConfig | None = attrs.field(
        default=None, validator=attrs.validators.optional(
            attrs.validators.instance_of(ShuffleConfig)))

    @property
    def config(self) -> dict:
        """The channel as v2 builds it (``FullyReplicated`` unless told otherwise)."""
        source = {"S3DataType": self.s3_data_type, "S3Uri": self.s3_data}
        distribution = self.distribution
        if not (self.target_attribute_name or distribution):
            distribution = "FullyReplicated"
        if distribution is not None:
            source["S3DataDistributionType"] = distribution
        if self.instance_groups is not None:
            source["InstanceGroupNames"] = list(self.instance_groups)
        if self.attribute_names is not None:
            source["AttributeNames"] = list(self.attribute_names)
        config = {"DataSource": {"S3DataSource": source}}
        optional = {"CompressionType": self.compression, "ContentType": self.content_type,
                    "RecordWrapperType": self.record_wrapping, "InputMode": self.input_mode,
                    "TargetAttributeName": self.target_attribute_name}
        config.update({k: v for k, v in optional.items() if v is not None})
        if self.shuffle_config is not None:
            config["ShuffleConfig"] = {"Seed": self.shuffle_config.seed}
        return config


@attrs.frozen
class FileSystemInput:
    """An FSx for Lustre or EFS channel, as v2's ``sagemaker.inputs.FileSystemInput``.

    The job must run in the file system's VPC (``subnets`` and ``security_group_ids``).
    """

    file_system_id: str = attrs.field(validator=_text(limits.FILE_SYSTEM_ID_PATTERN))
    file_system_type: str = attrs.field(validator=[
        attrs.validators.instance_of(str), _one_of(limits.FILE_SYSTEM_TYPES)])
    directory_path: str = attrs.field(validator=[
        attrs.validators.instance_of(str), _text(max_len=limits.DIRECTORY_PATH_MAX)])
    file_system_access_mode: str = attrs.field(default="ro",
                                               validator=_one_of(limits.FILE_SYSTEM_ACCESS_MODES))
    content_type: str | None = attrs.field(default=None,
                                           validator=_text(max_len=limits.CONTENT_TYPE_MAX))

    @property
    def config(self) -> dict:
        config = {"DataSource": {"FileSystemDataSource": {
            "FileSystemId": self.file_system_id,
            "FileSystemType": self.file_system_type,
            "DirectoryPath": self.directory_path,
            "FileSystemAccessMode": self.file_system_access_mode,
        }}}
        if self.content_type:
            config["ContentType"] = self.content_type
        return config


@attrs.frozen
class FileInput:
    """A ``file://`` directory on this machine (local mode) or on a Slurm cluster's shared
    filesystem."""

    file_uri: str = attrs.field(validator=_text())
    content_type: str | None = None

    @property
    def config(self) -> dict:
        config = {"DataSource": {"FileDataSource": {
            "FileDataDistributionType": "FullyReplicated", "FileUri": self.file_uri}}}
        if self.content_type is not None:
            config["ContentType"] = self.content_type
        return config


Input = Union[TrainingInput, FileSystemInput, FileInput]


def parse_input(value, channel: str, **s3_options) -> Input:
    """One channel's input: an input object as is, a URI string parsed by its scheme."""
    if isinstance(value, (TrainingInput, FileSystemInput, FileInput)):
        return value
    if isinstance(value, str):
        if value.startswith("s3://"):
            return TrainingInput(value, **s3_options)
        if value.startswith("file://"):
            return FileInput(value, content_type=s3_options.get("content_type"))
        limits.fail(f"inputs[{channel!r}]", 'must be an S3 or file URI ("s3://" or "file://")',
                    value, InputError)
    limits.fail(f"inputs[{channel!r}]",
                "must be a URI, TrainingInput, FileSystemInput or FileInput", value, InputError)


def parse_inputs(inputs) -> dict[str, Input]:
    """``fit()``'s ``inputs`` as channel name -> input (a lone input is ``training``)."""
    if inputs is None:
        return {}
    if isinstance(inputs, Mapping):
        return {str(name): parse_input(value, str(name)) for name, value in inputs.items()}
    return {DEFAULT_CHANNEL: parse_input(inputs, DEFAULT_CHANNEL)}


def channel(name: str, value: Input) -> dict:
    limits.text(limits.CHANNEL_NAME_PATTERN, limits.CHANNEL_NAME_MAX, min_len=1,
                error=InputError)(None, "channel name", name)
    return {**value.config, "ChannelName": name}


def model_input(model_uri: str) -> Input:
    """The model channel: a File-mode S3 channel of content type x-sagemaker-model."""
    return parse_input(model_uri, "model", content_type=MODEL_CONTENT_TYPE, input_mode="File")


def input_config(inputs, model_uri: str | None = None,
                 model_channel_name: str = "model") -> list[dict] | None:
    """``InputDataConfig``: the channels of ``inputs`` then the model channel; None if none."""
    parsed = parse_inputs(inputs)
    if model_uri:
        if model_channel_name in parsed:
            limits.fail("model_channel_name", "must not repeat a channel of inputs",
                        model_channel_name, InputError)
        parsed[model_channel_name] = model_input(model_uri)
    if not parsed:
        return None
    if len(parsed) > limits.CHANNELS_MAX:
        limits.fail("inputs", f"must have at most {limits.CHANNELS_MAX} channels",
                    limits.Count(len(parsed)), InputError)
    return [channel(name, value) for name, value in parsed.items()]


def lone_input_mode(inputs) -> str | None:
    """A single ``TrainingInput``'s own ``input_mode``, which becomes the job's (as in v2)."""
    return inputs.input_mode if isinstance(inputs, TrainingInput) else None
