"""Debugger's profiling in local jobs, end to end through the estimator: the system monitor,
training steps recorded without changes to the script, and the job's profiler rules with
their statuses on the job's description and their reports in the output."""

from __future__ import annotations

import json
from collections import defaultdict

import pytest
import shoal
from shoal.debugger import ProfilerRule, rule_configs
from shoal.profiler import data

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


CONTENTION = """
import multiprocessing as mp, os, time
import numpy as np
import shoal.dataparallel.torch  # noqa: F401 - registers the shoal backend
import torch, torch.distributed as dist

def preprocess(stop):  # CPU-heavy preprocessing beside training
    a = np.random.rand(200, 200)
    while not stop.is_set():
        a = np.tanh(a @ a.T / 200)

if __name__ == "__main__":
    dist.init_process_group(backend="shoal")
    torch.set_num_threads(1)
    grads = torch.ones(1024)  # 4 KiB: microseconds when the ranks have the cores
    def allreduce(times):  # every rank the same number of times
        for _ in range(times):
            dist.all_reduce(grads)
    allreduce(20000)  # calm
    stop = mp.Event()
    workers = [mp.Process(target=preprocess, args=(stop,), daemon=True)
               for _ in range(int(os.environ["WORKERS"]))]
    for w in workers:
        w.start()
    time.sleep(1)
    allreduce(5000)  # beside preprocessing
    stop.set()
    for w in workers:
        w.join()
    print("done", flush=True)
"""


def test_cpu_preprocessing_beside_the_cpu_allreduce_is_found(tmp_path, monkeypatch):
    """Two ranks allreduce 4 KiB (microseconds with the cores to themselves), then go on
    beside four preprocessing processes: the contention finding, with its evidence. (A calm
    control belongs to the unit tests: on a shared machine any other load is contention.)"""
    monkeypatch.setenv("SHOAL_LOCAL_ROOT", str(tmp_path / "jobs"))
    code = tmp_path / "code"
    code.mkdir()
    (code / "train.py").write_text(CONTENTION)
    est = shoal.PyTorch(entry_point="train.py", source_dir=str(code),
                        role="arn:aws:iam::111122223333:role/R", instance_type="local",
                        instance_count=1, framework_version="1.13.1", py_version="py39",
                        output_path=(tmp_path / "out").as_uri(), environment={"WORKERS": "4"},
                        distribution={"smdistributed": {"dataparallel": {"enabled": True}}},
                        hyperparameters={"sagemaker_mpi_num_of_processes_per_host": 2})
    est.fit(job_name="contention", logs=False)
    statuses = {s["RuleConfigurationName"]: s for s in
                est.latest_training_job.describe()["ProfilerRuleEvaluationStatuses"]}
    shoal_rules = statuses["ShoalRules"]
    assert shoal_rules["RuleEvaluationStatus"] == "IssuesFound", shoal_rules
    assert "CollectiveCPUContention" in shoal_rules["StatusDetails"]
    assert "move preprocessing" in shoal_rules["StatusDetails"]
    # two processes allreducing on one node: the single-node finding too
    assert "SingleNodeDataParallel" in shoal_rules["StatusDetails"]
    report = json.loads((tmp_path / "out" / "contention" / "rule-output" / "ShoalRules" /
                         "profiler-output" / "profiler-reports" / "CollectiveCPUContention.json"
                         ).read_text())
    evidence = report["Details"]["4096 bytes"]
    assert evidence["contended_collectives"] >= 20 and evidence["worst_inflation"] >= 3


DDP = """
import torch, torch.distributed as dist
import shoal.dataparallel.torch  # noqa: F401 - registers the smddp backend
dist.init_process_group(backend="smddp")
torch.manual_seed(0)
torch.set_num_threads(1)
class Wide(torch.nn.Module):  # 16 MiB of weights and a sum for compute: the step waits
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(4 << 20))
    def forward(self, x):
        return self.w.sum() * x
ddp = torch.nn.parallel.DistributedDataParallel(Wide())
opt = torch.optim.SGD(ddp.parameters(), lr=1e-3)
for step in range(30):
    opt.zero_grad()
    ddp(torch.ones(())).backward()
    opt.step()
print("trained", flush=True)
"""


def test_ddp_buckets_are_recorded_by_the_backend_and_judged(tmp_path, monkeypatch):
    """DDP's allreduces are issued by its C++ reducer and waited on there: Shoal's backend
    records them itself. Every step of every rank carries all 16 MiB of gradients, queued on
    the core's thread, and the communication-bound rule judges the wait after the last
    bucket (most of a step whose compute is a few matrix-vector products)."""
    monkeypatch.setenv("SHOAL_LOCAL_ROOT", str(tmp_path / "jobs"))
    code = tmp_path / "code"
    code.mkdir()
    (code / "train.py").write_text(DDP)
    est = shoal.PyTorch(entry_point="train.py", source_dir=str(code),
                        role="arn:aws:iam::111122223333:role/R", instance_type="local",
                        instance_count=1, framework_version="1.13.1", py_version="py39",
                        output_path=(tmp_path / "out").as_uri(),
                        distribution={"smdistributed": {"dataparallel": {"enabled": True}}},
                        hyperparameters={"sagemaker_mpi_num_of_processes_per_host": 2})
    est.fit(job_name="ddp", logs=False)
    store = data.Store(tmp_path / "out" / "ddp" / "profiler-output")
    store.load()
    grads = defaultdict(int)
    for e in store.events["algo-1"]:
        if e.phase == "Collective" and e.name == "allreduce":
            assert (e.args["backend"], e.args["mode"]) == ("shoal", "queued"), e
            assert "exposed_s" not in e.args  # nobody waited in Python: the reducer did
            grads[(e.args["rank"], e.args["step_num"])] += e.args["bytes"]
    assert grads == {(rank, step): 16 << 20 for rank in (0, 1) for step in range(30)}
    report = json.loads((tmp_path / "out" / "ddp" / "rule-output" / "ShoalRules" /
                         "profiler-output" / "profiler-reports" / "CommunicationBound.json"
                         ).read_text())
    assert report["Details"]["steps_with_overlapped_collectives"] == 60
    assert report["RuleTriggered"] > 0, report
