"""A model-parallel job whose script raises ends as fast as a data-parallel one and names
the rank that raised: `shoal run` of 2 hosts x 2 processes (pipeline 2 x data parallel 2).

- The first ``smp.step`` refuses the batch on both pipelines' first ranks at once (5
  microbatches do not divide a batch of 32). The ranks that raised must not wait on their
  busy pipeline peers at exit, nor abort on the way out (a thread still inside the core
  when the interpreter finalizes).
- A module of the second partition raises in the third step, on both pipelines' second
  ranks: their leaders and the other ranks only relay it (SMPPeerError); the ranks whose
  module raised are the root cause.

Each job ends within 15 s of the failing step, and its FailureReason leads with one of
the raising ranks and its ValueError. `make stress-failures` repeats them beside two busy
loops.
"""

import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

pytestmark = [pytest.mark.mpi, pytest.mark.slow, pytest.mark.torch]
SHOAL = str(Path(sys.executable).parent / "shoal")
BOUND_S = 15.0

SCRIPT = """
import os, sys, time
import smdistributed.modelparallel.torch as smp
import torch
from torch import nn


class Head(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(8, 1)
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        if os.environ.get("HEAD_FAILS_AT") and self.calls > int(os.environ["HEAD_FAILS_AT"]):
            raise ValueError("bad activations in the head")
        return self.linear(x)


smp.init()
torch.manual_seed(0)
model = smp.DistributedModel(nn.Sequential(nn.Linear(8, 8), nn.ReLU(), Head()))
optimizer = smp.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1))


@smp.step
def train_step(model, x):
    loss = model(x).sum()
    model.backward(loss)
    return loss


for step in range(4):
    sys.stdout.write("step %d at %.3f\\n" % (step, time.time()))
    sys.stdout.flush()
    optimizer.zero_grad()
    train_step(model, torch.randn(int(os.environ["BATCH"]), 8))
    optimizer.step()
"""


@pytest.fixture
def project(tmp_path, monkeypatch):
    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "train.py").write_text(SCRIPT)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SHOAL_LOCAL_ROOT", str(tmp_path / "jobs"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    monkeypatch.delenv("SHOAL_CONFIG", raising=False)
    return tmp_path


def run_job(project, name, microbatches, environment):
    job = {
        "framework": "pytorch", "entry_point": "train.py", "source_dir": "code",
        "framework_version": "1.13.1", "py_version": "py39", "instance_type": "local",
        "instance_count": 2, "output_path": (project / "out").as_uri(),
        "environment": environment,
        "distribution": {
            "smdistributed": {"modelparallel": {"enabled": True, "parameters": {
                "partitions": 2, "microbatches": microbatches, "ddp": True,
                "placement_strategy": "cluster"}}},
            "mpi": {"enabled": True, "processes_per_host": 2},
        },
    }
    (project / "job.yaml").write_text(yaml.safe_dump(job))
    result = subprocess.run([SHOAL, "run", "job.yaml", "--job-name", name],
                            capture_output=True, text=True, timeout=300)
    return result, time.time()


def check_ended_in_time_and_named(result, ended, name, step, ranks, error):
    assert result.returncode == 1, result.stderr[-3000:]
    log, reason = result.stderr.split(f"error: local job {name} failed:", 1)
    # A rank may be ended before it gets to print (the job fails as soon as one raises): the
    # first rank to reach the step dates it, and it reached it no later than any raise.
    started = [float(t) for t in re.findall(rf"step {step} at (\d+\.\d+)", log)]
    assert started, log[-3000:]
    took = ended - min(started)
    assert took <= BOUND_S, f"the job ended {took:.1f} s after the failing step"
    headline = reason.strip().splitlines()[0]
    assert re.match(rf"Rank [{ranks}] on host algo-[12] exited with code 1\. {error}",
                    headline), headline


def test_ranks_raising_at_the_first_step_end_the_job_in_seconds_and_are_named(project):
    result, ended = run_job(project, "mp-batch", 5, {"BATCH": "32"})
    check_ended_in_time_and_named(
        result, ended, "mp-batch", 0, "02",
        r"ValueError: Argument 'x' \(shape \[32, 8\]\): Batch size must be divisible")


def test_a_module_raising_on_a_later_partition_names_its_rank_not_the_relays(project):
    # 4 microbatches a step: the head's 9th call, in the third step, raises
    result, ended = run_job(project, "mp-head", 4, {"BATCH": "32", "HEAD_FAILS_AT": "8"})
    check_ended_in_time_and_named(result, ended, "mp-head", 2, "13",
                                  "ValueError: bad activations in the head")
