"""``shoal.PyTorch``: a PyTorch script-mode estimator, as v2's ``sagemaker.pytorch.PyTorch``."""

from __future__ import annotations

from shoal.estimator import Framework


class PyTorch(Framework):
    """Run ``entry_point`` with PyTorch ``framework_version`` (Shoal's image unless
    ``image_uri``); ``distribution`` takes v2's dict (``smdistributed``, ``mpi``,
    ``torch_distributed``, ``pytorchddp``, ``instance_groups``)."""

    _framework_name = "pytorch"

    def __init__(self, entry_point=None, framework_version=None, py_version=None,
                 source_dir=None, hyperparameters=None, image_uri=None, distribution=None,
                 **kwargs):
        super().__init__(entry_point, source_dir=source_dir, hyperparameters=hyperparameters,
                         image_uri=image_uri, framework_version=framework_version,
                         py_version=py_version, distribution=distribution, **kwargs)

    def _metrics_default(self) -> bool | None:
        # v2 turns SageMaker metrics time series on from PyTorch 1.3
        return self._metrics_since("1.3")
