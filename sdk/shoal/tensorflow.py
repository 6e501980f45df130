"""``shoal.TensorFlow``: a TensorFlow script-mode estimator, as v2's
``sagemaker.tensorflow.TensorFlow`` (including its ``model_dir`` hyperparameter)."""

from __future__ import annotations

from shoal import naming
from shoal.estimator import Framework

# Under MPI every rank would write to S3; v2 points model_dir at the local model directory.
MPI_MODEL_DIR = "/opt/ml/model"


class TensorFlow(Framework):
    """Run ``entry_point`` with TensorFlow ``framework_version``. ``model_dir`` (default:
    ``<output_path>/<job>/model``; ``False`` to send none) reaches the script as
    ``--model_dir``."""

    _framework_name = "tensorflow"

    def __init__(self, py_version=None, framework_version=None, model_dir=None,
                 image_uri=None, distribution=None, entry_point=None, **kwargs):
        self.model_dir = model_dir
        super().__init__(entry_point, image_uri=image_uri, framework_version=framework_version,
                         py_version=py_version, distribution=distribution, **kwargs)

    def _model_class(self):
        from shoal.deploy.model import TensorFlowModel

        return TensorFlowModel

    def create_model(self, role=None, entry_point=None, **kwargs):
        """The SavedModel the job wrote, served as is (v2 passes no entry point for
        TensorFlow); ``entry_point="inference.py"`` adds input/output handlers."""
        if entry_point is None:
            from shoal.deploy.model import TensorFlowModel

            return TensorFlowModel(self.model_data, role=role or self.config.role,
                                   framework_version=self.framework_version,
                                   image_uri=kwargs.pop("image_uri", None) or self.image_uri,
                                   sagemaker_session=self.sagemaker_session, **kwargs)
        return super().create_model(role=role, entry_point=entry_point, **kwargs)

    def _metrics_default(self) -> bool | None:
        # v2 turns SageMaker metrics time series on from TensorFlow 1.15
        return self._metrics_since("1.15")

    def _framework_hyperparameters(self) -> dict:
        out = super()._framework_hyperparameters()
        model_dir = self._model_dir(mpi=bool(out.get("sagemaker_mpi_enabled")))
        if model_dir is not None:
            out["model_dir"] = model_dir
        return out

    def _model_dir(self, mpi: bool) -> str | None:
        if self.model_dir is False:
            return None
        if self.model_dir:
            return self.model_dir
        if self.config.files_in_place:
            return "/opt/ml/shared/model"
        if mpi:
            return MPI_MODEL_DIR
        if self._current_job_name and self._output_path:
            return naming.s3_join(self._output_path, self._current_job_name, "model")
        return None

    def _debug_hook_allowed(self) -> bool:
        # v2: SageMaker Debugger does not support parameter-server training
        if self.distribution_config.parameter_server_enabled:
            return False
        return super()._debug_hook_allowed()
