"""``shoal plan strategy --calibrate``: measure the cluster the job will use, with a job.

The probe (``shoal.profiler.calibration``) runs as a short Shoal training job on the same
instance type, count and processes per host as the job being planned -- on SageMaker, or on
this machine for ``local`` -- and writes ``calibration.json`` to the model directory. The
planner reads it back from the job's ``model.tar.gz`` as a :class:`Calibration`. On GPU
instances the probe's matmuls run on the GPUs in the precision being planned (a bf16 job's
rate is its tensor cores', not fp32's).
"""

from __future__ import annotations

import io
import json
import os
import tarfile
import tempfile

from shoal.errors import ValidationError
from shoal.planning.costs import PRECISIONS
from shoal.planning.strategy import Calibration

RESULT = "calibration.json"
PROBE = """\
import os
from shoal.profiler.calibration import main

main(["--out", os.path.join(os.environ.get("SM_MODEL_DIR", "."), "calibration.json"),
      "--precision", {precision!r}])
"""


def read(path: str) -> Calibration:
    """A calibration file: the probe's output, or a hand-written ``{"flops": ...}``."""
    try:
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
    except OSError as error:
        raise ValidationError(f"cannot read calibration file {path!r}: {error}") from None
    except json.JSONDecodeError as error:
        raise ValidationError(f"calibration file {path!r} is not JSON: {error}") from None
    if not isinstance(data, dict):
        raise ValidationError(f"calibration file {path!r} must hold a JSON object")
    return Calibration.from_dict(data.get("calibration", data))


def from_archive(data: bytes) -> Calibration:
    """The calibration inside a ``model.tar.gz``'s bytes."""
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        try:
            member = tar.extractfile(RESULT)
        except KeyError:
            member = None
        if member is None:
            raise ValidationError(f"the calibration job's model.tar.gz has no {RESULT}")
        return Calibration.from_dict(json.load(member).get("calibration", {}))


def probe_estimator(instance_type: str, instance_count: int, processes_per_host: int,
                    *, role: str, precision: str = "fp32", framework_version: str = "1.13.1",
                    py_version: str = "py39", session=None, source_dir: str | None = None, **kwargs):
    """The estimator of the calibration job (not yet run)."""
    if precision not in PRECISIONS:
        raise ValidationError(f"'precision' must be one of {', '.join(PRECISIONS)} "
                              f"(got {precision!r})")
    from shoal.pytorch import PyTorch

    source_dir = source_dir or tempfile.mkdtemp(prefix="shoal-calibration-")
    with open(os.path.join(source_dir, "calibrate.py"), "w", encoding="utf-8") as handle:
        handle.write(PROBE.format(precision=precision))
    return PyTorch(entry_point="calibrate.py", source_dir=source_dir, role=role,
                   instance_type=instance_type, instance_count=instance_count,
                   framework_version=framework_version, py_version=py_version,
                   distribution={"mpi": {"enabled": True,
                                         "processes_per_host": processes_per_host}},
                   base_job_name="shoal-calibration", max_run=1800, sagemaker_session=session,
                   **kwargs)


def run(estimator) -> Calibration:
    """Run the calibration job to the end and read its result."""
    estimator.fit(wait=True, logs="None")
    uri = estimator.model_data
    if uri.startswith("file://"):
        with open(uri[len("file://"):], "rb") as handle:
            return from_archive(handle.read())
    from shoal.naming import parse_s3_uri

    bucket, key = parse_s3_uri(uri)
    session = estimator.sagemaker_session
    body = session.s3_client.get_object(Bucket=bucket, Key=key,
                                        ExpectedBucketOwner=session.account_id)["Body"]
    return from_archive(body.read())
