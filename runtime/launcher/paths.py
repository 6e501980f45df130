"""The /opt/ml layout of a training job, rooted at ``$SAGEMAKER_BASE_DIR`` when set.

SageMaker mounts ``/opt/ml`` into the container; outside it (tests, local mode, simulated
hosts) ``SAGEMAKER_BASE_DIR`` names the root of an /opt/ml-shaped tree. Every other module
asks this one for a path instead of joining strings. :func:`rebase` moves /opt/ml paths
found in hyperparameters under the base directory.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import attrs

SAGEMAKER_BASE_PATH = "/opt/ml"
BASE_DIR_ENV = "SAGEMAKER_BASE_DIR"


def resolve_base_dir(environ: Mapping[str, str] = os.environ) -> str:
    """``$SAGEMAKER_BASE_DIR`` when set (as the toolkit does), else ``/opt/ml``."""
    return environ.get(BASE_DIR_ENV) or SAGEMAKER_BASE_PATH


def rebase(value: Any, base_dir: str) -> Any:
    """``value`` moved under ``base_dir`` when it is an absolute path under /opt/ml (pure).

    SageMaker's SDK sends such paths (TensorFlow's ``model_dir=/opt/ml/shared/model`` for
    local code); a job rooted elsewhere must not write to the machine's real /opt/ml.
    Anything else, including paths that only look like /opt/ml after ``..``, is unchanged.
    """
    if not isinstance(value, str) or not value.startswith(SAGEMAKER_BASE_PATH):
        return value
    if os.path.abspath(base_dir) == SAGEMAKER_BASE_PATH:
        return value
    normal = os.path.normpath(value)
    if normal != SAGEMAKER_BASE_PATH and not normal.startswith(SAGEMAKER_BASE_PATH + "/"):
        return value
    rest = os.path.relpath(normal, SAGEMAKER_BASE_PATH)
    return os.path.abspath(base_dir) if rest == "." else os.path.join(os.path.abspath(base_dir), rest)


def rebase_all(values: Mapping[str, Any], base_dir: str) -> tuple[dict[str, Any], tuple[str, ...]]:
    """Every value moved by :func:`rebase`; also the keys whose value moved (pure)."""
    moved = {k: rebase(v, base_dir) for k, v in values.items()}
    return moved, tuple(sorted(k for k in values if moved[k] != values[k]))


@attrs.frozen
class JobPaths:
    """Every well-known path of the /opt/ml contract under one base directory."""

    base_dir: str = attrs.field(converter=os.path.abspath)

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] = os.environ) -> JobPaths:
        return cls(resolve_base_dir(environ))

    def _join(self, *parts: str) -> str:
        return os.path.join(self.base_dir, *parts)

    @property
    def code_dir(self) -> str:
        return self._join("code")

    @property
    def model_dir(self) -> str:
        return self._join("model")

    @property
    def checkpoints_dir(self) -> str:
        return self._join("checkpoints")

    @property
    def input_dir(self) -> str:
        return self._join("input")

    @property
    def input_config_dir(self) -> str:
        return self._join("input", "config")

    @property
    def input_data_dir(self) -> str:
        return self._join("input", "data")

    @property
    def output_dir(self) -> str:
        return self._join("output")

    @property
    def output_data_dir(self) -> str:
        return self._join("output", "data")

    @property
    def output_intermediate_dir(self) -> str:
        return self._join("output", "intermediate")

    @property
    def hyperparameters_file(self) -> str:
        return os.path.join(self.input_config_dir, "hyperparameters.json")

    @property
    def resource_config_file(self) -> str:
        return os.path.join(self.input_config_dir, "resourceconfig.json")

    @property
    def input_data_config_file(self) -> str:
        return os.path.join(self.input_config_dir, "inputdataconfig.json")

    @property
    def success_file(self) -> str:
        return os.path.join(self.output_dir, "success")

    @property
    def failure_file(self) -> str:
        return os.path.join(self.output_dir, "failure")

    def channel_dir(self, channel: str) -> str:
        return os.path.join(self.input_data_dir, channel)

    def ensure_output_dirs(self) -> None:
        """Create the directories the job writes into (model, output data, code)."""
        for path in (self.model_dir, self.output_data_dir, self.code_dir):
            os.makedirs(path, exist_ok=True)
