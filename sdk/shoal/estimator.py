"""Estimators with the SageMaker Python SDK v2's arguments and defaults: ``Estimator``
(any image), ``Framework`` (script mode: an entry point and its source directory), and
through it ``shoal.PyTorch`` and ``shoal.TensorFlow``.

An estimator parses its arguments once into a validated ``TrainingConfig``; ``fit()``
resolves the job (name, image, output path, code location), builds the request purely
(``build_request``), stages the code and hands the request to a backend (SageMaker, or
this machine for ``instance_type="local"``).
"""

from __future__ import annotations

import json
import logging
import os
import sys
import uuid
import warnings

import attrs

from shoal import image_uris, limits, naming, secrets
from shoal import request as request_
from shoal.backends import backend_for, chosen_backend
from shoal.debugger.rules import DETAILED_PROFILER_RULE, local_source
from shoal.errors import ValidationError
from shoal.planning import advisor
from shoal.request import InstanceGroup, Resolved, TrainingConfig
from shoal.session import Session

__all__ = ["Estimator", "EstimatorBase", "Framework", "InstanceGroup"]

CONFIG_FIELDS = frozenset(attrs.fields_dict(TrainingConfig))
# SageMaker Python SDK v1 argument names, still accepted with a DeprecationWarning.
RENAMED = {
    "train_instance_count": "instance_count",
    "train_instance_type": "instance_type",
    "train_max_run": "max_run",
    "train_use_spot_instances": "use_spot_instances",
    "train_max_wait": "max_wait",
    "train_volume_size": "volume_size",
    "train_volume_kms_key": "volume_kms_key",
}
CODE_CHANNEL_ARCHIVE = "/opt/ml/input/data/code/sourcedir.tar.gz"


def _caller_stacklevel() -> int:
    """The stacklevel of the first frame outside Shoal's SDK: the user's call."""
    here = os.path.dirname(__file__)
    frame, level = sys._getframe(1), 1
    while frame is not None and os.path.dirname(frame.f_code.co_filename) == here:
        frame, level = frame.f_back, level + 1
    return level


def _deprecated(old: str, new: str) -> None:
    warnings.warn(f"'{old}' is deprecated, use '{new}' (renamed in SageMaker Python SDK v2)",
                  DeprecationWarning, stacklevel=_caller_stacklevel())


def pop_renamed(kwargs: dict, old: str, new: str, value):
    """``value``, or the v1-named argument's when given (with a DeprecationWarning)."""
    if old in kwargs:
        _deprecated(old, new)
        return kwargs.pop(old)
    return value


def apply_renamed(params: dict, extra: dict) -> dict:
    """Move v1 names in ``extra`` to their v2 names in ``params``; refuse unknown ones."""
    for old, new in RENAMED.items():
        if old in extra:
            _deprecated(old, new)
            params[new] = extra.pop(old)
    if extra:
        raise TypeError(f"unexpected keyword arguments: {', '.join(sorted(extra))}")
    return params


@attrs.frozen
class CodePlan:
    """Where the job's code comes from: ``sagemaker_submit_directory`` and
    ``sagemaker_program``, and the archive to upload (None when nothing is uploaded)."""

    submit_directory: str
    script_name: str
    archive_uri: str | None = None
    kms_key: str | None = None


class EstimatorBase:
    """What every estimator shares: arguments, job resolution, request, fit."""

    _framework_name: str | None = None

    def __init__(self, role=None, instance_count=None, instance_type=None,
                 keep_alive_period_in_seconds=None, volume_size=30, volume_kms_key=None,
                 max_run=24 * 60 * 60, input_mode="File", output_path=None, output_kms_key=None,
                 base_job_name=None, sagemaker_session=None, tags=None, subnets=None,
                 security_group_ids=None, model_uri=None, model_channel_name="model",
                 metric_definitions=None, encrypt_inter_container_traffic=False,
                 use_spot_instances=False, max_wait=None, checkpoint_s3_uri=None,
                 checkpoint_local_path=None, debugger_hook_config=None,
                 enable_sagemaker_metrics=None, enable_network_isolation=False,
                 disable_profiler=False, environment=None, max_retry_attempts=None,
                 source_dir=None, hyperparameters=None, container_log_level=logging.INFO,
                 code_location=None, entry_point=None, dependencies=None, instance_groups=None,
                 disable_output_compression=False, rules=None, profiler_config=None,
                 tensorboard_output_config=None, allow_secrets=False, advice=None, **kwargs):
        params = {k: v for k, v in locals().items() if k not in ("self", "kwargs", "__class__")}
        apply_renamed(params, dict(kwargs))
        # "warn" (the default, or $SHOAL_ADVICE), "strict" or "off": see shoal.planning.advisor
        params.pop("advice")
        object.__setattr__(self, "advice", None if advice is None else advisor.mode(advice))
        session = params.pop("sagemaker_session")
        object.__setattr__(self, "_hyperparameters", dict(params.pop("hyperparameters") or {}))
        params["backend"] = "slurm" if chosen_backend(session) == "slurm" else None
        object.__setattr__(self, "config", TrainingConfig(**params))
        # refuse secrets now, before any call; build_request checks the final values again
        secrets.check_no_secrets(self._hyperparameters, self.config.environment, allow_secrets)
        self.sagemaker_session = session or Session(local_mode=self.config.files_in_place,
                                                    backend=self.config.backend)
        self.latest_training_job = None
        self._current_job_name = None
        self._resolved: Resolved | None = None
        self._code: CodePlan | None = None
        self._output_path: str | None = None

    # v2's attributes (est.instance_type, est.max_run = 3600, ...) read and evolve the config,
    # so an assignment is validated like an argument.
    def __getattr__(self, name):
        if name in CONFIG_FIELDS and "config" in self.__dict__:
            return getattr(self.__dict__["config"], name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def __setattr__(self, name, value):
        if name in CONFIG_FIELDS and "config" in self.__dict__:
            self.__dict__["config"] = self.config.evolve(**{name: value})
        else:
            object.__setattr__(self, name, value)

    # ---- what subclasses specialise ----

    def training_image_uri(self) -> str:
        raise NotImplementedError

    def _user_hyperparameters(self) -> dict[str, str]:
        return {str(k): json.dumps(v) for k, v in self._hyperparameters.items()}

    def _framework_hyperparameters(self) -> dict:
        """Hyperparameters the framework adds (distribution, model_dir), not yet encoded."""
        return {}

    def _metrics_default(self) -> bool | None:
        return self.config.enable_sagemaker_metrics

    def _debug_hook_allowed(self) -> bool:
        return True

    # ---- hyperparameters ----

    def set_hyperparameters(self, **kwargs) -> None:
        self._hyperparameters.update(kwargs)

    def hyperparameters(self) -> dict[str, str]:
        """The hyperparameters as sent: every value a string (JSON-encoded in script mode)."""
        out = self._user_hyperparameters()
        if self._code is not None:
            out.update({k: json.dumps(v) for k, v in self._script_mode_hyperparameters().items()})
        out.update({k: json.dumps(v) for k, v in self._framework_hyperparameters().items()})
        return out

    def _script_mode_hyperparameters(self) -> dict:
        return {
            "sagemaker_submit_directory": self._code.submit_directory,
            "sagemaker_program": self._code.script_name,
            "sagemaker_container_log_level": self.config.container_log_level,
            "sagemaker_job_name": self._current_job_name,
            "sagemaker_region": self.sagemaker_session.region,
        }

    # ---- resolving one job ----

    @property
    def local_mode(self) -> bool:
        return self.config.local_mode

    def _instance_type_for_image(self) -> str | None:
        """The instance type, or with instance groups the first GPU group's (as v2)."""
        if self.config.instance_type or not self.config.instance_groups:
            return self.config.instance_type
        for group in self.config.instance_groups:
            if image_uris.processor_for(group.instance_type) == "gpu":
                return group.instance_type
        return self.config.instance_groups[0].instance_type

    def _default_output_path(self) -> str:
        if self.config.backend == "slurm" and not self.local_mode:
            return (self.sagemaker_session.slurm_settings().shared_dir / "output").as_uri() + "/"
        if self.local_mode:
            return "file://" + os.path.abspath("shoal-output")
        session = self.sagemaker_session
        return naming.s3_join(f"s3://{session.default_bucket()}",
                              getattr(session, "default_bucket_prefix", None), end_slash=True)

    def _role_arn(self) -> str:
        role = self.config.role
        if self.config.files_in_place:
            return role
        arn = self.sagemaker_session.expand_role(role)
        limits.text(limits.ROLE_ARN_PATTERN, 2048)(None, "role", arn)
        return arn

    def _code_plan(self, job_name: str, output_path: str) -> CodePlan | None:
        c = self.config
        if not (c.entry_point or c.source_dir or c.dependencies):
            return None
        script = c.entry_point if c.source_dir else os.path.basename(c.entry_point or "")
        if c.source_dir and c.source_dir.lower().startswith("s3://"):
            return CodePlan(c.source_dir, c.entry_point)
        if c.files_in_place:
            source = c.source_dir or os.path.dirname(os.path.abspath(c.entry_point))
            return CodePlan("file://" + os.path.abspath(source), script)
        archive = naming.source_archive_uri(job_name, code_location=c.code_location,
                                            output_path=output_path)
        same_bucket = naming.parse_s3_uri(archive)[0] == naming.parse_s3_uri(output_path)[0]
        kms = c.output_kms_key if (c.code_location is None or same_bucket) else None
        submit = CODE_CHANNEL_ARCHIVE if c.enable_network_isolation and c.entry_point else archive
        return CodePlan(submit, script, archive, kms)

    def _prepare_for_training(self, job_name: str | None = None) -> str:
        """Resolve the job's name, image, output path and code location; returns the name."""
        image = self.training_image_uri()
        base = self.config.base_job_name or naming.base_name_from_image(image)
        job_name = job_name or naming.name_from_base(base)
        limits.text(limits.JOB_NAME_PATTERN, limits.JOB_NAME_MAX)(None, "job_name", job_name)
        output_path = self.config.output_path or self._default_output_path()
        self._current_job_name, self._output_path = job_name, output_path
        self._code = self._code_plan(job_name, output_path)
        isolated_code = self._code is not None and self._code.submit_directory == CODE_CHANNEL_ARCHIVE
        self._resolved = Resolved(
            job_name=job_name, role_arn=self._role_arn(), image_uri=image,
            output_path=output_path, region=self.sagemaker_session.region,
            hyperparameters=self.hyperparameters(),
            enable_sagemaker_metrics=self._metrics_default(),
            debug_hook=self._debug_hook_allowed(),
            detailed_profiler_rule=self._detailed_profiler_rule_name(),
            rule_sources=self._rule_sources(),
            code_uri=self._code.archive_uri if isolated_code else None)
        return job_name

    def _rule_sources(self) -> dict[str, str]:
        """Custom rules' local sources, each given its S3 place (uploaded by fit())."""
        from shoal.debugger.request import rule_source_uris

        if self.config.files_in_place or not any(local_source(r) for r in self.config.rules or ()):
            return {}
        session = self.sagemaker_session
        bucket = naming.s3_join(f"s3://{session.default_bucket()}",
                                getattr(session, "default_bucket_prefix", None))
        return rule_source_uris(self.config.rules, bucket, lambda: str(uuid.uuid4()))

    def _stage_rule_sources(self) -> None:
        """Upload custom rules' local sources to the default bucket (with the owner check)."""
        from shoal import staging, transfer

        session = self.sagemaker_session
        by_name = {r.name: r for r in self.config.rules or ()}
        for name, uri in self._resolved.rule_sources.items():
            bucket, key = naming.parse_s3_uri(uri)
            owner = session.account_id()
            transfer.ensure_bucket(session.s3_client, bucket, region=session.region,
                                   expected_owner=owner)
            transfer.upload_file(session.s3_client, local_source(by_name[name]), bucket, key,
                                 extra_args=staging.upload_args(None, owner), progress=False)

    def _detailed_profiler_rule_name(self) -> str | None:
        """SageMaker Profiler's processing rule gets a fresh timestamped name per job."""
        config = self.config.profiler_config
        if config is None or getattr(config, "profile_params", None) is None:
            return None
        return naming.name_from_base(DETAILED_PROFILER_RULE)

    # ---- the request and the job ----

    def build_request(self, inputs=None, job_name: str | None = None) -> dict:
        """The ``CreateTrainingJob`` request. Pure once the job is resolved (``fit()`` or
        ``_prepare_for_training`` did it); otherwise resolves it first."""
        if self._resolved is None or (job_name and job_name != self._resolved.job_name):
            self._prepare_for_training(job_name)
        return request_.build_request(self.config, self._resolved, inputs)

    def _stage_code(self, job_name: str) -> None:
        """Upload ``sourcedir.tar.gz`` where the request says it is (nothing in local mode)."""
        plan = self._code
        if plan is None or plan.archive_uri is None:
            return
        from shoal import staging

        session = self.sagemaker_session
        bucket, key = naming.parse_s3_uri(plan.archive_uri)
        owner = session.account_id() if session.is_default_bucket(bucket) else None
        staging.stage_code(
            session.s3_client, bucket=bucket, key=key, entry_point=self.config.entry_point,
            source_dir=self.config.source_dir, dependencies=self.config.dependencies,
            kms_key=plan.kms_key, expected_owner=owner, region=session.region)

    def _backend(self):
        return backend_for(self._instance_type_for_image(), self.sagemaker_session)

    def fit(self, inputs=None, wait: bool = True, logs="All", job_name: str | None = None):
        """Run a training job. The request is built (and so fully checked) before the code
        is uploaded, so an invalid job sends nothing to AWS."""
        from shoal.staging import check_code_paths

        check_code_paths(self.config.entry_point, self.config.source_dir)  # as v2's fit()
        job_name = self._prepare_for_training(job_name)
        request = self.build_request(inputs, job_name)
        advisor.review(self, inputs)  # logs the tips once; raises only in strict mode
        self._stage_code(job_name)
        self._stage_rule_sources()
        self.latest_training_job = self._backend().submit(request)
        if wait:
            self.latest_training_job.wait(logs=logs)

    def logs(self) -> None:
        """Print the latest job's status and logs until it ends (v2's ``Estimator.logs``)."""
        if self.latest_training_job is None:
            raise ValidationError("no training job yet: call fit() or attach() first")
        self.latest_training_job.logs()

    @classmethod
    def attach(cls, training_job_name: str, sagemaker_session=None, model_channel_name="model",
               wait: bool = False, logs="All"):
        """The estimator of an existing SageMaker job, bound to it (see ``shoal.attach``)."""
        from shoal.attaching import attach

        return attach(training_job_name, sagemaker_session, wait=wait, logs=logs,
                      estimator_cls=None if cls in (EstimatorBase, Framework) else cls,
                      model_channel_name=model_channel_name)

    @property
    def model_data(self) -> str | None:
        """The trained model's ``model.tar.gz`` URI, once the latest job completed."""
        if self.latest_training_job is None:
            raise ValidationError("no training job yet: call fit() first")
        return self.latest_training_job.model_data

    def create_model(self, **kwargs):
        """The model of the latest job for any image: ``shoal.Model`` on the training image
        (framework estimators give their framework's model)."""
        from shoal.deploy.model import Model

        kwargs.setdefault("role", self.config.role)
        kwargs.setdefault("image_uri", self.training_image_uri())
        return Model(model_data=self.model_data, sagemaker_session=self.sagemaker_session,
                     **kwargs)

    def deploy(self, initial_instance_count=None, instance_type=None, serializer=None,
               deserializer=None, endpoint_name=None, wait=True, model_name=None, tags=None,
               kms_key=None, **create_model_kwargs):
        """Serve the latest job's model (SDK v2's ``deploy``): the model and the endpoint
        share one name from the base job name unless given; returns the predictor."""
        if self.latest_training_job is None:
            raise ValidationError("no training job yet: call fit() or attach() first")
        base = self.config.base_job_name or naming.base_name_from_image(
            self.training_image_uri())
        default = naming.name_from_base(base)
        model = self.create_model(**create_model_kwargs)
        return model.deploy(initial_instance_count, instance_type, serializer=serializer,
                            deserializer=deserializer, endpoint_name=endpoint_name or default,
                            wait=wait, model_name=model_name or default, tags=tags,
                            kms_key=kms_key)


class Estimator(EstimatorBase):
    """A training job for any image (``image_uri``), as v2's generic ``Estimator``."""

    def __init__(self, image_uri=None, role=None, instance_count=None, instance_type=None,
                 **kwargs):
        image_uri = pop_renamed(kwargs, "image_name", "image_uri", image_uri)
        if not image_uri:
            limits.fail("image_uri", "is required for an Estimator", image_uri)
        limits.text(max_len=limits.IMAGE_URI_MAX)(None, "image_uri", image_uri)
        self.image_uri = image_uri
        super().__init__(role=role, instance_count=instance_count, instance_type=instance_type,
                         **kwargs)

    def training_image_uri(self) -> str:
        return self.image_uri

    def _user_hyperparameters(self) -> dict[str, str]:
        # v2 JSON-encodes an image estimator's hyperparameters only in script mode
        if self.config.source_dir:
            return super()._user_hyperparameters()
        return {str(k): str(v) for k, v in self._hyperparameters.items()}


class Framework(EstimatorBase):
    """Script mode: ``entry_point`` (in ``source_dir``) runs in a framework image."""

    def __init__(self, entry_point, source_dir=None, hyperparameters=None, image_uri=None,
                 framework_version=None, py_version=None, distribution=None, **kwargs):
        if isinstance(entry_point, str) and entry_point.startswith("s3://"):
            limits.fail("entry_point", "must be a local file (put code in S3 with source_dir)",
                        entry_point)
        if not entry_point:
            limits.fail("entry_point", "is required", entry_point)
        image_uri = pop_renamed(kwargs, "image_name", "image_uri", image_uri)
        distribution = pop_renamed(kwargs, "distributions", "distribution", distribution)
        if image_uri is None:  # no image for this version: say so before any AWS call
            image_uris.find_spec(self._framework_name, framework_version, py_version)
        self.image_uri = image_uri
        self.framework_version = framework_version
        self.py_version = py_version
        super().__init__(entry_point=entry_point, source_dir=source_dir,
                         hyperparameters=hyperparameters, **kwargs)
        if isinstance(distribution, str):  # "auto" is shoal.PyTorch's, which takes it first
            limits.fail("distribution", "must be a dict ('auto' plans one for shoal.PyTorch)",
                        distribution)
        self.distribution = dict(distribution or {})
        self.distribution_config = self._parse_distribution()

    def _parse_distribution(self):
        from shoal.distribution import parse_distribution

        c = self.config
        return parse_distribution(
            self.distribution, framework=self._framework_name,
            framework_version=self.framework_version, py_version=self.py_version,
            instance_type=c.instance_type, instance_count=c.instance_count,
            image_uri=self.image_uri, instance_groups=c.instance_groups,
            entry_point=c.entry_point)

    def training_image_uri(self) -> str:
        session = self.sagemaker_session
        if self.config.backend == "slurm" and not self.image_uri:
            # no registry: Shoal's image as built on the cluster (its nodes run Shoal's venv)
            gpu = image_uris.processor_for(self._instance_type_for_image()) == "gpu"
            return image_uris.local_image_name(self._framework_name, self.framework_version,
                                               self.py_version, "local_gpu" if gpu else "local")
        return image_uris.training_image_uri(
            self._framework_name, self.framework_version, self.py_version,
            self._instance_type_for_image(), image_uri=self.image_uri,
            account=session.account_id, region=session.region)

    def _framework_hyperparameters(self) -> dict:
        return dict(self.distribution_config.hyperparameters())

    def _model_class(self):
        raise ValidationError(f"no serving model for {type(self).__name__} yet: use "
                              f"shoal.Model(image_uri=..., model_data=est.model_data)")

    def create_model(self, role=None, entry_point=None, source_dir=None, dependencies=None,
                     image_uri=None, **kwargs):
        """The framework model of the latest job, served with the training script (v2: the
        container imports it: its training code must sit under ``if __name__ ==
        "__main__":``) unless ``entry_point`` names an inference script."""
        plan, c = self._code, self.config
        if source_dir is None:
            if plan is not None and plan.submit_directory.startswith("s3://"):
                source_dir = plan.archive_uri or plan.submit_directory  # sourcedir.tar.gz
            else:
                source_dir = c.source_dir
        if entry_point is None:
            entry_point = plan.script_name if plan is not None and source_dir else c.entry_point
        return self._model_class()(
            self.model_data, role=role or self.config.role, entry_point=entry_point,
            source_dir=source_dir, dependencies=dependencies or self.config.dependencies,
            image_uri=image_uri or (self.image_uri if self.image_uri else None),
            framework_version=self.framework_version, py_version=self.py_version,
            sagemaker_session=self.sagemaker_session,
            container_log_level=self.config.container_log_level, **kwargs)

    def _debug_hook_allowed(self) -> bool:
        # v2: SageMaker Debugger does not support distributed jobs with checkpoints; for
        # PyTorch and TensorFlow any job with both checkpoint settings counts as such
        c = self.config
        return not (self._framework_name and c.checkpoint_s3_uri and c.checkpoint_local_path)

    def _metrics_since(self, version: str) -> bool | None:
        if self.config.enable_sagemaker_metrics is not None:
            return self.config.enable_sagemaker_metrics
        if self.framework_version and _version(self.framework_version) >= _version(version):
            return True
        return None


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split(".") if part.isdigit())

