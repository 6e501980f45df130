"""The SageMaker API's training-job operations over the local backend.

Jobs are the local backend's (``$SHOAL_LOCAL_ROOT``), so ``shoal status|logs|stop
local://<job>``, ``shoal list`` and this endpoint see the same ones, and the endpoint keeps
no state of its own: a restarted server knows every job, and a running job (its supervisor
is in a session of its own) outlives the server. Tags live beside the job (``tags.json``).

A relative ``file://`` URI (``file://./code``, ``file://out``) names a path under the directory
the server was started in, as SageMaker SDK v2's local mode reads it under its own: the job
runs elsewhere, so the request is made absolute before it is submitted.
"""

from __future__ import annotations

import functools
import json
import os
import re
import threading
from pathlib import Path
from urllib.parse import unquote, urlparse

from shoal.backends.local import LocalBackend, LocalTrainingJob
from shoal.errors import ShoalError
from shoal.local import layout, state

from . import images
from .api_errors import ResourceInUse, ResourceNotFound, ValidationException, from_shoal_error
from .protocol import service_model

LIST_DEFAULT, LIST_MAX = 10, 100
TAGS_FILE = "tags.json"
MAX_TAGS = 50
JOB_NAME = re.compile(r"[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}")
# The script's own values: never rewritten (the code's URI among the hyperparameters aside).
SCRIPT_VALUES = frozenset({"HyperParameters", "Environment", "Tags"})
SUBMIT_DIRECTORY = "sagemaker_submit_directory"


@functools.cache
def _shape_members(name: str) -> frozenset[str]:
    return frozenset(service_model("sagemaker").shape_for(name).members)


class TrainingJobs:
    def __init__(self, root: Path | None = None, region: str = "us-east-1"):
        self.root = Path(root) if root else layout.local_root()
        self.backend = LocalBackend(root=self.root, region=region)
        self.create_lock = threading.Lock()
        self.records: dict[Path, tuple[int, dict]] = {}  # job.json -> (mtime_ns, record)
        self.records_lock = threading.Lock()
        self.workdir = Path.cwd()  # where relative file:// URIs point

    # -- operations ----------------------------------------------------------------------
    def CreateTrainingJob(self, params: dict) -> dict:  # noqa: N802 - the API's names
        spec = params.get("AlgorithmSpecification") or {}
        if not spec.get("TrainingImage"):
            raise ValidationException("AlgorithmSpecification.TrainingImage is required: this "
                                      "endpoint runs framework training images")
        images.recognise(spec["TrainingImage"])
        if not params.get("ResourceConfig"):
            raise ValidationException("ResourceConfig is required")
        name = params["TrainingJobName"]
        with self.create_lock:
            existing = self._find(name)
            if existing is None and (self.root / name).exists():
                existing = self.root / name  # a submission that never finished: still taken
            if existing is not None:
                which = (self._record(existing)["TrainingJobArn"]
                         if (existing / "job.json").exists() else existing.name)
                raise ResourceInUse(f"Training job names must be unique within an AWS account "
                                    f"and region, and a training job with this name already "
                                    f"exists ({which})")
            try:
                job = self.backend.submit(absolute_file_uris(params, self.workdir))
            except ShoalError as error:
                raise from_shoal_error(error) from None
        if params.get("Tags"):
            self._write_tags(job.paths.job_dir, params["Tags"])
        return {"TrainingJobArn": self._record(job.paths.job_dir)["TrainingJobArn"]}

    def DescribeTrainingJob(self, params: dict) -> dict:  # noqa: N802
        job_dir = self._existing(params["TrainingJobName"])
        record = LocalTrainingJob(job_dir.name, layout.JobPaths(job_dir)).describe()
        return {k: v for k, v in record.items() if k in _shape_members("DescribeTrainingJobResponse")}

    def StopTrainingJob(self, params: dict) -> dict:  # noqa: N802
        job_dir = self._existing(params["TrainingJobName"])
        job = LocalTrainingJob(job_dir.name, layout.JobPaths(job_dir))
        status = job.describe()["TrainingJobStatus"]
        if status in state.TERMINAL:
            raise ValidationException(f"The request was rejected because the training job is "
                                      f"in status {status}.")
        job.stop()
        return {}

    def ListTrainingJobs(self, params: dict) -> dict:  # noqa: N802
        records = [r for r in (self._record(d) for d in self._job_dirs()) if _matches(r, params)]
        key = {"Name": lambda r: r["TrainingJobName"], "Status": lambda r: r["TrainingJobStatus"]
               }.get(params.get("SortBy", "CreationTime"), lambda r: r["CreationTime"])
        records.sort(key=lambda r: (key(r), r["TrainingJobName"]),
                     reverse=params.get("SortOrder", "Ascending") == "Descending")
        start = _offset(params.get("NextToken"))
        limit = params.get("MaxResults", LIST_DEFAULT)
        page = records[start:start + limit]
        members = _shape_members("TrainingJobSummary")
        out = {"TrainingJobSummaries": [{k: v for k, v in r.items() if k in members} for r in page]}
        if start + limit < len(records):
            out["NextToken"] = str(start + limit)
        return out

    def AddTags(self, params: dict) -> dict:  # noqa: N802
        job_dir = self._by_arn(params["ResourceArn"])
        tags = {t["Key"]: t["Value"] for t in self._read_tags(job_dir)}
        tags.update({t["Key"]: t.get("Value", "") for t in params["Tags"]})
        if len(tags) > MAX_TAGS:
            raise ValidationException(f"a resource has at most {MAX_TAGS} tags (would have {len(tags)})")
        self._write_tags(job_dir, [{"Key": k, "Value": v} for k, v in tags.items()])
        return {"Tags": params["Tags"]}

    def ListTags(self, params: dict) -> dict:  # noqa: N802
        tags = self._read_tags(self._by_arn(params["ResourceArn"]))
        start, limit = _offset(params.get("NextToken")), params.get("MaxResults", 50)
        out = {"Tags": tags[start:start + limit]}
        if start + limit < len(tags):
            out["NextToken"] = str(start + limit)
        return out

    def DeleteTags(self, params: dict) -> dict:  # noqa: N802
        job_dir = self._by_arn(params["ResourceArn"])
        gone = set(params["TagKeys"])
        self._write_tags(job_dir, [t for t in self._read_tags(job_dir) if t["Key"] not in gone])
        return {}

    # -- the jobs on disk ----------------------------------------------------------------
    def _job_dirs(self) -> list[Path]:
        try:
            entries = list(os.scandir(self.root))
        except FileNotFoundError:
            return []
        return [Path(e.path) for e in entries
                if e.is_dir() and os.path.exists(os.path.join(e.path, "job.json"))]

    def _find(self, name: str) -> Path | None:
        """A job of that name: names are unique regardless of case, as the ARN lowercases them."""
        exact = self.root / name
        if (exact / "job.json").exists():
            return exact
        lowered = name.lower()
        return next((d for d in self._job_dirs() if d.name.lower() == lowered), None)

    def _existing(self, name: str) -> Path:
        job_dir = self._find(name)
        if job_dir is None:
            raise ValidationException("Requested resource not found.")
        return job_dir

    def _by_arn(self, arn: str) -> Path:
        prefix, _, name = arn.partition(":training-job/")
        valid = prefix.startswith("arn:") and JOB_NAME.fullmatch(name)
        job_dir = self._find(name) if valid else None
        if job_dir is None or self._record(job_dir)["TrainingJobArn"] != arn:
            raise ResourceNotFound(f"Resource {arn} not found.")
        return job_dir

    def _record(self, job_dir: Path) -> dict:
        path = job_dir / "job.json"
        mtime = path.stat().st_mtime_ns
        with self.records_lock:
            cached = self.records.get(path)
            if cached and cached[0] == mtime:
                return cached[1]
        record = state.read(path)
        with self.records_lock:
            self.records[path] = (mtime, record)
        return record

    @staticmethod
    def _read_tags(job_dir: Path) -> list[dict]:
        path = job_dir / TAGS_FILE
        return json.loads(path.read_text()) if path.exists() else []

    @staticmethod
    def _write_tags(job_dir: Path, tags: list[dict]) -> None:
        state.write(job_dir / TAGS_FILE, tags)  # atomic, as the job's record


def absolute_file_uris(params: dict, base: Path) -> dict:
    """``params`` with every relative ``file://`` URI made absolute under ``base``."""
    out = {k: (v if k in SCRIPT_VALUES else _absolute_in(v, base)) for k, v in params.items()}
    hyperparameters = params.get("HyperParameters") or {}
    if SUBMIT_DIRECTORY in hyperparameters:
        try:
            code = json.loads(hyperparameters[SUBMIT_DIRECTORY])
        except ValueError:
            code = None  # not JSON-encoded: the launcher reports it as it always has
        if isinstance(code, str):
            out["HyperParameters"] = {**hyperparameters,
                                      SUBMIT_DIRECTORY: json.dumps(_absolute(code, base))}
    return out


def _absolute_in(value, base: Path):
    if isinstance(value, str):
        return _absolute(value, base)
    if isinstance(value, list):
        return [_absolute_in(v, base) for v in value]
    if isinstance(value, dict):
        return {k: _absolute_in(v, base) for k, v in value.items()}
    return value


def _absolute(uri: str, base: Path) -> str:
    """``file://out`` and ``file://./out`` -> ``file:///<base>/out``, as SDK v2 joins a file
    URI's host and path; ``file:///a`` and ``file://localhost/a`` are absolute already."""
    if not uri.startswith("file://"):
        return uri
    parsed = urlparse(uri)
    if parsed.netloc in ("", "localhost"):
        return uri
    return (base / unquote(parsed.netloc + parsed.path)).as_uri()


def _offset(token: str | None) -> int:
    if token is None:
        return 0
    if not token.isdigit():
        raise ValidationException(f"Invalid pagination token {token[:64]!r}")
    return int(token)


def _matches(record: dict, params: dict) -> bool:
    if "StatusEquals" in params and record["TrainingJobStatus"] != params["StatusEquals"]:
        return False
    if "NameContains" in params and params["NameContains"].lower() not in record["TrainingJobName"].lower():
        return False
    for field, key in (("CreationTime", "CreationTime"), ("LastModifiedTime", "LastModifiedTime")):
        after, before = params.get(f"{field}After"), params.get(f"{field}Before")
        at = record[key].timestamp()
        if (after is not None and at <= after) or (before is not None and at >= before):
            return False
    return True
