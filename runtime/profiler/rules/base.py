"""What every profiler rule shares: its parameters (resolved from the request's strings over
the table's defaults), its report in Debugger's schema, and the scan over windows of data.

A rule sees the data a window at a time (``scan``: the records with ``start <= ts < end``),
keeps its state across windows, and after each window may find an issue. ``finish`` closes
the evaluation; a rule that never had the data it needs (fewer samples than its
``patience``, no GPU, no step) says so in ``Details.InsufficientData`` and in its status
details, rather than reporting that all is well.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from shoal.profiler import rule_table
from shoal.profiler.data import Event, Metric

ISSUES, NO_ISSUES = "IssuesFound", "NoIssuesFound"


class Rule:
    """A built-in profiler rule. Subclasses set ``name``, ``description`` and
    ``recommendation`` and implement ``scan``."""

    name = ""
    description = ""
    recommendation = ""

    def __init__(self, parameters: dict[str, Any] | None = None):
        self.params = rule_table.resolve(self.name, parameters or {})
        self.report: dict[str, Any] = {
            "RuleTriggered": 0, "Violations": 0, "Details": {}, "Datapoints": 0,
            "RuleParameters": "\n".join(f"{k}:{v}" for k, v in self.params.items()),
        }
        self.insufficient: str | None = None

    def __getattr__(self, name):
        params = self.__dict__.get("params", {})
        if name in params:
            return params[name]
        raise AttributeError(name)

    # ---- what subclasses implement ----

    def scan(self, metrics: dict[str, list[Metric]], events: dict[str, list[Event]]) -> None:
        raise NotImplementedError

    def finish(self) -> None:
        """Called once after the last window."""

    # ---- shared ----

    def trigger(self, violations: int = 1) -> None:
        self.report["RuleTriggered"] += 1
        self.report["Violations"] += violations

    @property
    def status(self) -> str:
        return ISSUES if self.report["RuleTriggered"] else NO_ISSUES

    @property
    def finding(self) -> str:
        """What the rule found, in its own numbers; subclasses say it in their terms."""
        return (f"{self.report['Violations']} violation(s) in "
                f"{self.report['Datapoints']} datapoint(s)")

    @property
    def status_details(self) -> str:
        """``<finding> (triggered N time(s)). Fix: <recommendation>`` once it triggered."""
        if self.report["RuleTriggered"]:
            fix = f" Fix: {self.recommendation}" if self.recommendation else ""
            return f"{self.finding} (triggered {self.report['RuleTriggered']} time(s)).{fix}"[:1024]
        if self.insufficient:
            return f"Insufficient data: {self.insufficient}"[:1024]
        return ""

    def result(self) -> dict[str, Any]:
        out = dict(self.report)
        if self.report["RuleTriggered"]:
            out["Finding"], out["Recommendation"] = self.finding, self.recommendation
        if self.insufficient and not self.report["RuleTriggered"]:
            out["Details"] = {**out["Details"], "InsufficientData": self.insufficient}
        return out


def stats(values) -> dict[str, float]:
    """Box-plot numbers as Debugger's reports give them."""
    v = np.asarray(values, dtype=float)
    if v.size == 0:
        return {}
    p25, p50, p75, p95, p99 = np.percentile(v, [25, 50, 75, 95, 99])
    iqr = p75 - p25
    return {"mean": float(v.mean()), "max": float(v.max()), "min": float(v.min()),
            "p25": float(p25), "p50": float(p50), "p75": float(p75), "p95": float(p95),
            "p99": float(p99), "upper": float(min(v.max(), p75 + 1.5 * iqr)),
            "lower": float(max(v.min(), p25 - 1.5 * iqr))}


def snapshots(metrics: list[Metric], window_s: float = 0.02) -> list[list[Metric]]:
    """Samples closer than ``window_s`` belong to one snapshot (one sample of every metric)."""
    out: list[list[Metric]] = []
    for m in metrics:
        if out and m.ts - out[-1][0].ts <= window_s:
            out[-1].append(m)
        else:
            out.append([m])
    return out


def series(metrics: list[Metric], dimension: str) -> dict[str, list[tuple[float, float]]]:
    """``{name: [(ts, value), ...]}`` of one dimension (per core, per GPU)."""
    out: dict[str, list[tuple[float, float]]] = {}
    for m in metrics:
        if m.dimension == dimension:
            out.setdefault(m.name, []).append((m.ts, m.value))
    return out
