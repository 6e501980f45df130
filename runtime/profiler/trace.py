"""Framework events as Debugger writes them: Chrome-trace JSON, one file per node and
rotation (``layout.framework_file``), times relative to the file's
``start_time_since_epoch_in_micros``, each event's phase the name of its ``pid`` row.

A ``TraceWriter`` buffers events and writes a complete file when it rotates (every
``close_interval_s`` or ``max_bytes``) and when it is closed, so a reader never meets a
half-written file.
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

from shoal.profiler import layout


class TraceWriter:
    def __init__(self, root: Path, node: str, close_interval_s: float = 60.0,
                 max_bytes: int = 10 * 1024 * 1024):
        self.root, self.node = Path(root), node
        self.close_interval_s, self.max_bytes = close_interval_s, max_bytes
        self.lock = threading.Lock()
        self.events: list[dict] = []
        self.bytes = 0
        self.opened = time.time()
        self.phases: dict[str, int] = {}

    def _pid(self, phase: str) -> int:
        if phase not in self.phases:
            self.phases[phase] = len(self.phases) + 1
        return self.phases[phase]

    def span(self, phase: str, name: str, start_s: float, duration_s: float, **args) -> None:
        """One event: ``phase`` is its row (``Step:ModeKeys.TRAIN``, ``Forward``, ...)."""
        with self.lock:
            event = {"name": name, "ph": "X", "pid": self._pid(phase), "tid": os.getpid(),
                     "ts": int(start_s * 1e6), "dur": max(0, int(duration_s * 1e6)), "args": args}
            self.events.append(event)
            self.bytes += 120 + len(name)
            due = (time.time() - self.opened >= self.close_interval_s or self.bytes >= self.max_bytes)
        if due:
            self.flush()

    def flush(self) -> None:
        with self.lock:
            events, self.events, self.bytes = self.events, [], 0
            self.opened = time.time()
        if not events:
            return
        origin = min(e["ts"] for e in events)
        end = max(e["ts"] + e["dur"] for e in events)
        body = [{"name": "process_name", "ph": "M", "pid": 0,
                 "args": {"start_time_since_epoch_in_micros": origin}}]
        body += [{"name": "process_name", "ph": "M", "pid": pid, "args": {"name": phase}}
                 for phase, pid in self.phases.items()]
        body += [{**e, "ts": e["ts"] - origin} for e in events]
        path = layout.framework_file(self.root, self.node, end)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")  # per thread
        tmp.write_text(json.dumps(body))
        # Ranks of one node name files by their end time: a name already taken (two ranks
        # ending together) moves on by a microsecond; linking never replaces a file.
        while True:
            try:
                os.link(tmp, path)
                break
            except FileExistsError:
                end += 1
                path = layout.framework_file(self.root, self.node, end)
        tmp.unlink()

    close = flush
