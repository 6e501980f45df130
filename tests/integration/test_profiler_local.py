"""Debugger's profiling in local jobs, end to end through the estimator: the system monitor,
training steps recorded without changes to the script, and the job's profiler rules with
their statuses on the job's description and their reports in the output."""

from __future__ import annotations

import json

import pytest
import shoal
from shoal.debugger import ProfilerRule, rule_configs

pytestmark = [pytest.mark.mpi, pytest.mark.slow, pytest.mark.torch]

SCRIPT = """
import os, time, torch
torch.manual_seed(0)
torch.set_num_threads(1)
stalls = {int(s) for s in os.environ.get("STALLS", "").split(",") if s}
model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.Tanh(), torch.nn.Linear(256, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x, y = torch.randn(256, 256), torch.randn(256, 1)
for step in range(160):
    if step in stalls:
        time.sleep(1.0)  # a stalled step: a slow read, a checkpoint, another process
    loss = torch.nn.functional.mse_loss(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
print("trained", flush=True)
"""

STALLS = ",".join(str(n) for n in range(7, 160, 13))  # 12 steps


def run_job(tmp_path, monkeypatch, name, stalls, rules):
    monkeypatch.setenv("SHOAL_LOCAL_ROOT", str(tmp_path / "jobs"))
    code = tmp_path / name
    code.mkdir()
    (code / "train.py").write_text(SCRIPT)
    est = shoal.PyTorch(entry_point="train.py", source_dir=str(code), role="arn:aws:iam::111122223333:role/R",
                        instance_type="local", instance_count=1, framework_version="1.13.1",
                        py_version="py39", output_path=(tmp_path / "out").as_uri(), rules=rules,
                        environment={"STALLS": stalls})
    est.fit(job_name=name, logs=False)
    return est.latest_training_job.describe(), tmp_path / "out" / name


def test_a_job_with_12_stalled_steps_of_160_has_step_outliers_and_one_without_has_none(
        tmp_path, monkeypatch):
    rules = [ProfilerRule.sagemaker(rule_configs.StepOutlier())]
    stalled, out = run_job(tmp_path, monkeypatch, "stalled-job", STALLS, rules)
    status = stalled["ProfilerRuleEvaluationStatuses"][0]
    assert stalled["ProfilingStatus"] == "Enabled"
    assert (status["RuleConfigurationName"], status["RuleEvaluationStatus"]) == (
        "StepOutlier", "IssuesFound"), status
    report = json.loads((out / "rule-output" / "StepOutlier" / "profiler-output" /
                         "profiler-reports" / "StepOutlier.json").read_text())
    phase = report["Details"]["algo-1"]["Step:ModeKeys.TRAIN"]
    assert sorted(phase["step_numbers"]) == [int(s) for s in STALLS.split(",")]
    assert list((out / "profiler-output" / "system" / "incremental").glob("*/*.algo-1.json"))
    assert (out / "profiler-output" / "system" / "training_job_end.ts").exists()

    healthy, _ = run_job(tmp_path, monkeypatch, "healthy-job", "", rules)
    status = healthy["ProfilerRuleEvaluationStatuses"][0]
    assert status["RuleEvaluationStatus"] == "NoIssuesFound", status
    assert status["StatusDetails"] == ""  # 160 steps: enough data to judge
