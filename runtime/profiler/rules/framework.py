"""The rules over framework events: MaxInitializationTime, StepOutlier, Dataloader and
OverallFrameworkMetrics (Debugger's parameters, defaults and trigger conditions)."""

from __future__ import annotations

import os
import statistics
from collections import defaultdict

import numpy as np
from shoal.profiler.rules.base import Rule, stats

STEP_PHASE = "Step:ModeKeys."
MIN_STEPS = 100  # StepOutlier judges a phase once it has more steps than this


def is_step(event) -> bool:
    return event.phase.startswith(STEP_PHASE)


class MaxInitializationTime(Rule):
    name = "MaxInitializationTime"
    description = "Checks whether the initialization before the first step takes too long."
    recommendation = ("Initialization takes too long. If using File mode, consider switching to "
                      "Pipe mode in case you are using TensorFlow framework.")

    def __init__(self, parameters=None):
        super().__init__(parameters)
        self.first = self.last = None
        self.first_step = self.last_step = None

    def scan(self, metrics, events):
        times = [m.ts for ms in metrics.values() for m in ms]
        times += [e.start for es in events.values() for e in es]
        if times:
            self.first = min(times + ([self.first] if self.first is not None else []))
            self.last = max(times + ([self.last] if self.last is not None else []))
        steps = [e.start for es in events.values() for e in es if is_step(e)]
        if steps:
            self.first_step = min(steps + ([self.first_step] if self.first_step else []))
            self.last_step = max(steps + ([self.last_step] if self.last_step else []))
        self.report["Datapoints"] = len(times)
        self.report["Details"] = {"job_start": self.first, "job_end": self.last,
                                  "step_num": {"first": self.first_step, "last": self.last_step}}
        waited = (self.last - self.first) if self.first is not None else 0.0
        if self.first_step is None and waited > self.threshold * 60:
            self.trigger()

    @property
    def finding(self) -> str:
        waited = (self.last - self.first) / 60 if self.first is not None else 0.0
        return (f"no training step within {waited:.1f} min of the job's start (the rule "
                f"allows {self.threshold:g} min)")

    def finish(self):
        if self.first is None:
            self.insufficient = "no data was recorded"


class StepOutlier(Rule):
    name = "StepOutlier"
    description = "Checks for steps that take far longer than the others (stddev from the mean)."
    recommendation = ("Check if there are any bottlenecks (CPU, I/O) correlated to the step "
                      "outliers.")

    def __init__(self, parameters=None):
        super().__init__(parameters)
        self.steps: dict[tuple[str, str], list[tuple[float, int, float]]] = defaultdict(list)

    def scan(self, metrics, events):
        for node, node_events in events.items():
            for e in node_events:
                wanted = (e.phase.startswith(STEP_PHASE) if self.mode is None
                          else e.phase in (self.mode, STEP_PHASE + str(self.mode)))
                if wanted:
                    self.steps[(node, e.phase)].append((e.duration, e.args.get("step_num", -1),
                                                        e.start))
        self.report["Datapoints"] = sum(len(v) for v in self.steps.values())
        details = {}
        outliers_now = 0
        for (node, phase), steps in self.steps.items():
            durations = np.array([d for d, _, _ in steps])
            if len(durations) <= MIN_STEPS:
                continue
            limit = durations.mean() + self.stddev * durations.std()
            outliers = [(n, d) for d, n, _ in steps if d > limit]
            normal = durations[durations <= limit]
            probs, edges = np.histogram(normal, bins=100)
            details.setdefault(node, {})[phase] = {
                "step_stats": {k: stats(durations)[k] for k in ("mean", "max", "p99", "p95", "p50", "min")},
                "number_of_outliers": len(outliers), "stddev": float(durations.std()),
                # ranks of one node share step numbers: each step once
                "limit": float(limit), "step_numbers": list(dict.fromkeys(n for n, _ in outliers))[:100],
                "outlier_durations": [d for _, d in outliers][:100],
                "probs": probs.tolist(), "binedges": edges.tolist()}
            if len(outliers) > self.n_outliers:
                outliers_now += len(outliers)
        self.report["Details"] = details
        if outliers_now:
            self.trigger(outliers_now)

    @property
    def finding(self) -> str:
        phases = [p for node in self.report["Details"].values() for p in node.values()]
        outliers = sum(p["number_of_outliers"] for p in phases)
        steps = self.report["Datapoints"]
        worst = max((d for p in phases for d in p["outlier_durations"]), default=0.0)
        mean = max((p["step_stats"]["mean"] for p in phases), default=0.0)
        return (f"{outliers} of {steps} steps took longer than mean + {self.stddev:g} stddev "
                f"(slowest {worst:.3g} s, mean {mean:.3g} s)")

    def finish(self):
        most = max((len(v) for v in self.steps.values()), default=0)
        if most == 0:
            self.insufficient = "no training step was recorded"
        elif most <= MIN_STEPS:
            self.insufficient = f"{most} steps, the rule needs more than {MIN_STEPS}"

    def durations(self) -> dict[tuple[str, str], list[tuple[float, int, float]]]:
        return dict(self.steps)


class Dataloader(Rule):
    name = "Dataloader"
    description = "Checks whether the number of data loader processes suits the CPU cores."
    recommendation = "Change the number of data loader processes."
    patience = 10  # seconds with data-loading events before judging (Debugger's own)

    def __init__(self, parameters=None):
        super().__init__(parameters)
        self.workers_per_second: dict[int, set] = defaultdict(set)
        self.loading: list[float] = []
        self.init_args: dict = {}
        self.node_cores = 0
        self.cores = os.cpu_count() or 1

    def scan(self, metrics, events):
        # the node's cores as its system metrics count them (this machine's when there are none)
        names = {m.name for ms in metrics.values() for m in ms if m.dimension == "CPUUtilization"}
        self.node_cores = max(self.node_cores, len(names))
        self.cores = self.node_cores or os.cpu_count() or 1
        for node_events in events.values():
            for e in node_events:
                if e.phase.startswith("DataLoader") or e.name.startswith("DataLoader"):
                    if "Initialize" in e.name or "Initialize" in e.phase:
                        self.init_args.update(e.args)
                        continue
                    self.workers_per_second[int(e.start)].add(e.args.get("pid", e.args.get("worker", 0)))
                    self.loading.append(e.duration)
        self.report["Datapoints"] = len(self.workers_per_second)
        if len(self.workers_per_second) <= self.patience:
            return
        median = statistics.median(len(p) for p in self.workers_per_second.values())
        low, high = self.cores * self.min_threshold / 100, self.cores * self.max_threshold / 100
        self.report["Details"] = {
            "cores": self.cores, "dataloaders": median, "num_workers": self.init_args.get("num_workers"),
            "pin_memory": self.init_args.get("pin_memory"),
            "dataloading_time": stats(self.loading) if self.loading else {}}
        if median < low or median > high:
            self.trigger()

    @property
    def finding(self) -> str:
        d = self.report["Details"]
        return (f"{d['dataloaders']:g} data loader process(es) at work for {d['cores']} CPU "
                f"core(s) (the rule wants {self.min_threshold:g}-{self.max_threshold:g} % of "
                "the cores)")

    def finish(self):
        if len(self.workers_per_second) <= self.patience:
            self.insufficient = (f"data loading was seen in {len(self.workers_per_second)} seconds, "
                                 f"the rule needs more than {self.patience}")


class OverallFrameworkMetrics(Rule):
    """Never an issue: where the framework's time goes, by phase and by event."""

    name = "OverallFrameworkMetrics"
    description = "Summarizes the time spent per phase and operation (never raises an issue)."
    recommendation = ""

    def __init__(self, parameters=None):
        super().__init__(parameters)
        self.by_phase: dict[str, float] = defaultdict(float)
        self.by_event: dict[str, float] = defaultdict(float)

    def scan(self, metrics, events):
        for node_events in events.values():
            for e in node_events:
                self.by_phase[e.phase] += e.duration
                self.by_event[f"{e.phase}:{e.name}"] += e.duration
                self.report["Datapoints"] += 1
        total = sum(self.by_event.values()) or 1.0
        self.report["Details"] = {
            "phase": dict(self.by_phase),
            "ops": {k: 100 * v / total for k, v in self.by_event.items() if 100 * v / total >= 2},
        }
