"""A local job's profiler apart from the training: its rule configurations (the request's and
Shoal's own), what the ranks' environment gets, and statuses that say what went wrong."""

from __future__ import annotations

import pytest
from shoal.local import profiling

pytest.importorskip("psutil")


def request(*rules, parameters=None):
    config = {"S3OutputPath": "s3://b/p", "ProfilingIntervalInMilliseconds": 500}
    if parameters:
        config["ProfilingParameters"] = parameters
    return {"TrainingJobName": "job", "ProfilerConfig": config,
            "ProfilerRuleConfigurations": [
                {"RuleConfigurationName": r, "RuleParameters": {"rule_to_invoke": r}} for r in rules]}


def test_shoal_rules_join_the_requests_unless_turned_off(tmp_path, monkeypatch):
    names = [c.name for c in profiling.JobProfiler(request("StepOutlier"), tmp_path, ["algo-1"]
                                                   ).configurations]
    assert names == ["StepOutlier", "ShoalRules"]
    monkeypatch.setenv("SHOAL_PROFILER_RULES", "0")
    assert [c.name for c in profiling.JobProfiler(request("StepOutlier"), tmp_path, ["algo-1"]
                                                  ).configurations] == ["StepOutlier"]


def test_an_unknown_rule_is_an_error_status_not_a_failed_job(tmp_path):
    job = profiling.JobProfiler(request("MyCustomRule"), tmp_path, ["algo-1"])
    status = job.statuses()[0]
    assert (status["RuleConfigurationName"], status["RuleEvaluationStatus"]) == (
        "MyCustomRule", "Error")
    assert "custom rule images need SageMaker" in status["StatusDetails"]


@pytest.mark.parametrize("rules, parameters, events", [
    (("StepOutlier",), None, "steps"),
    (("Dataloader",), None, "all"),
    (("StepOutlier",), {"DataloaderProfilingConfig": '{"StartStep": 5, "NumSteps": 3}'}, "all"),
])
def test_ranks_record_every_span_only_when_something_reads_them(tmp_path, rules, parameters,
                                                                 events):
    env = profiling.JobProfiler(request(*rules, parameters=parameters), tmp_path, ["algo-1"]
                                ).environment({"PYTHONPATH": "/code"})
    assert env["SHOAL_PROFILER_EVENTS"] == events
    assert env["SHOAL_PROFILER_DIR"] == str(tmp_path / "profiler-output")
    assert env["PYTHONPATH"].split(":") == [str(profiling.BOOTSTRAP), "/code"]


def test_a_report_that_cannot_be_drawn_is_said_in_the_status(tmp_path, monkeypatch):
    from shoal.profiler import report

    def broken(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(report, "write", broken)
    job = profiling.JobProfiler(request("StepOutlier"), tmp_path, ["algo-1"])
    job.start()
    statuses = {s["RuleConfigurationName"]: s for s in job.finish()}
    details = statuses["StepOutlier"]["StatusDetails"]
    assert statuses["StepOutlier"]["RuleEvaluationStatus"] == "NoIssuesFound"
    assert "no profiler-report.html: OSError: disk full" in details
    assert details.startswith("insufficient data for StepOutlier")  # what the rule said stays
