"""CloudWatch Logs tailing for a training job, across all of its hosts.

SageMaker writes each host's output to the log group ``/aws/sagemaker/TrainingJobs``
in a stream ``<job-name>/algo-<N>-<epoch>``. A :class:`LogTailer` finds the streams
(DescribeLogStreams with the job's prefix, again until every host has one), reads each
from where it stopped (GetLogEvents with ``nextForwardToken``), and hands back the new
events of all hosts interleaved by timestamp.
"""

from __future__ import annotations

import re

import attrs

from shoal.aws_errors import error_code, is_retryable, translated

LOG_GROUP = "/aws/sagemaker/TrainingJobs"
_HOST = re.compile(r"^(algo-\d+)(?:-\d+)?$")


@attrs.frozen
class LogEvent:
    """One line of a host's output."""

    timestamp: int  # milliseconds since the epoch, as CloudWatch has it
    host: str
    message: str


def host_of(stream_name: str, job_name: str) -> str:
    """``<job>/algo-2-1700000000`` -> ``algo-2`` (the stream's own name when it differs)."""
    tail = stream_name[len(job_name) + 1 :] if stream_name.startswith(job_name + "/") else ""
    match = _HOST.match(tail)
    return match.group(1) if match else (tail or stream_name)


def format_event(event: LogEvent) -> str:
    return f"[{event.host}] {event.message.rstrip(chr(10))}"


def interleave(batches: list[list[LogEvent]]) -> list[LogEvent]:
    """All events in timestamp order; a stable sort keeps each host's own order on ties."""
    merged = [event for batch in batches for event in batch]
    return sorted(merged, key=lambda e: e.timestamp)


@attrs.define
class _Stream:
    name: str
    host: str
    token: str | None = None
    pending: list = attrs.Factory(list)  # read but not yet handed out


class LogTailer:
    """Reads a job's log streams incrementally.

    ``poll()`` never raises for throttling or transient trouble: it returns what it read
    and leaves the error in ``last_error`` so the caller can note it and back off.
    Credential and permission errors are raised as Shoal's errors.
    """

    def __init__(self, logs_client, job_name: str, *, instance_count: int = 1,
                 log_group: str = LOG_GROUP):
        self.client = logs_client
        self.job_name = job_name
        self.instance_count = instance_count
        self.log_group = log_group
        self.streams: dict[str, _Stream] = {}
        self.last_error: BaseException | None = None

    def poll(self) -> list[LogEvent]:
        """New events of every host since the last poll, in timestamp order."""
        self.last_error = None
        batches: list[list[LogEvent]] = []
        try:
            if len(self.streams) < self.instance_count:
                self._discover()
            for stream in sorted(self.streams.values(), key=lambda s: s.name):
                self._read(stream)
        except Exception as exc:
            if not is_retryable(exc):
                raise
            self.last_error = exc
        for stream in sorted(self.streams.values(), key=lambda s: s.name):
            batches.append(stream.pending)
            stream.pending = []
        return interleave(batches)

    def _discover(self) -> None:
        """Find the job's streams; a missing log group just means no output yet."""
        kwargs = {
            "logGroupName": self.log_group,
            "logStreamNamePrefix": self.job_name + "/",
            "orderBy": "LogStreamName",
        }
        try:
            with translated("DescribeLogStreams"):
                while True:
                    page = self.client.describe_log_streams(**kwargs)
                    for s in page.get("logStreams", []):
                        name = s["logStreamName"]
                        if name not in self.streams:
                            self.streams[name] = _Stream(name, host_of(name, self.job_name))
                    if not page.get("nextToken"):
                        break
                    kwargs["nextToken"] = page["nextToken"]
        except Exception as exc:
            if error_code(exc) != "ResourceNotFoundException":
                raise

    def _read(self, stream: _Stream) -> None:
        """Queue everything new in one stream; the forward token repeats at the end.

        Events go to ``stream.pending`` page by page, so an error on a later page loses
        nothing that was already read.
        """
        while True:
            kwargs = {
                "logGroupName": self.log_group,
                "logStreamName": stream.name,
                "startFromHead": True,
            }
            if stream.token:
                kwargs["nextToken"] = stream.token
            with translated("GetLogEvents"):
                page = self.client.get_log_events(**kwargs)
            stream.pending.extend(
                LogEvent(e["timestamp"], stream.host, e["message"]) for e in page.get("events", [])
            )
            token = page.get("nextForwardToken")
            done = not page.get("events") or token == stream.token
            stream.token = token or stream.token
            if done:
                return
