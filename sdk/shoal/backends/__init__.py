"""Where a training job runs. A backend takes the pure ``CreateTrainingJob`` request an
estimator built and returns a handle on the job; the estimator never does the I/O itself.

- ``shoal.backends.sagemaker``: submits to the SageMaker API and follows the job.
- ``shoal.backends.local``: runs the job on this machine (``instance_type="local"`` or
  ``"local_gpu"``), with the same request.
- ``shoal.backends.slurm``: submits the job to a Slurm cluster (``Session(backend="slurm")``
  or ``SHOAL_BACKEND=slurm``; the local instance types still run on this machine).

A backend module exposes ``backend(session)``, or a class (``LocalBackend``,
``SageMakerBackend``) taking the session as its first argument.
"""

from __future__ import annotations

import importlib
import os
from typing import Protocol, runtime_checkable

from shoal.errors import ConfigError
from shoal.frameworks import BACKENDS, LOCAL_INSTANCE_TYPES


@runtime_checkable
class TrainingJob(Protocol):
    """A submitted training job."""

    name: str

    def describe(self) -> dict:
        """The job's ``DescribeTrainingJob`` response (or its local equivalent)."""

    def wait(self, logs: str | bool = "All") -> dict:
        """Block until the job ends, following its logs unless ``logs`` is False/"None";
        raise a ``JobError`` leaf if it did not complete. Returns the final description."""

    def logs(self) -> None:
        """Print the job's logs until it ends."""

    def stop(self) -> None:
        """Ask the job to stop."""

    @property
    def model_data(self) -> str | None:
        """The URI of ``model.tar.gz`` once the job completed."""


@runtime_checkable
class Backend(Protocol):
    """Submits a ``CreateTrainingJob`` request."""

    def submit(self, request: dict) -> TrainingJob:
        """Start the job the request describes and return its handle."""




def chosen_backend(session=None, environ=os.environ) -> str | None:
    """The backend the session or ``SHOAL_BACKEND`` names, if any (checked against BACKENDS)."""
    name = getattr(session, "backend", None)
    if not isinstance(name, str):  # a session without one (SDK v2's, a test's double)
        name = None
    name = name or environ.get("SHOAL_BACKEND") or None
    if name is not None and name not in BACKENDS:
        raise ConfigError(f"'backend' must be one of {', '.join(BACKENDS)} (got {name!r})")
    return name


def backend_name(instance_type: str | None, session=None) -> str:
    """``local`` for the local instance types; otherwise the chosen backend, else
    ``sagemaker``."""
    if instance_type in LOCAL_INSTANCE_TYPES:
        return "local"
    return chosen_backend(session) or "sagemaker"


_CLASS_NAMES = {"local": "LocalBackend", "sagemaker": "SageMakerBackend",
                "slurm": "SlurmBackend"}


def backend_for(instance_type: str | None, session) -> Backend:
    """The backend that runs jobs of this instance type, bound to ``session``."""
    name = backend_name(instance_type, session)
    module = importlib.import_module(f"shoal.backends.{name}")
    factory = getattr(module, "backend", None) or getattr(module, _CLASS_NAMES[name])
    return factory(session)
