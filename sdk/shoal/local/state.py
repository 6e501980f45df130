"""The local job's record: a DescribeTrainingJob-shaped dict kept in ``job.json``.

The supervisor process writes it at each transition; any process (``shoal status local://job``,
``attach()``) reads it. Writes are atomic (temporary file + rename) so a reader never sees half
a record. Times are stored as ISO-8601 strings and returned as aware datetimes, as boto3 does.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import threading
from pathlib import Path

TERMINAL = ("Completed", "Failed", "Stopped")
# Primary status implied by each secondary status, as SageMaker reports them.
PRIMARY = {
    "Starting": "InProgress", "Downloading": "InProgress", "Training": "InProgress",
    "Uploading": "InProgress", "Stopping": "Stopping", "Completed": "Completed",
    "Failed": "Failed", "Stopped": "Stopped", "MaxRuntimeExceeded": "Stopped",
    "Interrupted": "InProgress", "Restarting": "InProgress",
}
MESSAGES = {
    "Starting": "Preparing the local hosts for training",
    "Downloading": "Downloading input data",
    "Training": "Training in progress.",  # no image is downloaded locally
    "Uploading": "Uploading generated training model",
    "Stopping": "Stopping the training job",
    "Completed": "Training job completed",
    "Failed": "Training job failed",
    "Stopped": "Training job stopped",
    "MaxRuntimeExceeded": "Training job ran longer than MaxRuntimeInSeconds and was stopped",
    "Interrupted": "The job was interrupted; it restarts from its checkpoints",
    "Restarting": "Restarting the job from its checkpoints",
}
TIME_KEYS = ("CreationTime", "TrainingStartTime", "TrainingEndTime", "LastModifiedTime",
             "StartTime", "EndTime")


def now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


def initial(request: dict, region: str = "local") -> dict:
    """The record of a job that was just submitted."""
    created = now()
    record = {
        "TrainingJobName": request["TrainingJobName"],
        "TrainingJobArn": f"arn:aws:sagemaker:{region}:000000000000:training-job/"
                          f"{request['TrainingJobName'].lower()}",
        "TrainingJobStatus": "InProgress",
        "SecondaryStatus": "Starting",
        "SecondaryStatusTransitions": [
            {"Status": "Starting", "StartTime": created, "StatusMessage": MESSAGES["Starting"]}
        ],
        "CreationTime": created,
        "LastModifiedTime": created,
    }
    for key in ("HyperParameters", "AlgorithmSpecification", "RoleArn", "InputDataConfig",
                "OutputDataConfig", "ResourceConfig", "StoppingCondition", "CheckpointConfig",
                "Environment", "DebugHookConfig", "DebugRuleConfigurations",
                "TensorBoardOutputConfig", "ProfilerConfig", "ProfilerRuleConfigurations"):
        if key in request:
            record[key] = request[key]
    profiler = request.get("ProfilerConfig") or {}
    record["ProfilingStatus"] = "Disabled" if not profiler or profiler.get("DisableProfiler") else "Enabled"
    rules = request.get("ProfilerRuleConfigurations") or []
    if rules and record["ProfilingStatus"] == "Enabled":
        record["ProfilerRuleEvaluationStatuses"] = [
            {"RuleConfigurationName": r["RuleConfigurationName"], "RuleEvaluationStatus": "InProgress",
             "LastModifiedTime": created} for r in rules]
    return record


def transition(record: dict, status: str, message: str | None = None) -> dict:
    """A new record with ``status`` as the secondary status (pure)."""
    record = json.loads(json.dumps(record, default=_encode))
    at = now()
    transitions = record["SecondaryStatusTransitions"]
    if transitions and "EndTime" not in transitions[-1]:
        transitions[-1]["EndTime"] = at.isoformat()
    entry = {"Status": status, "StartTime": at.isoformat(),
             "StatusMessage": message or MESSAGES[status]}
    if PRIMARY[status] in TERMINAL:
        entry["EndTime"] = at.isoformat()
    transitions.append(entry)
    record["SecondaryStatus"] = status
    record["TrainingJobStatus"] = PRIMARY[status]
    record["LastModifiedTime"] = at.isoformat()
    if status == "Training":
        record["TrainingStartTime"] = at.isoformat()
    if PRIMARY[status] in TERMINAL:
        record["TrainingEndTime"] = at.isoformat()
        start = _decode(record.get("TrainingStartTime") or record["CreationTime"], "T")
        seconds = max(0, int((at - start).total_seconds()))
        record["TrainingTimeInSeconds"] = record["BillableTimeInSeconds"] = seconds
    return _decode_all(record)


def _encode(value):
    if isinstance(value, dt.datetime):
        return value.isoformat()
    raise TypeError(f"cannot store {type(value).__name__}")


def _decode(value, key):
    return dt.datetime.fromisoformat(value) if isinstance(value, str) else value


def _decode_all(record):
    if isinstance(record, dict):
        return {k: (_decode(v, k) if k in TIME_KEYS else _decode_all(v)) for k, v in record.items()}
    if isinstance(record, list):
        return [_decode_all(v) for v in record]
    return record


def write(path: Path, record: dict) -> None:
    path = Path(path)
    # One temporary file per writing thread: two threads sharing a name truncate and overwrite
    # each other's bytes, and the rename then publishes a record with another's tail.
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    tmp.write_text(json.dumps(record, default=_encode, indent=1))
    os.replace(tmp, path)


def read(path: Path) -> dict:
    return _decode_all(json.loads(Path(path).read_text()))
