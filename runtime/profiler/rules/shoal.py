"""Shoal's own rules, from what the data-parallel library's documentation warns about:

- ``CollectiveCPUContention``: the AllReduce runs on the CPU, so CPU-heavy preprocessing
  during training slows the collectives. An issue when seconds in which the node's cores
  were busy above ``cpu_threshold`` percent and the collectives took on average
  ``inflation`` times the job's calm speed for their size hold ``min_collectives`` or more.
- ``CommunicationBound``: the time a step waits for collectives is above ``threshold``
  percent of the step (median over at least ``min_steps`` steps). A collective says how
  long its caller waited (``exposed_s``); for those nobody waited on in Python (DDP's
  buckets, waited on by its C++ reducer) a step's wait is the time from the issue of its
  last such collective to the end of the last: DDP issues its last bucket when the backward
  pass produced the last gradient, so from there the training thread can only wait.
  A step's share is the part of its own wall time, on its own rank, that these waits cover:
  overlapping waits (several threads, a wait inside a tail) count once, and a wait outside
  the step (before the first) not at all, so it is never above 100 %.
- ``SingleNodeDataParallel``: data parallelism among the processes of a single node (the
  library is meant for two nodes or more; inside one node the framework's own path is as good).
"""

from __future__ import annotations

import bisect
import statistics
from collections import defaultdict

import numpy as np
from shoal.profiler.data import exposed_time
from shoal.profiler.rules.base import Rule, snapshots, stats
from shoal.profiler.rules.framework import is_step

WINDOW_MIN = 5  # collectives a second must hold to be judged


def _size_class(nbytes: int) -> int:
    return max(0, int(nbytes).bit_length() - 1)  # powers of two


class CollectiveCPUContention(Rule):
    name = "CollectiveCPUContention"
    description = "Checks whether busy CPUs (preprocessing, other processes) slow the CPU AllReduce."
    recommendation = ("The AllReduce runs on the CPU and competes with CPU-heavy work: move "
                      "preprocessing before training, to the GPU, or to fewer data-loader "
                      "workers, and leave cores to the collectives.")

    def __init__(self, parameters=None):
        super().__init__(parameters)
        self.busy_at: dict[str, list[tuple[float, float]]] = defaultdict(list)  # node: (ts, cpu)
        self.collectives: list[tuple[str, float, float, int]] = []  # node, start, dur, bytes

    def scan(self, metrics, events):
        for node, node_metrics in metrics.items():
            for snap in snapshots(node_metrics):
                cores = [m.value for m in snap if m.dimension == "CPUUtilization"]
                if cores:
                    self.busy_at[node].append((snap[0].ts, sum(cores) / len(cores)))
        for node, node_events in events.items():
            self.collectives += [(node, e.start, e.duration, int(e.args.get("bytes", 0)))
                                 for e in node_events if e.phase == "Collective"]
        self.evaluate()

    def _cpu_at(self, node: str, ts: float) -> float | None:
        samples = self.busy_at.get(node) or []
        i = bisect.bisect_left(samples, (ts,))
        near = [samples[j] for j in (i - 1, i) if 0 <= j < len(samples)]
        best = min(near, key=lambda s: abs(s[0] - ts), default=None)
        return best[1] if best and abs(best[0] - ts) <= 2.0 else None

    def evaluate(self) -> None:
        """Collectives are judged a second at a time against the job's own calm speed (the
        1st percentile of their size class: the calls that had the cores, even in a job that
        shares its machine all along): a second is contended when its collectives took on
        average ``inflation`` x that while the node's cores were busy above
        ``cpu_threshold``. One slow call is noise; seconds of them are a pattern."""
        by_class: dict[int, list[float]] = defaultdict(list)
        windows: dict[tuple, list[float]] = defaultdict(list)
        for node, start, duration, nbytes in self.collectives:
            c = _size_class(nbytes)
            by_class[c].append(duration)
            windows[(node, c, int(start))].append(duration)
        calm = {c: float(np.percentile(d, 1)) for c, d in by_class.items()}
        details: dict[str, dict] = {}
        contended = 0
        for (node, c, second), durations in sorted(windows.items()):
            entry = details.setdefault(f"{2 ** c} bytes", {
                "calm_s": calm[c], "collectives": len(by_class[c]), "contended_seconds": 0,
                "contended_collectives": 0, "worst_inflation": 0.0})
            if len(durations) < WINDOW_MIN:
                continue
            # the mean: preempted calls are where contention loses time (the median of
            # microsecond calls stays fast while the ranks lose whole time slices)
            inflation = statistics.fmean(durations) / max(calm[c], 1e-9)
            cpu = self._cpu_at(node, second + 0.5)
            entry["worst_inflation"] = max(entry["worst_inflation"], inflation)
            if cpu is not None and cpu >= self.cpu_threshold and inflation >= self.inflation:
                entry["contended_seconds"] += 1
                entry["contended_collectives"] += len(durations)
                contended += len(durations)
        self.report["Datapoints"] = len(self.collectives)
        self.report["Details"] = details
        self.found = contended if contended >= self.min_collectives else 0

    @property
    def finding(self) -> str:
        classes = self.report["Details"].values()
        seconds = sum(c["contended_seconds"] for c in classes)
        worst = max((c["worst_inflation"] for c in classes), default=0.0)
        return (f"{self.found} of {len(self.collectives)} collectives ran while the CPU was busy "
                f"above {self.cpu_threshold:g} %, at least {self.inflation:g}x slower than calm "
                f"({seconds} contended second(s), worst {worst:.1f}x)")

    def finish(self):
        if getattr(self, "found", 0):
            self.trigger(self.found)
        elif not self.collectives:
            self.insufficient = "no collective was recorded"


class CommunicationBound(Rule):
    name = "CommunicationBound"
    description = "Checks whether steps spend much of their time waiting for collectives."
    recommendation = ("Steps wait for communication: overlap it with compute (DDP buckets, "
                      "async collectives), communicate less often (gradient accumulation), "
                      "larger batches per step, or compress gradients.")

    def __init__(self, parameters=None):
        super().__init__(parameters)
        self.steps: list = []
        self.comm: list = []

    def scan(self, metrics, events):
        for node_events in events.values():
            self.steps += [e for e in node_events if is_step(e)]
            self.comm += [e for e in node_events if e.phase == "Collective"]

    def finish(self):
        spans: dict[tuple, list[tuple[float, float]]] = defaultdict(list)  # (node, rank)
        for s in self.steps:
            if s.duration > 0:
                spans[(s.node, s.args.get("rank"))].append((s.start, s.start + s.duration))
        waits, tails = self._waits()
        shares = []
        for key, steps in spans.items():
            merged = _merge(waits.get(key, []))
            shares += [100 * _covered(merged, start, end) / (end - start) for start, end in steps]
        self.report["Datapoints"] = len(shares)
        if len(shares) < self.min_steps:
            self.insufficient = f"{len(shares)} steps, the rule needs {self.min_steps}"
            return
        self.report["Details"] = {"collective_share_percent": stats(shares),
                                  "steps_with_overlapped_collectives": tails}
        if statistics.median(shares) > self.threshold:
            self.trigger(sum(share > self.threshold for share in shares))

    @property
    def finding(self) -> str:
        share = self.report["Details"]["collective_share_percent"]
        return (f"{self.report['Violations']} of {self.report['Datapoints']} steps spent over "
                f"{self.threshold:g} % of their time waiting for collectives (median "
                f"{share['p50']:.0f} %)")

    def _waits(self) -> tuple[dict[tuple, list[tuple[float, float]]], int]:
        """Each rank's waiting intervals: a recorded wait is the call's last part; the
        queued collectives nobody waited on give, per step that issued them (its
        ``step_num``), the tail from the last one's issue to the last end. Only the part of
        an interval inside a step's own window counts for that step (``_covered``): the
        hooks number a collective issued before the first step (DDP's constructor) as
        step 0, and a time its wait took before that step began is no part of it."""
        waits: dict[tuple, list[tuple[float, float]]] = defaultdict(list)
        tails: dict[tuple, list[float]] = {}  # (node, rank, step_num): last issue, last end
        for e in self.comm:
            key, end = (e.node, e.args.get("rank")), e.start + e.duration
            exposed = exposed_time(e)
            if exposed is not None:
                waits[key].append((end - exposed, end))
                continue
            issued = e.start - float(e.args.get("queued_s", 0.0))
            tail = tails.setdefault((*key, e.args.get("step_num")), [issued, end])
            tail[0], tail[1] = max(tail[0], issued), max(tail[1], end)
        for (node, rank, _), (issued, end) in tails.items():
            waits[(node, rank)].append((issued, end))
        return waits, len(tails)


def _merge(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """Overlapping intervals as one (waits on several threads, a wait inside a tail)."""
    out: list[list[float]] = []
    for start, end in sorted(intervals):
        if out and start <= out[-1][1]:
            out[-1][1] = max(out[-1][1], end)
        else:
            out.append([start, end])
    return [(a, b) for a, b in out]


def _covered(merged: list[tuple[float, float]], start: float, end: float) -> float:
    """How much of [start, end) the disjoint, sorted ``merged`` intervals cover."""
    i = bisect.bisect_right(merged, (start, float("inf"))) - 1
    covered = 0.0
    for a, b in merged[max(i, 0):]:
        if a >= end:
            break
        covered += max(0.0, min(b, end) - max(a, start))
    return covered


class SingleNodeDataParallel(Rule):
    name = "SingleNodeDataParallel"
    description = "Checks for data parallelism inside a single node."
    recommendation = ("The data-parallel library pays off on two nodes or more; on one node, "
                      "torch's DistributedDataParallel over the node's own links is as fast.")

    def __init__(self, parameters=None):
        super().__init__(parameters)
        self.nodes: set[str] = set()
        self.ranks: set = set()
        self.count = 0

    def scan(self, metrics, events):
        self.nodes |= set(metrics) | set(events)
        for node_events in events.values():
            for e in node_events:
                if e.phase == "Collective":
                    self.ranks.add(e.args.get("rank"))
                    self.count += 1

    def finish(self):
        self.report["Datapoints"] = self.count
        self.report["Details"] = {"nodes": sorted(self.nodes), "ranks": len(self.ranks)}
        if self.count < self.min_collectives:
            self.insufficient = f"{self.count} collectives were recorded"
        elif len(self.nodes) == 1 and len(self.ranks) > 1:
            self.trigger()

    @property
    def finding(self) -> str:
        return (f"{len(self.ranks)} ranks on a single node ran {self.count} collectives "
                "through the data-parallel library")
