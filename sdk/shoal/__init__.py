"""Shoal: open, SageMaker-compatible distributed training.

``from shoal import PyTorch, TensorFlow, Estimator`` and
``from shoal.inputs import TrainingInput, FileSystemInput`` stand in for the SageMaker
Python SDK v2's classes of the same names.

The SDK's names load on first use, so that the runtime subpackages (``shoal.launcher``,
``shoal.dataparallel``) import without boto3 inside a training container.
"""

import importlib

__version__ = "0.1.0"

_EXPORTS = {
    "attach": "shoal.attaching",
    "Estimator": "shoal.estimator",
    "EstimatorBase": "shoal.estimator",
    "Framework": "shoal.estimator",
    "InstanceGroup": "shoal.estimator",
    "Model": "shoal.deploy.model",
    "PyTorchModel": "shoal.deploy.model",
    "TensorFlowModel": "shoal.deploy.model",
    "Predictor": "shoal.deploy.predictor",
    "PyTorchPredictor": "shoal.deploy.predictor",
    "TensorFlowPredictor": "shoal.deploy.predictor",
    "FileSystemInput": "shoal.inputs",
    "ShuffleConfig": "shoal.inputs",
    "TrainingInput": "shoal.inputs",
    "PyTorch": "shoal.pytorch",
    "Session": "shoal.session",
    "TensorFlow": "shoal.tensorflow",
}

__all__ = [*_EXPORTS, "__version__"]


def __getattr__(name):
    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'shoal' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_EXPORTS))
