"""The SageMaker API's limits on a ``CreateTrainingJob`` request, read from botocore's
service model, and attrs validators that enforce them with attrs-style messages
(``'max_retry_attempts' must be <= 30 (got 99)``) as Shoal ``ValidationError`` leaves.

The service model is the source of truth: when AWS raises a limit, a newer botocore
carries it here without a change to Shoal.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable

import botocore.session

from shoal.errors import ValidationError

OPERATION = "CreateTrainingJob"


@functools.lru_cache(maxsize=1)
def _input_shape():
    model = botocore.session.get_session().get_service_model("sagemaker")
    return model.operation_model(OPERATION).input_shape


def shape(path: str):
    """The botocore shape at a dotted path of the request: ``"VpcConfig.Subnets"``.

    ``[]`` steps into a list's member, ``{k}``/``{v}`` into a map's key or value.
    """
    current = _input_shape()
    for step in path.split("."):
        name, suffix = re.fullmatch(r"([A-Za-z0-9]*)((?:\[\]|\{[kv]\})*)", step).groups()
        if name:
            current = current.members[name]
        for hop in re.findall(r"\[\]|\{[kv]\}", suffix):
            current = {"[]": lambda s: s.member, "{k}": lambda s: s.key,
                       "{v}": lambda s: s.value}[hop](current)
    return current


def bound(path: str, which: str) -> int | None:
    """``min`` or ``max`` of a shape (a length for strings and lists, a value for numbers)."""
    return shape(path).metadata.get(which)


def enum(path: str) -> tuple[str, ...]:
    return tuple(shape(path).enum)


# botocore patterns use Java's \p{...} classes; Python's re needs the equivalent.
_JAVA_CLASSES = {r"\p{N}": r"\d", r"\p{Z}": r"\s", r"\p{Alnum}": r"a-zA-Z0-9"}


def pattern(path: str) -> re.Pattern:
    """The shape's pattern, compiled for a full match."""
    text = shape(path).metadata["pattern"]
    if r"\p{L}" in text:
        # a class made only of letters, digits, spaces and punctuation: \w covers L and N
        text = text.replace(r"\p{L}\p{Z}\p{N}", r"\w\s").replace(r"\p{L}", r"\w")
    for java, python in _JAVA_CLASSES.items():
        text = text.replace(java, python)
    return re.compile(text)


# The limits Shoal checks before any call, by name.
JOB_NAME_MAX = bound("TrainingJobName", "max")
JOB_NAME_PATTERN = pattern("TrainingJobName")
ROLE_ARN_PATTERN = pattern("RoleArn")
HYPERPARAMETERS_MAX = bound("HyperParameters", "max")
HYPERPARAMETER_KEY_MAX = bound("HyperParameters{k}", "max")
HYPERPARAMETER_VALUE_MAX = bound("HyperParameters{v}", "max")
ENVIRONMENT_MAX = bound("Environment", "max")
ENVIRONMENT_KEY_MAX = bound("Environment{k}", "max")
ENVIRONMENT_KEY_PATTERN = pattern("Environment{k}")
ENVIRONMENT_VALUE_MAX = bound("Environment{v}", "max")
RETRY_MIN = bound("RetryStrategy.MaximumRetryAttempts", "min")
RETRY_MAX = bound("RetryStrategy.MaximumRetryAttempts", "max")
KMS_KEY_MAX = bound("OutputDataConfig.KmsKeyId", "max")
KMS_KEY_PATTERN = pattern("OutputDataConfig.KmsKeyId")
SUBNETS_MAX = bound("VpcConfig.Subnets", "max")
SECURITY_GROUPS_MAX = bound("VpcConfig.SecurityGroupIds", "max")
VPC_ID_MAX = bound("VpcConfig.Subnets[]", "max")
VPC_ID_PATTERN = pattern("VpcConfig.Subnets[]")
TAGS_MAX = bound("Tags", "max")
TAG_KEY_MAX = bound("Tags[].Key", "max")
TAG_VALUE_MAX = bound("Tags[].Value", "max")
TAG_PATTERN = pattern("Tags[].Key")
METRIC_DEFINITIONS_MAX = bound("AlgorithmSpecification.MetricDefinitions", "max")
METRIC_NAME_MAX = bound("AlgorithmSpecification.MetricDefinitions[].Name", "max")
METRIC_REGEX_MAX = bound("AlgorithmSpecification.MetricDefinitions[].Regex", "max")
CHANNELS_MAX = bound("InputDataConfig", "max")
CHANNEL_NAME_MAX = bound("InputDataConfig[].ChannelName", "max")
CHANNEL_NAME_PATTERN = pattern("InputDataConfig[].ChannelName")
S3_URI_MAX = bound("OutputDataConfig.S3OutputPath", "max")
S3_URI_PATTERN = pattern("OutputDataConfig.S3OutputPath")
LOCAL_PATH_MAX = bound("CheckpointConfig.LocalPath", "max")
FILE_SYSTEM_ID_PATTERN = pattern("InputDataConfig[].DataSource.FileSystemDataSource.FileSystemId")
DIRECTORY_PATH_MAX = bound("InputDataConfig[].DataSource.FileSystemDataSource.DirectoryPath", "max")
KEEP_ALIVE_MAX = bound("ResourceConfig.KeepAlivePeriodInSeconds", "max")
INSTANCE_GROUPS_MAX = bound("ResourceConfig.InstanceGroups", "max")
INSTANCE_GROUP_NAME_MAX = bound("ResourceConfig.InstanceGroups[].InstanceGroupName", "max")
CHANNEL_INSTANCE_GROUPS_MAX = bound(
    "InputDataConfig[].DataSource.S3DataSource.InstanceGroupNames", "max")
ATTRIBUTE_NAMES_MAX = bound("InputDataConfig[].DataSource.S3DataSource.AttributeNames", "max")
CONTENT_TYPE_MAX = bound("InputDataConfig[].ContentType", "max")
IMAGE_URI_MAX = bound("AlgorithmSpecification.TrainingImage", "max")
MAX_RUN_MIN = bound("StoppingCondition.MaxRuntimeInSeconds", "min")
INSTANCE_TYPES = enum("ResourceConfig.InstanceType")
INPUT_MODES = enum("AlgorithmSpecification.TrainingInputMode")
S3_DATA_TYPES = enum("InputDataConfig[].DataSource.S3DataSource.S3DataType")
S3_DISTRIBUTIONS = enum("InputDataConfig[].DataSource.S3DataSource.S3DataDistributionType")
COMPRESSION_TYPES = enum("InputDataConfig[].CompressionType")
RECORD_WRAPPERS = enum("InputDataConfig[].RecordWrapperType")
FILE_SYSTEM_TYPES = enum("InputDataConfig[].DataSource.FileSystemDataSource.FileSystemType")
FILE_SYSTEM_ACCESS_MODES = enum(
    "InputDataConfig[].DataSource.FileSystemDataSource.FileSystemAccessMode")


# ---- validators (attrs signature: (instance, attribute, value)); None always passes ----

Validator = Callable[[object, object, object], None]


class Count(int):
    """A number of entries, shown as ``51 entries`` in messages."""

    def __repr__(self) -> str:
        return f"{int(self)} entries"


def fail(name: str, message: str, value, error: type[ValidationError] = ValidationError):
    """Raise ``error`` with an attrs-style message: ``'name' must ... (got value)``."""
    raise error(f"'{name}' {message} (got {value!r})")


def _name(attribute) -> str:
    return getattr(attribute, "name", attribute)


def between(low: int | None = None, high: int | None = None,
            error: type[ValidationError] = ValidationError) -> Validator:
    """An int (not a bool) within ``[low, high]``."""
    def check(_, attribute, value):
        if value is None:
            return
        if isinstance(value, bool) or not isinstance(value, int):
            fail(_name(attribute), "must be an int", value, error)
        if low is not None and value < low:
            fail(_name(attribute), f"must be >= {low}", value, error)
        if high is not None and value > high:
            fail(_name(attribute), f"must be <= {high}", value, error)
    return check


def text(regex: re.Pattern | None = None, max_len: int | None = None, min_len: int = 0,
         error: type[ValidationError] = ValidationError) -> Validator:
    """A str of at most ``max_len`` characters fully matching ``regex``."""
    def check(_, attribute, value):
        if value is None:
            return
        if not isinstance(value, str):
            fail(_name(attribute), "must be a str", value, error)
        if len(value) < min_len:
            fail(_name(attribute), f"must be at least {min_len} characters", value, error)
        if max_len is not None and len(value) > max_len:
            fail(_name(attribute), f"must be at most {max_len} characters", value, error)
        if regex is not None and not regex.fullmatch(value):
            fail(_name(attribute), f"must match regex {regex.pattern!r}", value, error)
    return check


def one_of(options, error: type[ValidationError] = ValidationError) -> Validator:
    def check(_, attribute, value):
        if value is not None and value not in options:
            fail(_name(attribute), f"must be in {tuple(options)!r}", value, error)
    return check


def items(max_items: int | None = None, each: Validator | None = None, min_items: int = 0,
          error: type[ValidationError] = ValidationError) -> Validator:
    """A sequence of at most ``max_items`` entries, each passing ``each``."""
    def check(instance, attribute, value):
        if value is None:
            return
        name = _name(attribute)
        if isinstance(value, (str, bytes)) or not hasattr(value, "__len__"):
            fail(name, "must be a list", value, error)
        if len(value) < min_items:
            fail(name, f"must have at least {min_items} entries", value, error)
        if max_items is not None and len(value) > max_items:
            fail(name, f"must have at most {max_items} entries", Count(len(value)), error)
        if each is not None:
            for index, entry in enumerate(value):
                each(instance, f"{name}[{index}]", entry)
    return check


def boolean(_, attribute, value):
    if value is not None and not isinstance(value, bool):
        fail(_name(attribute), "must be a bool", value)


def s3_uri(error: type[ValidationError] = ValidationError) -> Validator:
    """An ``s3://bucket/...`` URI within the API's length."""
    s3_only = re.compile(r"s3://[^/]+(/.*)?")
    base = text(S3_URI_PATTERN, S3_URI_MAX, error=error)

    def check(instance, attribute, value):
        base(instance, attribute, value)
        if value is not None and not s3_only.fullmatch(value):
            fail(_name(attribute), "must be an S3 URI (s3://bucket/prefix)", value, error)
    return check


kms_key = text(KMS_KEY_PATTERN, KMS_KEY_MAX)
