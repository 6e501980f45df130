"""The /opt/ml layout of a training job, rooted at ``$SAGEMAKER_BASE_DIR`` when set.

SageMaker mounts ``/opt/ml`` into the container; outside it (tests, local mode, simulated
hosts) ``SAGEMAKER_BASE_DIR`` names the root of an /opt/ml-shaped tree. Every other module
asks this one for a path instead of joining strings.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

import attrs

SAGEMAKER_BASE_PATH = "/opt/ml"
BASE_DIR_ENV = "SAGEMAKER_BASE_DIR"


def resolve_base_dir(environ: Mapping[str, str] = os.environ) -> str:
    """``$SAGEMAKER_BASE_DIR`` when set (as the toolkit does), else ``/opt/ml``."""
    return environ.get(BASE_DIR_ENV) or SAGEMAKER_BASE_PATH


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
