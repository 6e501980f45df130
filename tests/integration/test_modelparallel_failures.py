"""A model-parallel job whose script raises ends as fast as a data-parallel one and names
the rank that raised: `shoal run` of 2 hosts x 2 processes (pipeline 2 x data parallel 2)
whose first ``smp.step`` refuses the batch on both pipelines' first ranks at once (5
microbatches do not divide a batch of 32). The ranks that raised must not wait on their
busy pipeline peers at exit, nor abort on the way out (a thread still inside the core when
the interpreter finalizes): the job ends within 15 s of the step and its FailureReason
leads with one of the raising ranks and its ValueError. `make stress-failures` repeats it
beside two busy loops.
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
import sys, time
import smdistributed.modelparallel.torch as smp
import torch
from torch import nn

smp.init()
torch.manual_seed(0)
model = smp.DistributedModel(nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 1)))
optimizer = smp.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1))


@smp.step
def train_step(model, x):
    loss = model(x).sum()
    model.backward(loss)
    return loss


sys.stdout.write("first step at %.3f\\n" % time.time())
sys.stdout.flush()
train_step(model, torch.randn(32, 8))  # 32 is no multiple of 5 microbatches
"""


@pytest.fixture
def project(tmp_path, monkeypatch):
    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "train.py").write_text(SCRIPT)
    job = {
        "framework": "pytorch", "entry_point": "train.py", "source_dir": "code",
        "framework_version": "1.13.1", "py_version": "py39", "instance_type": "local",
        "instance_count": 2, "output_path": (tmp_path / "out").as_uri(),
        "distribution": {
            "smdistributed": {"modelparallel": {"enabled": True, "parameters": {
                "partitions": 2, "microbatches": 5, "ddp": True,
                "placement_strategy": "cluster"}}},
            "mpi": {"enabled": True, "processes_per_host": 2},
        },
    }
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(job))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SHOAL_LOCAL_ROOT", str(tmp_path / "jobs"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    monkeypatch.delenv("SHOAL_CONFIG", raising=False)
    return tmp_path


def test_a_rank_raising_in_a_pipeline_ends_the_job_in_seconds_and_is_named(project):
    result = subprocess.run([SHOAL, "run", "job.yaml", "--job-name", "mp-raise"],
                            capture_output=True, text=True, timeout=300)
    ended = time.time()
    assert result.returncode == 1, result.stderr[-3000:]
    log, reason = result.stderr.split("error: local job mp-raise failed:", 1)
    started = [float(t) for t in re.findall(r"first step at (\d+\.\d+)", log)]
    assert len(started) == 4, log[-3000:]
    took = ended - min(started)
    assert took <= BOUND_S, f"the job ended {took:.1f} s after the failing step"
    reason = reason.strip()
    headline = reason.splitlines()[0]
    assert re.match(r"Rank [02] on host algo-[12] exited with code 1\. ValueError: "
                    r"Argument 'x' \(shape \[32, 8\]\): Batch size must be divisible", headline), \
        headline
