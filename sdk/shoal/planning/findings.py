"""What the advisor's checks read and return: the job, as the checks see it, and a finding."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

from shoal.config import PROCESSES_PER_HOST_HP
from shoal.planning import sizing

SEVERITIES = ("info", "warning", "error")


@attrs.frozen
class Finding:
    """One piece of advice about a job."""

    code: str = attrs.field(validator=attrs.validators.matches_re(r"SHOAL-[A-Z]+\d{3}"))
    severity: str = attrs.field(validator=attrs.validators.in_(SEVERITIES))
    message: str
    fix: str
    source: str

    def to_dict(self) -> dict[str, str]:
        return attrs.asdict(self)


@attrs.frozen
class Hints:
    """What the user knows about the data that the job description does not say."""

    dataset_gb: float | None = None
    epoch_seconds: float | None = None
    dataset_size: int | None = None  # samples, for the model-parallel last-batch check


@attrs.frozen
class JobView:
    """The parts of a job the checks read, taken from an estimator's parsed objects."""

    config: Any  # shoal.request.TrainingConfig
    distribution: Any = None  # shoal.distribution.Distribution
    hyperparameters: Mapping[str, Any] = attrs.field(factory=dict)
    image_uri: str | None = None  # the user's own image, None for Shoal's
    framework: str | None = None
    framework_version: str | None = None
    py_version: str | None = None
    inputs: Mapping[str, Any] = attrs.field(factory=dict)
    region: str | None = None
    script_text: str | None = None
    hints: Hints = Hints()

    @property
    def dataparallel(self) -> bool:
        return bool(self.distribution is not None and self.distribution.smdataparallel_enabled)

    @property
    def modelparallel(self) -> bool:
        return bool(self.distribution is not None and self.distribution.modelparallel_enabled)

    @property
    def instance_count(self) -> int:
        groups = self.config.instance_groups
        if groups:
            return sum(group.instance_count for group in groups)
        return self.config.instance_count or 1

    @property
    def processes_per_host(self) -> int | None:
        """Ranks per host: mpi's setting, the launcher's hyperparameter, else one per GPU."""
        per_host = self.distribution.processes_per_host if self.distribution else None
        per_host = per_host or _positive_int(self.hyperparameters.get(PROCESSES_PER_HOST_HP))
        return per_host or sizing.gpus_per_instance(self.config.instance_type)


def _positive_int(value) -> int | None:
    try:
        number = int(value) if value is not None and not isinstance(value, bool) else None
    except (TypeError, ValueError):
        return None
    return number if number and number > 0 else None
