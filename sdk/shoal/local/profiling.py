"""Debugger's profiling around a local job, where SageMaker runs it beside the container:
the system monitor of every host (the platform agent's job), framework events from the
ranks (``SHOAL_PROFILER_DIR`` and the bootstrap on PYTHONPATH), and the job's profiler
rules, evaluated in windows while it trains and over all the data at its end, each
configuration writing ``rule-output/<name>/profiler-output/profiler-reports/`` and giving its
``ProfilerRuleEvaluationStatuses`` entry.

Simulated hosts share this machine: each host's system metrics are the machine's.
"""

from __future__ import annotations

import os
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

from shoal.profiler import (
    engine,
    layout,
    profiling_parameters,
    rule_table,
    system_monitor,
    timelines,
)
from shoal.profiler.rules import RULES, SHOAL_RULES

BOOTSTRAP = Path(system_monitor.__file__).parent / "bootstrap"
ADVANCE_SECONDS = 5.0  # how often the rules look for newly completed windows
DEFAULT_INTERVAL_MS = 500
# the rules that read forward/backward/data-loader spans, not only steps
FRAMEWORK_RULES = {rule_table.REPORT, "Dataloader", "OverallFrameworkMetrics"}


def _now() -> str:
    return datetime.now(timezone.utc).isoformat()


class _Configuration:
    """One ProfilerRuleConfigurations entry and its evaluation."""

    def __init__(self, entry: dict, data: Path, out: Path):
        self.name = entry["RuleConfigurationName"]
        params = dict(entry.get("RuleParameters") or {})
        invoke = params.get("rule_to_invoke", "")
        self.evaluation = None
        self.error = None
        self.report_error = None  # the rules ran, but their HTML report could not be drawn
        known = {*RULES, *SHOAL_RULES, rule_table.REPORT, rule_table.SHOAL_CONFIGURATION}
        if invoke not in known:
            self.error = (f"{invoke or self.name!r} is not a built-in profiler rule that Shoal "
                          "runs locally (custom rule images need SageMaker)")
            return
        try:
            self.evaluation = engine.Evaluation(data, engine.rules_for(invoke, params),
                                                out / self.name / "profiler-output")
        except ValueError as error:
            self.error = str(error)

    def status(self) -> dict:
        if self.error:
            status, details = "Error", self.error
        else:
            status, details = engine.overall_status(self.evaluation)
        if self.report_error:
            # a line of its own: StatusDetails holds one finding per line
            details = "\n".join(d for d in (details, f"no profiler-report.html: {self.report_error}") if d)
        return {"RuleConfigurationName": self.name,
                "RuleEvaluationJobArn": f"local://{self.name}",
                "RuleEvaluationStatus": status, "StatusDetails": details[:1024],
                "LastModifiedTime": _now()}


class JobProfiler:
    """Starts with the training, ends after it; ``statuses()`` at any time."""

    def __init__(self, request: dict, job_dir: Path, hosts: list[str]):
        self.request, self.hosts, self.job_dir = request, hosts, Path(job_dir)
        self.data = Path(job_dir) / "profiler-output"
        self.rule_output = Path(job_dir) / "rule-output"
        interval = (request.get("ProfilerConfig") or {}).get("ProfilingIntervalInMilliseconds")
        self.interval_ms = int(interval or DEFAULT_INTERVAL_MS)
        entries = list(request.get("ProfilerRuleConfigurations") or ())
        if os.environ.get("SHOAL_PROFILER_RULES", "1") != "0":  # Shoal's own, on by default
            name = rule_table.SHOAL_CONFIGURATION
            entries.append({"RuleConfigurationName": name, "RuleParameters": {"rule_to_invoke": name}})
        self.configurations = [_Configuration(e, self.data, self.rule_output) for e in entries]
        self.stop = threading.Event()
        self.threads: list[threading.Thread] = []
        self.lock = threading.Lock()

    def environment(self, base: dict) -> dict:
        """What the launcher's processes need for framework events: the steps always, every
        span when framework profiling or a rule over framework events asks for them."""
        path = os.pathsep.join(p for p in (str(BOOTSTRAP), base.get("PYTHONPATH")) if p)
        config = self.request.get("ProfilerConfig") or {}
        invoked = {(e.get("RuleParameters") or {}).get("rule_to_invoke")
                   for e in self.request.get("ProfilerRuleConfigurations") or ()}
        metrics = profiling_parameters.parse(config.get("ProfilingParameters"))  # data, not code
        detailed = bool(metrics) or bool(invoked & FRAMEWORK_RULES)
        return {**base, "SHOAL_PROFILER_DIR": str(self.data), "PYTHONPATH": path,
                "SHOAL_PROFILER_EVENTS": "all" if detailed else "steps",
                # the model-parallel runtime's timelines, joined to the events at the end
                "SHOAL_MP_TIMELINE": base.get("SHOAL_MP_TIMELINE") or str(self.data / timelines.MP_DIR)}

    def start(self, on_change=None) -> None:
        self.data.mkdir(parents=True, exist_ok=True)
        self.threads = [threading.Thread(target=self._monitor, daemon=True, name="shoal-monitor")]
        if self.configurations:
            self.threads.append(threading.Thread(target=self._rules, args=(on_change,),
                                                 daemon=True, name="shoal-rules"))
        for t in self.threads:
            t.start()

    def _monitor(self) -> None:
        sampler = system_monitor.Sampler(self.hosts[0])
        writers = {h: system_monitor.Writer(self.data, h) for h in self.hosts}
        period = self.interval_ms / 1000
        try:
            while not self.stop.wait(period):
                records = sampler.sample()
                for host, writer in writers.items():
                    writer.write([{**r, "NodeId": host} for r in records])
        finally:
            for writer in writers.values():
                writer.close()

    def _rules(self, on_change) -> None:
        while not self.stop.wait(ADVANCE_SECONDS):
            self._advance(final=False)
            if on_change:
                on_change(self.statuses())

    def _advance(self, final: bool) -> None:
        with self.lock:
            for c in self.configurations:
                if c.evaluation is not None:
                    try:
                        c.evaluation.advance(final=final)
                    except Exception as error:  # the rule's status, never the job's
                        c.error, c.evaluation = f"{type(error).__name__}: {error}", None

    def finish(self) -> list[dict]:
        """Stop sampling, mark the data's end, evaluate everything; the final statuses."""
        self.stop.set()
        for t in self.threads:
            t.join(timeout=60)
        timelines.join_model_parallel(self.data, self.hosts[0])
        layout.mark_end(self.data, time.time())
        self._advance(final=True)
        self._write_reports()
        return self.statuses()

    def _write_reports(self) -> None:
        """``profiler-report.html`` beside each configuration's rule reports."""
        from shoal.profiler import report

        from . import metrics

        series = metrics.timeline(self.job_dir)
        for c in self.configurations:
            if c.evaluation is None:
                continue
            try:
                report.write(c.evaluation.out_dir / report.REPORT_FILE,
                             self.request["TrainingJobName"], self.data, [c.evaluation.out_dir],
                             c.evaluation.statuses(), series)
            except Exception as error:  # a report that cannot be drawn is not a failed job
                c.report_error = f"{type(error).__name__}: {error}"

    def statuses(self) -> list[dict]:
        return [c.status() for c in self.configurations]
