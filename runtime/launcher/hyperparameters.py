"""Hyperparameters as the training toolkit reads them.

``hyperparameters.json`` holds string values (the SDK JSON-encodes each one); each is
JSON-decoded with a fallback to the raw string. Keys starting with ``sagemaker_`` and the
reserved keys are framework parameters; the rest are the script's own and become its
command line, sorted by key.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from typing import Any

log = logging.getLogger(__name__)

SAGEMAKER_PREFIX = "sagemaker_"

# Framework keys that the toolkit keeps out of additional_framework_parameters.
RESERVED = (
    "sagemaker_program",
    "sagemaker_submit_directory",
    "sagemaker_enable_cloudwatch_metrics",
    "sagemaker_region",
    "sagemaker_container_log_level",
    "sagemaker_job_name",
    "default_user_module_name",
    "_tuning_objective_metric",
    "sagemaker_s3_output",
)


def decode(raw: Mapping[str, Any]) -> dict[str, Any]:
    """JSON-decode every value, keeping the raw value when it is not JSON."""
    decoded = {}
    for key, value in raw.items():
        try:
            decoded[key] = json.loads(value)
        except (TypeError, ValueError):
            # Values are logged by key only: they may be secrets.
            log.debug("hyperparameter %s is not JSON; using it as a string", key)
            decoded[key] = value
    return decoded


def is_framework_key(key: str) -> bool:
    return key in RESERVED or key.startswith(SAGEMAKER_PREFIX)


def split(decoded: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(framework parameters, user hyperparameters)."""
    framework = {k: v for k, v in decoded.items() if is_framework_key(k)}
    user = {k: v for k, v in decoded.items() if not is_framework_key(k)}
    return framework, user


def additional_framework_parameters(framework: Mapping[str, Any]) -> dict[str, Any]:
    """The framework parameters other than the reserved ones (``SM_FRAMEWORK_PARAMS``)."""
    return {k: v for k, v in framework.items() if k not in RESERVED}


def _text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bytes):
        return value.decode("latin1")
    return str(value)


def _arg_name(key: Any) -> str:
    name = _text(key)
    if not name:
        return ""
    return f"--{name}" if len(name) > 1 else f"-{name}"


def _arg_value(value: Any) -> str:
    if isinstance(value, Mapping):
        return ",".join(f"{k}={v}" for k, v in sorted(value.items()))
    return _text(value)


def to_cmd_args(user: Mapping[str, Any]) -> list[str]:
    """``--key value`` pairs in sorted key order (``-k`` for one-letter keys)."""
    args: list[str] = []
    for key in sorted(user):
        args += [_arg_name(key), _arg_value(user[key])]
    return args
