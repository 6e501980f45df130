"""The CloudWatch Logs API over the local jobs' log streams (``shoal.local.log_streams``):
``DescribeLogStreams``, ``GetLogEvents`` and ``FilterLogEvents`` in group
``/aws/sagemaker/TrainingJobs``, and in ``/aws/sagemaker/Endpoints/<name>`` over a local
endpoint's (one stream, ``AllTraffic/local``: its model server's output), paged the way
SageMaker SDK v2's log follower and the AWS CLI rely on:

- GetLogEvents' forward token at the end of a stream is the token that was passed in, and a
  page past the end is empty: the SDK's follower stops at the first empty page;
- DescribeLogStreams gives a ``nextToken`` only when more streams remain: the SDK loops while
  one is present without passing it back;
- FilterLogEvents gives a ``nextToken`` only when more events remain (the CLI's paginator).
"""

from __future__ import annotations

import re
from pathlib import Path

from shoal.local import log_streams
from shoal.local.endpoints import ENDPOINT_LOG_GROUP, INSTANCE_ID, endpoint_streams_dir
from shoal.local.log_streams import LOG_GROUP, Event

from .api_errors import InvalidParameterException, LogsResourceNotFound

EVENTS_LIMIT = 10_000
PAGE_BYTES = 1_048_576
EVENT_OVERHEAD = 26  # bytes CloudWatch counts per event beside its message
STREAMS_LIMIT = 50
_TOKEN = re.compile(r"^([fb])/(\d+)$")


class LogsApi:
    def __init__(self, root: Path, region: str = "us-east-1"):
        self.root, self.region = Path(root), region
        self.cache = log_streams.StreamCache()

    # -- operations ----------------------------------------------------------------------
    def DescribeLogStreams(self, params: dict) -> dict:  # noqa: N802 - the API's names
        endpoint = self._group(params)
        prefix = params.get("logStreamNamePrefix", "")
        order = params.get("orderBy", "LogStreamName")
        if prefix and order == "LastEventTime":
            raise InvalidParameterException("Cannot order by LastEventTime with a logStreamNamePrefix.")
        streams = [s for s in self._streams(prefix, endpoint)
                   if s["logStreamName"].startswith(prefix)]
        key = ((lambda s: s.get("lastEventTimestamp", 0)) if order == "LastEventTime"
               else (lambda s: s["logStreamName"]))
        streams.sort(key=key, reverse=bool(params.get("descending")))
        start = _offset(params.get("nextToken"), "s")
        limit = params.get("limit", STREAMS_LIMIT)
        out = {"logStreams": streams[start:start + limit]}
        if start + limit < len(streams):
            out["nextToken"] = f"s/{start + limit}"
        return out

    def GetLogEvents(self, params: dict) -> dict:  # noqa: N802
        endpoint = self._group(params)
        events = self.cache.events(self._stream_path(params["logStreamName"], endpoint))
        limit = params.get("limit", EVENTS_LIMIT)
        chosen = [e for e in events if _in_range(e, params)]
        token = params.get("nextToken")
        if token is None:
            page = _head(chosen, limit) if params.get("startFromHead") else _tail(chosen, limit)
            at = len(events)  # no event in range: both tokens point at the stream's end
        else:
            match = _TOKEN.match(token)
            if match is None:
                raise InvalidParameterException("The specified nextToken is invalid.")
            at = int(match[2])
            if match[1] == "f":
                page = _head([e for e in chosen if e.index >= at], limit)
            else:
                page = _tail([e for e in chosen if e.index < at], limit)
        if not page:
            same = token or f"f/{at}"
            return {"events": [], "nextForwardToken": same if same.startswith("f/") else f"f/{at}",
                    "nextBackwardToken": same if same.startswith("b/") else f"b/{at}"}
        return {"events": [_out(e) for e in page],
                "nextForwardToken": f"f/{page[-1].index + 1}",
                "nextBackwardToken": f"b/{page[0].index}"}

    def FilterLogEvents(self, params: dict) -> dict:  # noqa: N802
        endpoint = self._group(params)
        names = params.get("logStreamNames")
        prefix = params.get("logStreamNamePrefix", "")
        if names and prefix:
            raise InvalidParameterException(
                "logStreamNames and logStreamNamePrefix are mutually exclusive")
        streams = [s["logStreamName"] for s in self._streams(prefix, endpoint)
                   if (s["logStreamName"] in names if names else s["logStreamName"].startswith(prefix))]
        match = _pattern(params.get("filterPattern", ""))
        merged = sorted(
            ((e, name) for name in streams
             for e in self.cache.events(self._stream_path(name, endpoint))
             if _in_range(e, params) and match(e.message)),
            key=lambda pair: (pair[0].timestamp, pair[1], pair[0].index))
        start = _offset(params.get("nextToken"), "e")
        page = _head([e for e, _ in merged[start:]], params.get("limit", EVENTS_LIMIT))
        chosen = merged[start:start + len(page)]
        out = {"events": [{**_out(e), "logStreamName": name, "eventId": f"{name}/{e.index}"}
                          for e, name in chosen],
               "searchedLogStreams": [{"logStreamName": n, "searchedCompletely": True}
                                      for n in streams]}
        if start + len(page) < len(merged):
            out["nextToken"] = f"e/{start + len(page)}"
        return out

    # -- streams -------------------------------------------------------------------------
    def _group(self, params: dict) -> str | None:
        """None for the training jobs' group, the endpoint's name for an endpoint's."""
        group = params.get("logGroupName") or params.get("logGroupIdentifier", "").rsplit(":", 1)[-1]
        if group == LOG_GROUP:
            return None
        name = group.removeprefix(ENDPOINT_LOG_GROUP)
        if group.startswith(ENDPOINT_LOG_GROUP) and "/" not in name and name not in ("", ".", "..") \
                and endpoint_streams_dir(self.root, name).is_dir():
            return name
        raise LogsResourceNotFound("The specified log group does not exist.")

    def _endpoint_streams(self, endpoint: str) -> list[dict]:
        out = []
        for path in sorted(endpoint_streams_dir(self.root, endpoint).glob("*.log")):
            events = self.cache.events(path)
            if events:
                out.append(self._stream_entry(f"{path.stem}/{INSTANCE_ID}", events,
                                              f"{ENDPOINT_LOG_GROUP}{endpoint}"))
        return out

    def _stream_entry(self, name: str, events: list[Event], group: str) -> dict:
        return {"logStreamName": name, "creationTime": events[0].timestamp,
                "firstEventTimestamp": events[0].timestamp,
                "lastEventTimestamp": events[-1].timestamp,
                "lastIngestionTime": events[-1].timestamp,
                "arn": f"arn:aws:logs:{self.region}:000000000000:log-group:{group}:"
                       f"log-stream:{name}",
                "storedBytes": 0}

    def _job_dirs(self, prefix: str) -> list[Path]:
        job = prefix.split("/", 1)[0]
        if "/" in prefix:
            candidates = [self.root / job] if job not in ("", ".", "..") else []  # in the root only
        else:
            candidates = sorted(self.root.glob(f"{glob_escape(job)}*")) if self.root.exists() else []
        return [d for d in candidates if (d / log_streams.STREAMS_DIR).is_dir()]

    def _streams(self, prefix: str, endpoint: str | None = None) -> list[dict]:
        if endpoint is not None:
            return self._endpoint_streams(endpoint)
        out = []
        for job_dir in self._job_dirs(prefix):
            for path in sorted((job_dir / log_streams.STREAMS_DIR).glob("*.log")):
                events = self.cache.events(path)
                if not events:
                    continue  # a stream exists once its host printed a line
                name = f"{job_dir.name}/{path.stem}-{events[0].timestamp // 1000}"
                out.append(self._stream_entry(name, events, LOG_GROUP))
        return out

    def _stream_path(self, name: str, endpoint: str | None = None) -> Path:
        if endpoint is not None:
            variant, _, instance = name.partition("/")
            path = endpoint_streams_dir(self.root, endpoint) / f"{variant}.log"
            if instance != INSTANCE_ID or "/" in variant or variant in ("", ".", "..") \
                    or not self.cache.events(path):
                raise LogsResourceNotFound("The specified log stream does not exist.")
            return path
        job, _, rest = name.partition("/")
        host, _, epoch = rest.rpartition("-")
        path = log_streams.stream_file(self.root / job, host) if job and host and "/" not in host \
            and ".." not in job else None
        events = self.cache.events(path) if path is not None else []
        if not events or str(events[0].timestamp // 1000) != epoch:
            raise LogsResourceNotFound("The specified log stream does not exist.")
        return path


def glob_escape(text: str) -> str:
    return re.sub(r"([*?\[])", r"[\1]", text)


def _in_range(event: Event, params: dict) -> bool:
    start, end = params.get("startTime"), params.get("endTime")
    return (start is None or event.timestamp >= start) and (end is None or event.timestamp < end)


def _cost(event: Event) -> int:
    return len(event.message.encode()) + EVENT_OVERHEAD


def _head(events: list[Event], limit: int) -> list[Event]:
    page, size = [], 0
    for e in events[:limit]:
        size += _cost(e)
        if page and size > PAGE_BYTES:
            break
        page.append(e)
    return page


def _tail(events: list[Event], limit: int) -> list[Event]:
    return list(reversed(_head(list(reversed(events)), limit)))


def _out(event: Event) -> dict:
    return {"timestamp": event.timestamp, "message": event.message,
            "ingestionTime": event.timestamp}


def _offset(token: str | None, kind: str) -> int:
    if token is None:
        return 0
    head, _, number = token.partition("/")
    if head != kind or not number.isdigit():
        raise InvalidParameterException("The specified nextToken is invalid.")
    return int(number)


def _pattern(pattern: str):
    """CloudWatch's plain filter patterns: every term (or quoted phrase) must occur; ``-term``
    must not. JSON and space-delimited patterns are refused, not guessed at."""
    pattern = pattern.strip()
    if not pattern:
        return lambda message: True
    if pattern[0] in "{[":
        raise InvalidParameterException(
            f"filter pattern {pattern[:64]!r}: only term patterns are supported here")
    terms = re.findall(r'-?"[^"]*"|\S+', pattern)
    wanted = [t.strip('"') for t in terms if not t.startswith("-")]
    unwanted = [t[1:].strip('"') for t in terms if t.startswith("-")]
    return lambda message: (all(t in message for t in wanted)
                            and not any(t in message for t in unwanted))
