"""Job handles: one string that names a training job wherever it runs.

``sagemaker://<region>/<job-name>`` names a SageMaker training job, ``local://<job-name>`` a
job run by Shoal's local mode on this machine, ``slurm://<job-name>`` one run on the Slurm
cluster (its record under the cluster's shared directory). The CLI prints a handle when it starts a job
and its read verbs (``status``, ``logs``, ``stop``) take one back, or the bare name of a local
job (:func:`resolve_handle`).
"""

from __future__ import annotations

import re

import attrs

from .errors import ConfigError

# TrainingJobName's pattern and length in the SageMaker service model.
JOB_NAME_PATTERN = re.compile(r"^[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}$")
REGION_PATTERN = re.compile(r"^[a-z]{2}(-gov|-iso[a-z]?)?-[a-z]+-\d+$")
SCHEMES = ("sagemaker", "local", "slurm")


def _check_job_name(instance, attribute, value):
    if not JOB_NAME_PATTERN.match(value):
        raise ConfigError(
            f"'{attribute.name}' must be 1-63 letters, digits or hyphens, starting and ending "
            f"with a letter or digit (got {value!r})"
        )


def _check_region(instance, attribute, value):
    if instance.scheme == "sagemaker" and not REGION_PATTERN.match(value or ""):
        raise ConfigError(f"'region' must be an AWS region such as us-west-2 (got {value!r})")
    if instance.scheme in ("local", "slurm") and value:
        raise ConfigError(f"a {instance.scheme}:// handle has no region (got {value!r})")


@attrs.frozen
class JobHandle:
    """Where a job runs (``scheme``, ``region``) and its name."""

    scheme: str = attrs.field(validator=attrs.validators.in_(SCHEMES))
    job_name: str = attrs.field(validator=_check_job_name)
    region: str | None = attrs.field(default=None, validator=_check_region)

    @property
    def is_local(self) -> bool:
        return self.scheme == "local"

    @property
    def is_slurm(self) -> bool:
        return self.scheme == "slurm"

    def __str__(self) -> str:
        if self.region is None:
            return f"{self.scheme}://{self.job_name}"
        return f"sagemaker://{self.region}/{self.job_name}"


def local_handle(job_name: str) -> JobHandle:
    return JobHandle("local", job_name)


def slurm_handle(job_name: str) -> JobHandle:
    return JobHandle("slurm", job_name)


def sagemaker_handle(region: str, job_name: str) -> JobHandle:
    return JobHandle("sagemaker", job_name, region)


def parse_handle(text: str, default_region: str | None = None) -> JobHandle:
    """Parse ``sagemaker://region/job``, ``local://job``, or a bare job name.

    A bare name means a SageMaker job in ``default_region``; without one it is an error,
    because guessing the region would silently look at the wrong job.
    """
    scheme, sep, rest = text.partition("://")
    if not sep:
        if default_region:
            return sagemaker_handle(default_region, text)
        raise ConfigError(
            f"{text!r} is not a job handle: use local://{text} or sagemaker://<region>/{text}"
        )
    if scheme == "local":
        return local_handle(rest)
    if scheme == "slurm":
        return slurm_handle(rest)
    if scheme == "sagemaker":
        region, slash, name = rest.partition("/")
        if not slash or not name:
            raise ConfigError(f"{text!r}: a SageMaker handle is sagemaker://<region>/<job-name>")
        return sagemaker_handle(region, name)
    raise ConfigError(f"{text!r}: unknown handle scheme {scheme!r} (expected one of {SCHEMES})")


def resolve_handle(text: str, local_exists=None) -> JobHandle:
    """A handle as :func:`parse_handle` reads it, or a bare name resolved to the local job of
    that name (``local_exists(name)`` tells; by default, a job record under the local root).

    A bare name never means a SageMaker job: that would need a region, and guessing it
    would silently look at the wrong job. Local names are unique (one directory per job),
    so a bare name names at most one job.
    """
    if "://" in text:
        return parse_handle(text)
    if local_exists is None:
        from .local.layout import JobPaths

        def local_exists(name):
            return JobPaths.for_job(name).state_file.exists()

    if JOB_NAME_PATTERN.match(text) and local_exists(text):
        return local_handle(text)
    raise ConfigError(
        f"no local job named {text!r}, and a SageMaker job needs its region: name a job as "
        f"local://<job>, sagemaker://<region>/<job>, or the bare name of a local job"
    )
