"""Joining the model-parallel runtime's timelines (``SHOAL_MP_TIMELINE``: one Chrome trace per
rank, on its own clock) to a job's framework events: each span becomes an event of phase
``ModelParallel:<category>`` (forward, backward, step, ...) on its rank's host, in
Debugger's layout, so that the rules and the report see the pipeline too."""

from __future__ import annotations

import json
from pathlib import Path

from shoal.profiler.trace import TraceWriter

MP_DIR = Path("framework") / "modelparallel"


def join_model_parallel(root: Path, default_host: str = "algo-1") -> int:
    """Converts every ``timeline-rank*.json`` under ``<root>/framework/modelparallel``;
    returns the number of events joined."""
    joined = 0
    for path in sorted((Path(root) / MP_DIR).glob("timeline-rank*.json")):
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue  # a rank that died while writing: its timeline is lost, not the others
        other = raw.get("otherData") or {}
        offset = float(other.get("epoch_offset_us", 0.0))
        writer = TraceWriter(root, other.get("host") or default_host)
        for e in raw.get("traceEvents", []):
            if e.get("ph") != "X":
                continue
            args = {**(e.get("args") or {}), "rank": other.get("rank", e.get("pid"))}
            writer.span(f"ModelParallel:{e.get('cat', 'task')}", str(e.get("name")),
                        (float(e["ts"]) + offset) / 1e6, float(e.get("dur", 0)) / 1e6, **args)
            joined += 1
        writer.close()
    return joined
