"""Per-rank Chrome-trace timelines of the pipeline (``SHOAL_MP_TIMELINE=dir``).

Every span in which a task holds its rank's turn becomes a complete event ("ph": "X") named
for its phase and microbatch, and every message sent becomes an instant event with its
kind, peer and bytes; steps are spans of their own. Each rank writes
``{dir}/timeline-rank{rank}.json`` (the Trace Event format, which chrome://tracing and
Perfetto open) when the process exits. The bubble benchmark reads the idle fraction of each
rank from it: the share of a step's span covered by no task span. ``otherData`` carries the
rank's host and the offset from the timeline's clock to the epoch, so that the profiler can
join the timeline to the job's other framework events.
"""

from __future__ import annotations

import atexit
import json
import os
import threading
import time
from typing import Any


class Timeline:
    def __init__(self, directory: str, rank: int) -> None:
        self.path = os.path.join(directory, f"timeline-rank{rank}.json")
        self.rank = rank
        self._events: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        # perf_counter microseconds + this = microseconds since the epoch
        self._epoch_offset_us = time.time() * 1e6 - time.perf_counter() * 1e6
        os.makedirs(directory, exist_ok=True)
        atexit.register(self.write)

    @staticmethod
    def now() -> float:
        return time.perf_counter() * 1e6

    def span(self, name: str, category: str, start_us: float, end_us: float, **args) -> None:
        event = {"name": name, "cat": category, "ph": "X", "ts": start_us,
                 "dur": max(0.0, end_us - start_us), "pid": self.rank, "tid": 0, "args": args}
        with self._lock:
            self._events.append(event)

    def instant(self, name: str, category: str, **args) -> None:
        event = {"name": name, "cat": category, "ph": "i", "s": "t", "ts": self.now(),
                 "pid": self.rank, "tid": 0, "args": args}
        with self._lock:
            self._events.append(event)

    def write(self) -> None:
        with self._lock:
            events = list(self._events)
        other = {"rank": self.rank, "host": os.environ.get("SHOAL_HOST", ""),
                 "epoch_offset_us": self._epoch_offset_us}
        with open(self.path, "w", encoding="utf-8") as handle:
            json.dump({"traceEvents": events, "displayTimeUnit": "ms", "otherData": other}, handle)


def from_environment(rank: int) -> Timeline | None:
    directory = os.environ.get("SHOAL_MP_TIMELINE")
    return Timeline(directory, rank) if directory else None


def idle_fraction(events: list[dict[str, Any]]) -> list[float]:
    """For each step span, the share of it in which no task held the turn."""
    steps = [e for e in events if e.get("cat") == "step"]
    tasks = sorted((e["ts"], e["ts"] + e["dur"]) for e in events if e.get("cat") == "task")
    out = []
    for step in steps:
        begin, end = step["ts"], step["ts"] + step["dur"]
        busy = sum(max(0.0, min(b, end) - max(a, begin)) for a, b in tasks)
        out.append(1.0 - busy / (end - begin) if end > begin else 0.0)
    return out
