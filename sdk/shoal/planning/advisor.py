"""The advisor: the distributed libraries' documented tips and pitfalls, checked against a job.

:func:`advise` looks at an estimator (its parsed ``TrainingConfig`` and ``Distribution``, its
hyperparameters and image), the ``fit()`` inputs and, when given, the training script's text,
and returns :class:`Finding` objects: a stable code, a severity, what is wrong, how to fix it
and the tip it comes from. It is pure apart from optional, injected clients (``s3_client``
for GetBucketLocation, ``ec2_client`` for the subnets' region).

:func:`review` is what ``fit()`` calls: it logs each finding once per estimator on the
``shoal.advisor`` logger, and in strict mode (``advice="strict"`` or ``SHOAL_ADVICE=strict``)
raises ``ValidationError`` for error findings; ``SHOAL_ADVICE=off`` silences it.
"""

from __future__ import annotations

import logging
import os

import attrs

from shoal import config as config_mod
from shoal import inputs as inputs_
from shoal.errors import ValidationError
from shoal.planning.findings import SEVERITIES, Finding, Hints, JobView
from shoal.planning.job_checks import (
    check_batch_scaling,
    check_debugger,
    check_image_cuda,
    check_microbatches,
    check_mpi_options,
    check_single_host,
    check_storage,
)
from shoal.planning.region_checks import check_input_regions
from shoal.planning.script_checks import (
    check_dp_rank,
    check_drop_last,
    check_forward_outputs,
    check_manual_partition,
    check_preprocessing,
    check_step_inputs,
)
from shoal.request import TrainingConfig

log = logging.getLogger("shoal.advisor")

MODES = ("warn", "strict", "off")
LOG_LEVELS = {"info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}
ENV_MODE = "SHOAL_ADVICE"


# ---------------------------------------------------------------- entry points


def advise(estimator_or_config, inputs=None, *, region: str | None = None,
           script_text: str | None = None, s3_client=None, ec2_client=None,
           dataset_gb: float | None = None, epoch_seconds: float | None = None,
           dataset_size: int | None = None) -> list[Finding]:
    """Every finding for a job, errors first.

    ``estimator_or_config`` is a Shoal estimator, a job file's ``JobSpec`` (its inputs and
    region are the defaults), a ``TrainingConfig`` alone, or a ``JobView``. ``region``
    defaults to the estimator's session's (none in local mode: no region check).
    ``dataset_gb``/``epoch_seconds`` size FSx for Lustre; ``dataset_size`` (samples) checks
    the last batch against the model-parallel microbatches.
    """
    hints = Hints(dataset_gb, epoch_seconds, dataset_size)
    job = view(estimator_or_config, inputs, region=region, script_text=script_text, hints=hints)
    findings: list[Finding] = []
    for check in CHECKS:
        findings.extend(check(job))
    findings.extend(check_input_regions(job, s3_client=s3_client, ec2_client=ec2_client))
    order = {severity: rank for rank, severity in enumerate(reversed(SEVERITIES))}
    return sorted(findings, key=lambda f: (order[f.severity], f.code))


def view(estimator_or_config, inputs=None, *, region=None, script_text=None,
         hints: Hints = Hints()) -> JobView:  # noqa: B008 - Hints is frozen
    """The ``JobView`` of an estimator (a ``JobView`` is taken as is, with the arguments)."""
    parsed = inputs_.parse_inputs(inputs)
    if isinstance(estimator_or_config, JobView):
        job = estimator_or_config
        changes = {"hints": hints, "inputs": parsed or job.inputs}
        changes["region"] = region or job.region
        changes["script_text"] = script_text if script_text is not None else job.script_text
        return attrs.evolve(job, **changes)
    if isinstance(estimator_or_config, config_mod.JobSpec):
        spec = estimator_or_config
        return view(estimator_for_spec(spec), inputs if inputs is not None else spec.inputs,
                    region=region or spec.region, script_text=script_text, hints=hints)
    if isinstance(estimator_or_config, TrainingConfig):
        return JobView(config=estimator_or_config, inputs=parsed, region=region,
                       script_text=script_text, hints=hints)
    est = estimator_or_config
    if not hasattr(est, "config"):
        raise TypeError("advise() needs a Shoal estimator, a JobSpec, a TrainingConfig or a "
                        f"JobView (got {type(est).__name__})")
    session = getattr(est, "sagemaker_session", None)
    if region is None and session is not None and not est.config.local_mode:
        region = getattr(session, "region", None)
    return JobView(
        config=est.config, distribution=getattr(est, "distribution_config", None),
        hyperparameters=dict(getattr(est, "_hyperparameters", {}) or {}),
        image_uri=getattr(est, "image_uri", None), framework=est._framework_name,
        framework_version=getattr(est, "framework_version", None),
        py_version=getattr(est, "py_version", None), inputs=parsed, region=region,
        script_text=script_text, hints=hints)


def estimator_for_spec(spec):
    """A job file's estimator, built without any AWS call (its session only has a region)."""
    import boto3

    from shoal.session import LOCAL_REGION, Session

    session = Session(boto_session=boto3.Session(region_name=spec.region or LOCAL_REGION),
                      local_mode=spec.is_local)
    return config_mod.build_estimator(spec, sagemaker_session=session)


def mode(option: str | None = None) -> str:
    """The advice mode: the estimator's option, else ``$SHOAL_ADVICE``, else "warn"."""
    value = option if option is not None else os.environ.get(ENV_MODE) or "warn"
    if value not in MODES:
        where = "advice" if option is not None else ENV_MODE
        raise ValidationError(f"'{where}' must be in {MODES!r} (got {value!r})")
    return value


def review(estimator, inputs=None) -> list[Finding]:
    """Run the advisor for ``fit()``: log new findings once; strict mode rejects errors."""
    current = mode(getattr(estimator, "advice", None))
    if current == "off":
        return []
    findings = advise(estimator, inputs, script_text=read_script(estimator.config))
    seen = estimator.__dict__.setdefault("_advice_logged", set())
    for finding in findings:
        if finding not in seen:
            seen.add(finding)
            log.log(LOG_LEVELS[finding.severity], "%s %s: %s Fix: %s", finding.code,
                    finding.severity, finding.message, finding.fix)
    errors = [f for f in findings if f.severity == "error"]
    if current == "strict" and errors:
        raise ValidationError("the advisor found errors (strict mode): "
                              + "; ".join(f"{f.code}: {f.message}" for f in errors))
    return findings


MAX_SCRIPT_BYTES = 1 << 20


def read_script(config) -> str | None:
    """The entry point's text when it is a local file (at most 1 MiB), else None."""
    entry = config.entry_point
    if not entry:
        return None
    source = config.source_dir
    if source and "://" in source:
        return None
    path = os.path.join(source, entry) if source else entry
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            return handle.read(MAX_SCRIPT_BYTES)
    except OSError:
        return None


# The sort in advise() is stable, so this order settles ties of severity and code.
CHECKS = (
    check_single_host, check_image_cuda, check_storage, check_preprocessing,
    check_batch_scaling, check_mpi_options, check_debugger, check_microbatches,
    check_drop_last, check_manual_partition, check_dp_rank, check_step_inputs,
    check_forward_outputs,
)
