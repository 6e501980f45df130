"""Each built-in profiler rule on recorded data, triggered and not, through the files the
system monitor and the framework trace write; the trigger-everything parameters fire every
rule that can fire; short data reports insufficient data, not that all is well."""

from __future__ import annotations

import json

import numpy as np
import pytest
from shoal.profiler import engine, system_monitor
from shoal.profiler.trace import TraceWriter

T0 = 1_790_000_000.0  # a fixed epoch: the files' names and hours are reproducible


def record(node, kind, name, dimension, value, ts):
    return {"Type": kind, "Name": name, "Dimension": dimension, "Value": float(value),
            "NodeId": node, "Timestamp": ts}


def write_system(root, node, samples, gpus=2, cores=4, interval=0.5, cpu=20.0, iowait=0.0,
                 gpu_util=80.0, gpu_mem=30.0):
    """``samples`` snapshots; each argument a number or a function of (i, unit)."""
    writer = system_monitor.Writer(root, node)
    value = lambda v, i, u: v(i, u) if callable(v) else v  # noqa: E731
    for i in range(samples):
        ts = T0 + i * interval
        rows = []
        for c in range(cores):
            rows.append(record(node, "cpu", f"cpu{c}", "CPUUtilization", value(cpu, i, c), ts))
            rows.append(record(node, "cpu", f"cpu{c}", "I/OWaitPercentage", value(iowait, i, c), ts))
        for g in range(gpus):
            rows.append(record(node, "gpu", f"gpu{g}", "GPUUtilization", value(gpu_util, i, g), ts))
            rows.append(record(node, "gpu", f"gpu{g}", "GPUMemoryUtilization", value(gpu_mem, i, g), ts))
        rows.append(record(node, "memory", "MemoryUsedPercent", "", 40, ts))
        writer.write(rows)
    writer.close()


def write_steps(root, node, durations, start=T0 + 1.0, phase="Step:ModeKeys.TRAIN"):
    trace = TraceWriter(root, node)
    t = start
    for n, d in enumerate(durations):
        trace.span(phase, "Step", t, d, step_num=n)
        t += d
    trace.close()


def write_loading(root, node, workers, seconds=20):
    """Data-loader fetches, served by ``workers`` processes a second."""
    trace = TraceWriter(root, node)
    for second in range(seconds):
        for w in range(workers):
            trace.span("DataLoaderIter", "DataLoaderIter", T0 + second + 0.1 * w, 0.05, pid=1000 + w)
    trace.close()


def evaluate(root, rule, **params):
    ev = engine.Evaluation(root, engine.rules_for(rule, {k: str(v) for k, v in params.items()}),
                           root / "out")
    ev.advance(final=True)
    return ev


def result(ev, rule):
    return json.loads((ev.out_dir / "profiler-reports" / f"{rule}.json").read_text())


def status(ev, rule):
    return next(s for s in ev.statuses() if s["Rule"] == rule)


CASES = {
    # rule: (data writer for "an issue", data writer for "all well", parameters)
    "CPUBottleneck": (
        lambda r: write_system(r, "algo-1", 40, cpu=95, gpu_util=2),
        lambda r: write_system(r, "algo-1", 40, cpu=95, gpu_util=70), {"patience": 10}),
    "IOBottleneck": (
        lambda r: write_system(r, "algo-1", 40, iowait=80, gpu_util=2),
        lambda r: write_system(r, "algo-1", 40, iowait=5, gpu_util=2), {"patience": 10}),
    "LowGPUUtilization": (
        lambda r: write_system(r, "algo-1", 40, gpu_util=20),
        lambda r: write_system(r, "algo-1", 40, gpu_util=90), {"patience": 10, "window": 20}),
    "GPUMemoryIncrease": (
        lambda r: write_system(r, "algo-1", 40, gpu_mem=lambda i, g: 20 + (30 if i >= 30 else 0)),
        lambda r: write_system(r, "algo-1", 40, gpu_mem=30), {"patience": 10, "window": 10}),
    "LoadBalancing": (
        lambda r: write_system(r, "algo-1", 40, gpu_util=lambda i, g: 95 if g == 0 else 5),
        lambda r: write_system(r, "algo-1", 40, gpu_util=lambda i, g: 80 + i % 3),
        {"patience": 10}),
    "BatchSize": (
        lambda r: write_system(r, "algo-1", 40, cpu=10, gpu_util=20, gpu_mem=10),
        lambda r: write_system(r, "algo-1", 40, cpu=10, gpu_util=95, gpu_mem=10),
        {"patience": 10, "window": 20}),
    "StepOutlier": (
        lambda r: write_steps(r, "algo-1", [1.0 if n % 13 == 5 else 0.01 for n in range(160)]),
        lambda r: write_steps(r, "algo-1", [0.01 + 0.001 * (n % 3) for n in range(160)]), {}),
    # 4 cores (the node's metrics): fewer than 70 % of them loading is too few
    "Dataloader": (
        lambda r: (write_system(r, "algo-1", 40, cores=4), write_loading(r, "algo-1", 1)),
        lambda r: (write_system(r, "algo-1", 40, cores=4), write_loading(r, "algo-1", 4)), {}),
    "MaxInitializationTime": (
        lambda r: write_system(r, "algo-1", 10, interval=30.0),
        lambda r: (write_system(r, "algo-1", 10, interval=30.0), write_steps(r, "algo-1", [0.1] * 5)),
        {"threshold": 1}),
}


@pytest.mark.parametrize("rule", sorted(CASES))
def test_rule_finds_the_issue_and_not_a_false_one(tmp_path, rule):
    issue, healthy, params = CASES[rule]
    issue(tmp_path / "issue")
    healthy(tmp_path / "healthy")
    found = evaluate(tmp_path / "issue", rule, **params)
    fine = evaluate(tmp_path / "healthy", rule, **params)
    assert status(found, rule)["RuleEvaluationStatus"] == "IssuesFound", result(found, rule)
    assert result(found, rule)["RuleTriggered"] >= 1 and result(found, rule)["Violations"] >= 1
    assert status(fine, rule)["RuleEvaluationStatus"] == "NoIssuesFound", result(fine, rule)
    assert result(fine, rule)["RuleTriggered"] == 0
    assert "InsufficientData" not in result(fine, rule)["Details"]


def test_step_outlier_names_the_stalled_steps(tmp_path):
    stalls = {n for n in range(160) if n % 13 == 5}
    write_steps(tmp_path, "algo-1", [1.0 if n in stalls else 0.01 for n in range(160)])
    ev = evaluate(tmp_path, "StepOutlier")
    details = result(ev, "StepOutlier")["Details"]["algo-1"]["Step:ModeKeys.TRAIN"]
    assert set(details["step_numbers"]) == stalls and details["number_of_outliers"] == len(stalls)


def test_too_little_data_is_insufficient_not_healthy(tmp_path):
    write_system(tmp_path, "algo-1", 20, cpu=99, gpu_util=0)  # 20 snapshots, patience 1000
    ev = evaluate(tmp_path, "CPUBottleneck")
    s = status(ev, "CPUBottleneck")
    assert s["RuleEvaluationStatus"] == "NoIssuesFound"
    assert s["StatusDetails"].startswith("Insufficient data: 20 snapshots")
    assert "patience=1000" in result(ev, "CPUBottleneck")["Details"]["InsufficientData"]


def test_trigger_everything_through_profiler_report(tmp_path):
    """Debugger's own trick: thresholds at which every rule that can fire does."""
    write_system(tmp_path, "algo-1", 120, cpu=50, iowait=50, gpu_util=lambda i, g: (i * 7 + g * 50) % 100,
                 gpu_mem=lambda i, g: i % 90)
    write_steps(tmp_path, "algo-1", [0.01] * 150 + [2.0] * 12, start=T0 + 100)
    params = {"CPUBottleneck_gpu_threshold": 100, "CPUBottleneck_cpu_threshold": 0,
              "CPUBottleneck_threshold": 0, "CPUBottleneck_patience": 1,
              "IOBottleneck_gpu_threshold": 100, "IOBottleneck_io_threshold": 0,
              "IOBottleneck_threshold": 0, "IOBottleneck_patience": 1,
              "LowGPUUtilization_threshold_p95": 100, "LowGPUUtilization_patience": 1,
              "GPUMemoryIncrease_increase": 0.001, "GPUMemoryIncrease_patience": 1,
              "LoadBalancing_threshold": 0, "LoadBalancing_patience": 1,
              "BatchSize_cpu_threshold_p95": 100, "BatchSize_gpu_threshold_p95": 100,
              "BatchSize_gpu_memory_threshold_p95": 100, "BatchSize_patience": 1,
              "BatchSize_window": 10, "StepOutlier_stddev": 1, "StepOutlier_n_outliers": 1}
    ev = evaluate(tmp_path, "ProfilerReport", **params)
    statuses = {s["Rule"]: s["RuleEvaluationStatus"] for s in ev.statuses()}
    fired = {r for r, s in statuses.items() if s == "IssuesFound"}
    assert fired == {"CPUBottleneck", "IOBottleneck", "LowGPUUtilization", "GPUMemoryIncrease",
                     "LoadBalancing", "BatchSize", "StepOutlier"}, statuses
    assert engine.overall_status(ev)[0] == "IssuesFound"
    # the two summaries never fire and still report
    usage = result(ev, "OverallSystemUsage")["Details"]["algo-1"]
    assert usage["CPU"]["p50"] == pytest.approx(50) and usage["CPU memory"]["max"] == 40
    assert result(ev, "OverallFrameworkMetrics")["Details"]["phase"]["Step:ModeKeys.TRAIN"] > 0


def test_report_files_have_debuggers_schema(tmp_path):
    write_system(tmp_path, "algo-1", 5)
    ev = evaluate(tmp_path, "ProfilerReport")
    files = sorted(p.name for p in (ev.out_dir / "profiler-reports").iterdir())
    assert files == sorted(f"{r}.json" for r in engine.RULES)
    for name in files:
        data = json.loads((ev.out_dir / "profiler-reports" / name).read_text())
        assert set(data) == {"RuleTriggered", "Violations", "Details", "Datapoints", "RuleParameters"}
        assert "scan_interval_us:60000000" in data["RuleParameters"].split("\n")


def test_windows_during_the_job_then_final(tmp_path):
    """In progress while the data grows, a verdict once it ends; windows are not read twice."""
    write_steps(tmp_path, "algo-1", [0.01] * 60, start=T0)
    ev = engine.Evaluation(tmp_path, engine.rules_for("StepOutlier", {"scan_interval_us": "200000"}),
                           tmp_path / "out")
    ev.advance()
    assert status(ev, "StepOutlier")["RuleEvaluationStatus"] == "InProgress"
    write_steps(tmp_path, "algo-1", [0.01] * 60 + [1.0] * 12 + [0.01] * 60, start=T0 + 0.6)
    ev.advance(final=True)
    assert status(ev, "StepOutlier")["RuleEvaluationStatus"] == "IssuesFound"
    assert result(ev, "StepOutlier")["Datapoints"] == 60 + 132


def test_a_failing_rule_is_an_error_not_a_crash(tmp_path, monkeypatch):
    write_system(tmp_path, "algo-1", 5)
    from shoal.profiler.rules import system

    monkeypatch.setattr(system.CPUBottleneck, "scan", lambda *a: 1 / 0)
    ev = evaluate(tmp_path, "CPUBottleneck")
    assert status(ev, "CPUBottleneck") == {"Rule": "CPUBottleneck", "RuleEvaluationStatus": "Error",
                                           "StatusDetails": "ZeroDivisionError: division by zero"}


def test_jensen_shannon_distance():
    from shoal.profiler.rules.system import jensen_shannon

    assert jensen_shannon([1, 1], [1, 1]) == pytest.approx(0)
    assert jensen_shannon([1, 1e-12], [1e-12, 1]) == pytest.approx(np.sqrt(np.log(2)), rel=1e-6)


@pytest.mark.parametrize("rule", sorted(CASES))
def test_a_finding_says_what_how_often_and_the_fix(tmp_path, rule):
    """StatusDetails and the rule's report keep what it found in its own numbers."""
    issue, _, params = CASES[rule]
    issue(tmp_path)
    ev = evaluate(tmp_path, rule, **params)
    details, report_file = status(ev, rule)["StatusDetails"], result(ev, rule)
    finding = report_file["Finding"]
    assert finding and "violation(s) in" not in finding  # the rule's own terms, not the generic
    fix = engine.RULES[rule].recommendation
    assert details == f"{finding} (triggered {report_file['RuleTriggered']} time(s)). Fix: {fix}"
    assert report_file["Recommendation"] == fix


def test_cpu_bottleneck_finding_counts_the_snapshots(tmp_path):
    write_system(tmp_path, "algo-1", 40, cpu=95, gpu_util=lambda i, g: 2 if i < 30 else 70)
    ev = evaluate(tmp_path, "CPUBottleneck", patience=10)
    assert status(ev, "CPUBottleneck")["StatusDetails"].startswith(
        "a GPU under 10 % while a CPU core was above 90 % in 30 of 40 snapshots (75 %, the "
        "rule's threshold 50 %) (triggered ")


def test_a_configurations_findings_are_one_line_per_rule_within_the_limit():
    lines = [f"Rule{i}: {'x' * 150} (triggered 1 time(s)). Fix: {'y' * 100}" for i in range(3)]
    assert engine.findings_text(lines) == "\n".join(lines)
    many = lines * 3  # too long with the fixes: the findings stay, the fixes go
    text = engine.findings_text(many)
    assert len(text) <= 1024 and text.splitlines()[0] == lines[0].split(" Fix: ")[0]
    assert len(engine.findings_text(many * 3)) == 1024
