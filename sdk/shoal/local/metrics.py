"""Training metrics of a local job, taken from its hosts' output the way SageMaker takes them
from a job's logs with ``AlgorithmSpecification.MetricDefinitions``.

Each host line is searched with each definition's regex; the first capture group is the value,
kept only if it reads as a finite float (first match per line and definition). Every datapoint
(metric, value, the line's timestamp, host) is appended to ``<job>/metrics.jsonl`` as it
arrives, so any process (``describe()``, ``shoal metrics``, ``shoal serve``'s CloudWatch API)
reads them, and they outlive the process that wrote them. ``FinalMetricDataList`` is the last
value of each metric that matched, in definition order, as DescribeTrainingJob gives it.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import re
import threading
from pathlib import Path

import attrs

from ..errors import InputError

METRICS_FILE = "metrics.jsonl"
FINAL_MAX = 40  # FinalMetricDataList's maximum (botocore's MetricDataList)


def _compile(value) -> re.Pattern:
    return value if isinstance(value, re.Pattern) else re.compile(value)


@attrs.frozen
class MetricDefinition:
    name: str
    regex: re.Pattern = attrs.field(converter=_compile)


@attrs.frozen
class Datapoint:
    metric: str
    value: float
    timestamp: int  # ms since the epoch: the host line's time
    host: str

    @property
    def time(self) -> dt.datetime:
        return dt.datetime.fromtimestamp(self.timestamp / 1000, dt.timezone.utc)


def definitions(request: dict) -> tuple[MetricDefinition, ...]:
    """The request's MetricDefinitions, compiled; a regex that does not compile or has no
    capture group is refused (InputError) before the job runs."""
    raw = (request.get("AlgorithmSpecification") or {}).get("MetricDefinitions") or []
    parsed = []
    for n, entry in enumerate(raw):
        name = f"metric_definitions[{n}].Regex"
        try:
            regex = re.compile(entry["Regex"])
        except re.error as error:
            raise InputError(f"'{name}' must be a valid regular expression ({error}) "
                             f"(got {entry['Regex']!r})") from None
        if regex.groups < 1:
            raise InputError(f"'{name}' must have a capture group around the value "
                             f"(got {entry['Regex']!r})")
        parsed.append(MetricDefinition(entry["Name"], regex))
    return tuple(parsed)


def extract(defs, host: str, line: str, timestamp: int) -> list[Datapoint]:
    """The datapoints in one host line (pure)."""
    points = []
    for definition in defs:
        match = definition.regex.search(line)
        if match is None:
            continue
        try:
            value = float(match.group(1))
        except (TypeError, ValueError):
            continue  # not a number: SageMaker publishes nothing for it
        if math.isfinite(value):
            points.append(Datapoint(definition.name, value, timestamp, host))
    return points


class Recorder:
    """Appends the datapoints of host lines to the job's metrics file (thread-safe: one relay
    thread per host)."""

    def __init__(self, job_dir: Path, defs):
        self.path = Path(job_dir) / METRICS_FILE
        self.defs = tuple(defs)
        self.lock = threading.Lock()
        self.handle = None

    def feed(self, host: str, line: str, timestamp: int) -> None:
        points = extract(self.defs, host, line, timestamp) if self.defs else []
        if not points:
            return
        text = "".join(json.dumps(attrs.asdict(p)) + "\n" for p in points)
        with self.lock:
            if self.handle is None:
                self.handle = open(self.path, "a", encoding="utf-8", buffering=1)
            self.handle.write(text)

    def close(self) -> None:
        with self.lock:
            if self.handle is not None:
                self.handle.close()
                self.handle = None


# file -> (its first line, bytes read, points); the first line (its time in ms) tells a file
# recreated under the same name (a job deleted and run again) from the one read so far
_cache: dict[Path, tuple[bytes, int, list[Datapoint]]] = {}
_cache_lock = threading.Lock()


def read(job_dir: Path) -> list[Datapoint]:
    """Every datapoint so far, in arrival order (a last line still being written is skipped).
    The file only grows, so each call reads what was appended since the last one: describe()
    on the server's event loop stays cheap however long the job has run."""
    path = Path(job_dir) / METRICS_FILE
    with _cache_lock:
        head, offset, points = _cache.get(path, (b"", 0, []))
        try:
            with open(path, "rb") as handle:
                if handle.read(len(head)) != head:  # a new file under that name
                    head, offset, points = b"", 0, []
                handle.seek(offset)
                chunk = handle.read()
        except FileNotFoundError:
            _cache.pop(path, None)
            return []
        complete = chunk[: chunk.rfind(b"\n") + 1]
        if complete:
            points = points + _parse(complete.decode("utf-8", "replace"))
            head = head or complete[: complete.find(b"\n") + 1]
            _cache[path] = (head, offset + len(complete), points)
        return points


def _parse(text: str) -> list[Datapoint]:
    points = []
    for line in text.split("\n")[:-1]:
        try:
            points.append(Datapoint(**json.loads(line)))
        except (ValueError, TypeError):
            continue  # never expected: a damaged line does not hide the others
    return points


def final_metrics(names, points) -> list[dict]:
    """FinalMetricDataList: the last value of each metric in ``names`` that has one."""
    last = {p.metric: p for p in points}
    return [{"MetricName": name, "Value": last[name].value, "Timestamp": last[name].time}
            for name in dict.fromkeys(names) if name in last][:FINAL_MAX]


def by_metric(points) -> dict[str, list[Datapoint]]:
    series: dict[str, list[Datapoint]] = {}
    for point in points:
        series.setdefault(point.metric, []).append(point)
    return series


def timeline(job_dir: Path) -> dict[str, list[tuple[float, float]]]:
    """Each metric's (epoch seconds, value) points, as the profiler report plots them."""
    return {name: [(p.timestamp / 1000, p.value) for p in points]
            for name, points in by_metric(read(job_dir)).items()}
