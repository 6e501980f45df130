"""The JSON protocol of the APIs served (1.1 for SageMaker and Logs, 1.0 for CloudWatch: the
same shapes), checked against botocore's own service models.

A request is ``POST /`` with ``X-Amz-Target: <prefix>.<Operation>`` and a JSON body of the
operation's input shape. :func:`parse` names the service and operation and checks the body
the way the service does: botocore's validator (required members, types, minimums) and then
what it leaves out (maximums, enums, patterns), with the service's message; where the model
wants an S3 URI, a ``file://`` URI passes too (a local job reads and writes this machine). :func:`encode`
writes an output as the service does: timestamps as epoch seconds.
"""

from __future__ import annotations

import datetime as dt
import functools
import json
import re

import attrs
import botocore.session
from botocore.validate import ParamValidator

from .api_errors import UnknownOperationException, ValidationException

# CloudWatch: botocore sends JSON 1.0 to it (its first protocol it speaks beside CBOR)
SERVICES = {"SageMaker": "sagemaker", "Logs_20140328": "logs",
            "GraniteServiceVersion20100801": "cloudwatch"}


@attrs.frozen
class Call:
    service: str      # sagemaker, logs or cloudwatch
    operation: str    # CreateTrainingJob, GetLogEvents, ...
    params: dict


@functools.cache
def service_model(name: str):
    return botocore.session.get_session().get_service_model(name)


def parse(target: str | None, body: bytes) -> Call:
    prefix, _, operation = (target or "").partition(".")
    if prefix not in SERVICES or not operation:
        raise UnknownOperationException(f"unknown X-Amz-Target {target!r}")
    model = service_model(SERVICES[prefix])
    if operation not in model.operation_names:
        raise UnknownOperationException(f"{prefix} has no operation {operation!r}")
    try:
        params = json.loads(body or b"{}")
    except ValueError as error:
        raise ValidationException(f"the request body is not JSON: {error}") from None
    if not isinstance(params, dict):
        raise ValidationException("the request body must be a JSON object")
    shape = model.operation_model(operation).input_shape
    if shape is not None:
        report = ParamValidator().validate(_as_datetimes(params, shape), shape)
        if report.has_errors():
            raise ValidationException(report.generate_report())
        problems = list(constraint_errors(params, shape, ""))
        if problems:
            raise ValidationException(
                f"{len(problems)} validation error{'s' if len(problems) > 1 else ''} detected: "
                + "; ".join(problems))
    return Call(SERVICES[prefix], operation, params)


def _as_datetimes(value, shape):
    """JSON carries timestamps as epoch seconds; botocore's validator wants datetimes."""
    kind = shape.type_name
    if kind == "timestamp" and isinstance(value, (int, float)) and not isinstance(value, bool):
        return dt.datetime.fromtimestamp(value, dt.timezone.utc)
    if kind == "structure" and isinstance(value, dict):
        return {k: _as_datetimes(v, shape.members[k]) if k in shape.members else v
                for k, v in value.items()}
    if kind == "list" and isinstance(value, list):
        return [_as_datetimes(v, shape.member) for v in value]
    if kind == "map" and isinstance(value, dict):
        return {k: _as_datetimes(v, shape.value) for k, v in value.items()}
    return value


def _member_name(path: str) -> str:
    # the service names members in camel case: trainingJobName, resourceConfig.instanceCount
    return ".".join(p[:1].lower() + p[1:] for p in path.split(".")) if path else "request"


@functools.cache
def _pattern(raw: str):
    try:
        return re.compile(raw)
    except re.error:  # a Java-only construct: the pattern is not checked here
        return None


def constraint_errors(value, shape, path: str):
    """What botocore's validator does not check: maximums, enums and patterns."""
    kind, meta = shape.type_name, shape.metadata
    name = _member_name(path)
    if kind == "structure" and isinstance(value, dict):
        for key, member in value.items():
            if key in shape.members:
                yield from constraint_errors(member, shape.members[key], f"{path}.{key}".strip("."))
        return
    if kind == "list" and isinstance(value, list):
        if "max" in meta and len(value) > meta["max"]:
            yield (f"Value at '{name}' failed to satisfy constraint: Member must have length "
                   f"less than or equal to {meta['max']}")
        for n, item in enumerate(value):
            yield from constraint_errors(item, shape.member, f"{path}.{n + 1}")
        return
    if kind == "map" and isinstance(value, dict):
        if "max" in meta and len(value) > meta["max"]:
            yield (f"Value at '{name}' failed to satisfy constraint: Map must have length less "
                   f"than or equal to {meta['max']}")
        for key, item in value.items():
            yield from constraint_errors(key, shape.key, f"{path}.key")
            yield from constraint_errors(item, shape.value, f"{path}.{key}")
        return
    if kind == "string" and isinstance(value, str):
        if "max" in meta and len(value) > meta["max"]:
            yield (f"Value '{value[:64]}' at '{name}' failed to satisfy constraint: Member must "
                   f"have length less than or equal to {meta['max']}")
        if shape.enum and value not in shape.enum:
            yield (f"Value '{value[:64]}' at '{name}' failed to satisfy constraint: Member must "
                   f"satisfy enum value set: [{', '.join(shape.enum)}]")
        pattern = _pattern(meta["pattern"]) if "pattern" in meta else None
        local = value.startswith("file://") and "s3" in meta.get("pattern", "")
        if pattern is not None and not pattern.fullmatch(value) and not local:
            yield (f"Value '{value[:64]}' at '{name}' failed to satisfy constraint: Member must "
                   f"satisfy regular expression pattern: {meta['pattern']}")
    elif kind in ("integer", "long", "float", "double") and isinstance(value, (int, float)):
        if "max" in meta and value > meta["max"]:
            yield (f"Value '{value}' at '{name}' failed to satisfy constraint: Member must have "
                   f"value less than or equal to {meta['max']}")


def _default(value):
    if isinstance(value, dt.datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=dt.timezone.utc)
        return round(value.timestamp(), 3)
    raise TypeError(f"cannot encode {type(value).__name__}")


def encode(output: dict) -> bytes:
    """An output as the service writes it: timestamps as epoch seconds, no nulls."""
    return json.dumps(_without_nulls(output), default=_default).encode()


def _without_nulls(value):
    if isinstance(value, dict):
        return {k: _without_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_without_nulls(v) for v in value]
    return value
