"""Reading a job's profiler data: system metric records and framework trace events, by
node, in time order, a window at a time (the rules scan in windows, as Debugger's do).

A corrupt line (a file still being written) is skipped, as Debugger's reader does; a
framework file is read once it is complete JSON.
"""

from __future__ import annotations

import bisect
import json
from collections import defaultdict
from pathlib import Path

import attrs
from shoal.profiler import layout

REQUIRED = ("Type", "Dimension", "Value", "NodeId", "Timestamp")


@attrs.frozen
class Metric:
    """One system-metric sample."""

    node: str
    kind: str        # cpu, gpu, memory, i/o, network
    name: str        # cpu0, gpu1, MemoryUsedPercent, ...
    dimension: str   # CPUUtilization, GPUUtilization, I/OWaitPercentage, ...
    value: float
    ts: float        # seconds since the epoch


@attrs.frozen
class Event:
    """One framework event (a span; an instant has duration 0)."""

    node: str
    phase: str       # the row it sits on: Step:ModeKeys.TRAIN, Forward, DataLoader, ...
    name: str
    start: float     # seconds since the epoch
    duration: float  # seconds
    args: dict = attrs.field(factory=dict, eq=False, hash=False)


def exposed_time(event: Event) -> float | None:
    """How long the caller waited on a collective: as recorded (``exposed_s``), the whole
    span for one timed around a synchronous call (no ``mode``), else unknown (None: queued
    work nobody waited on in Python, such as DDP's buckets)."""
    if "exposed_s" in event.args:
        return float(event.args["exposed_s"])
    return event.duration if "mode" not in event.args else None


def read_metrics(path: Path) -> list[Metric]:
    out = []
    for line in Path(path).read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            r = json.loads(line)
            out.append(Metric(str(r["NodeId"]), str(r["Type"]), str(r.get("Name", "")),
                              str(r["Dimension"]), float(r["Value"]), float(r["Timestamp"])))
        except (ValueError, KeyError, TypeError):
            continue  # a line still being written, or not a metric
    return out


def read_events(path: Path, node: str) -> list[Event]:
    """A Chrome-trace file: ``ts``/``dur`` in us relative to its ``process_name`` metadata's
    ``start_time_since_epoch_in_micros``; each pid's name is the event's phase."""
    try:
        raw = json.loads(Path(path).read_text(encoding="utf-8"))
    except (ValueError, OSError):
        return []
    items = raw.get("traceEvents", []) if isinstance(raw, dict) else raw
    origin_us, names, begun, out = 0, {}, {}, []
    for e in items:
        if not isinstance(e, dict):
            continue
        args = e.get("args") or {}
        if e.get("ph") == "M" and e.get("name") == "process_name":
            if "start_time_since_epoch_in_micros" in args:
                origin_us = int(args["start_time_since_epoch_in_micros"])
            if "name" in args:
                names[e.get("pid")] = str(args["name"])
    for e in items:
        if not isinstance(e, dict) or e.get("ph") not in ("X", "B", "E", "i", "I"):
            continue
        phase = names.get(e.get("pid"), str(e.get("pid")))
        ts = (origin_us + float(e.get("ts", 0))) / 1e6
        key = (e.get("pid"), e.get("tid"), e.get("name"))
        if e["ph"] == "B":
            begun[key] = (ts, e.get("args") or {})
        elif e["ph"] == "E" and key in begun:
            start, args = begun.pop(key)
            out.append(Event(node, phase, str(e.get("name")), start, ts - start, args))
        elif e["ph"] in ("X", "i", "I"):
            out.append(Event(node, phase, str(e.get("name")), ts, float(e.get("dur", 0)) / 1e6,
                             e.get("args") or {}))
    return out


class Store:
    """Everything read so far, by node; ``load`` picks up new and grown files."""

    def __init__(self, root: Path):
        self.root = Path(root)
        self.metrics: dict[str, list[Metric]] = defaultdict(list)
        self.events: dict[str, list[Event]] = defaultdict(list)
        self._seen: dict[Path, int] = {}
        # each node's sample times and event starts, for windows by bisection
        self._metric_ts: dict[str, list[float]] = {}
        self._event_ts: dict[str, list[float]] = {}

    def load(self) -> None:
        for path in layout.system_files(self.root):
            size = path.stat().st_size
            if self._seen.get(path) == size:
                continue
            self._seen[path] = size
            node = layout.SYSTEM_FILE.search(path.name).group(2)
            fresh = read_metrics(path)
            self.metrics[node] = sorted(
                {(m.ts, m.name, m.dimension): m for m in [*self.metrics[node], *fresh]}.values(),
                key=lambda m: (m.ts, m.name, m.dimension))
            self._metric_ts[node] = [m.ts for m in self.metrics[node]]
        for path in layout.framework_files(self.root):
            if path in self._seen:
                continue
            self._seen[path] = path.stat().st_size
            node = layout.FRAMEWORK_FILE.search(path.name).group(2)
            self.events[node].extend(read_events(path, node))
            self.events[node].sort(key=lambda e: (e.start, e.name))
            self._event_ts[node] = [e.start for e in self.events[node]]

    def window(self, start: float, end: float) -> tuple[dict, dict]:
        """Each node's metrics and events that begin in [start, end)."""
        def cut(items, times):
            return items[bisect.bisect_left(times, start): bisect.bisect_left(times, end)]

        return ({n: cut(ms, self._metric_ts.get(n, [])) for n, ms in self.metrics.items()},
                {n: cut(es, self._event_ts.get(n, [])) for n, es in self.events.items()})

    @property
    def nodes(self) -> list[str]:
        return sorted(set(self.metrics) | set(self.events))

    def span(self) -> tuple[float, float] | None:
        """The first and last timestamp of any record."""
        times = [m.ts for ms in self.metrics.values() for m in (ms[:1] + ms[-1:])]
        times += [e.start for es in self.events.values() for e in es[:1]]
        times += [e.start + e.duration for es in self.events.values() for e in es[-1:]]
        return (min(times), max(times)) if times else None
