"""``shoal.PyTorch``: a PyTorch script-mode estimator, as v2's ``sagemaker.pytorch.PyTorch``."""

from __future__ import annotations

from shoal.estimator import Framework

AUTO = "auto"


class PyTorch(Framework):
    """Run ``entry_point`` with PyTorch ``framework_version`` (Shoal's image unless
    ``image_uri``); ``distribution`` takes v2's dict (``smdistributed``, ``mpi``,
    ``torch_distributed``, ``pytorchddp``, ``instance_groups``) or ``"auto"``: the strategy
    planner chooses it at ``fit()`` from the instance type and count and ``model_description``
    (see :mod:`shoal.planning.auto`)."""

    _framework_name = "pytorch"

    def __init__(self, entry_point=None, framework_version=None, py_version=None,
                 source_dir=None, hyperparameters=None, image_uri=None, distribution=None,
                 model_description=None, **kwargs):
        auto = isinstance(distribution, str) and distribution == AUTO
        super().__init__(entry_point, source_dir=source_dir, hyperparameters=hyperparameters,
                         image_uri=image_uri, framework_version=framework_version,
                         py_version=py_version, distribution=None if auto else distribution,
                         **kwargs)
        self.model_description = model_description
        self.strategy_plan = None
        self._auto = auto

    def _model_class(self):
        from shoal.deploy.model import PyTorchModel

        return PyTorchModel

    def _metrics_default(self) -> bool | None:
        # v2 turns SageMaker metrics time series on from PyTorch 1.3
        return self._metrics_since("1.3")

    def _prepare_for_training(self, job_name: str | None = None) -> str:
        if self._auto:
            self._plan_distribution()
        return super()._prepare_for_training(job_name)

    def _plan_distribution(self) -> None:
        """Plan once per cluster; an impossible plan raises before anything is uploaded."""
        from shoal.planning import auto
        from shoal.planning.strategy import CHECKPOINTING_ENV

        c = self.config
        key = (c.instance_type, c.instance_count, repr(self.model_description),
               repr(sorted(self._hyperparameters.items())))
        if self.strategy_plan is not None and self._planned_for == key:
            return
        plan = auto.plan_job(self.model_description, self._hyperparameters, c.instance_type,
                             c.instance_count)
        auto.log_plan(plan)
        self.distribution = plan.distribution
        self.distribution_config = self._parse_distribution()
        environment = {k: v for k, v in (c.environment or {}).items()
                       if k != CHECKPOINTING_ENV}
        environment.update(plan.environment)
        self.environment = environment or c.environment
        self.strategy_plan, self._planned_for = plan, key
