"""Faults injected into a running local job whose 2 hosts x 2 ranks live in network namespaces
of their own, and what every case checks afterwards: the job ended within its budget of the
fault, its FailureReason names the root cause, nothing of it is left (namespaces, processes,
shared-memory segments, keys) and what it wrote before the fault is intact.

The job trains data-parallel (smddp) in steps; rank 0 writes ``before-fault.txt`` to the model
directory and a checkpoint ``step-N`` to the checkpoint directory every 20 steps, then prints
``TRAINING-NOW`` (each rank does) so that the fault lands mid-training.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import tarfile
import time
from pathlib import Path

import attrs
from shoal.backends.local import LocalBackend
from shoal.local.network import namespaces

# Seconds: the collective time-out of the one case that needs it (a rank frozen inside a
# live host, which no heartbeat sees); every other case runs with the defaults.
COLLECTIVE_TIMEOUT = 20
TRAIN = """
import os, sys, time
import shoal.dataparallel.torch  # noqa: F401 - registers smddp
import torch, torch.distributed as dist
dist.init_process_group("smddp")
rank = dist.get_rank()
ckpt = "/opt/ml/checkpoints"
done = sorted(int(n.split("-")[1]) for n in os.listdir(ckpt) if n.startswith("step-"))
start = done[-1] if done else 0
if rank == 0:
    with open(os.path.join(os.environ["SM_MODEL_DIR"], "before-fault.txt"), "w") as f:
        f.write("written before the fault")
print(f"resumed from step {start}", flush=True)
steps = int(os.environ.get("STEPS", "1000000"))
grads = torch.ones(1 << 16)
for step in range(start, steps):
    dist.all_reduce(grads)
    if step == start + 5:
        print("TRAINING-NOW", flush=True)
    if rank == 0 and step % 20 == 0:
        open(os.path.join(ckpt, f"step-{step}"), "w").write(str(step))
        with open(os.path.join(os.environ["SM_MODEL_DIR"], "model-latest.bin"), "wb") as f:
            f.write(bytes(256 << 10))  # the model as it trains
    time.sleep(0.01)
print("finished", flush=True)
"""


@attrs.define
class Job:
    tmp: Path
    name: str
    backend_job: object = None
    before_ns: set = attrs.field(factory=set)
    before_shm: set = attrs.field(factory=set)
    own_ns: set = attrs.field(factory=set)  # the namespaces this job made
    fault_at: float = 0.0

    @property
    def dir(self) -> Path:
        return self.tmp / "jobs" / self.name

    def log(self) -> str:
        path = self.dir / "logs.txt"
        return path.read_text() if path.exists() else ""


def start(tmp: Path, name: str, monkeypatch, **environment) -> Job:
    """Submits the job and returns once every rank trains."""
    monkeypatch.setenv("SHOAL_LOCAL_NETWORK", "namespaces")
    code = tmp / "code"
    code.mkdir(exist_ok=True)
    (code / "train.py").write_text(TRAIN)
    job = Job(tmp, name, before_ns=set(namespaces.list_namespaces()),
              before_shm=set(os.listdir("/dev/shm")))
    request = {
        "TrainingJobName": name, "RoleArn": "arn:aws:iam::111122223333:role/R",
        "AlgorithmSpecification": {"TrainingImage": "local", "TrainingInputMode": "File"},
        "HyperParameters": {"sagemaker_program": json.dumps("train.py"),
                            "sagemaker_submit_directory": json.dumps(code.as_uri()),
                            "sagemaker_distributed_dataparallel_enabled": "true",
                            "sagemaker_mpi_num_of_processes_per_host": "2"},
        "OutputDataConfig": {"S3OutputPath": (tmp / f"out-{name}").as_uri()},
        "CheckpointConfig": {"S3Uri": (tmp / "checkpoints").as_uri()},
        "ResourceConfig": {"InstanceType": "local", "InstanceCount": 2, "VolumeSizeInGB": 30},
        "StoppingCondition": {"MaxRuntimeInSeconds": 600},
        "Environment": {k: str(v) for k, v in environment.items()},
    }
    job.backend_job = LocalBackend(root=tmp / "jobs").submit(request)
    try:
        deadline = time.monotonic() + 180
        while job.log().count("TRAINING-NOW") < 4:
            assert time.monotonic() < deadline, job.log()[-3000:]
            assert job.backend_job.describe()["TrainingJobStatus"] == "InProgress", \
                job.log()[-3000:]
            time.sleep(0.2)
        # other jobs may make and remove namespaces meanwhile: this job's are its slot's,
        # which its log names
        slot = int(re.search(r"network slot (\d+):", job.log())[1])
        job.own_ns = {n for n in namespaces.list_namespaces() if namespaces.slot_of(n) == slot}
        assert len(job.own_ns) == 3, job.own_ns  # the bridge's and two hosts'
    except BaseException:
        job.backend_job.stop(wait=True)  # a job that never got its fault must not live on
        raise
    _current.append(job)
    return job


_current: list = []  # the job whose namespaces the helpers below act on


def host_namespace(host: str) -> str:
    own = _current[-1].own_ns if _current else set(namespaces.list_namespaces())
    return next(n for n in sorted(own) if n.endswith(f"-{host}"))


def namespace_pids(host: str) -> list[int]:
    out = subprocess.run(["ip", "netns", "pids", host_namespace(host)], capture_output=True,
                         text=True).stdout
    return [int(p) for p in out.split()]


def rank_pids(host: str) -> list[int]:
    """The training processes (``python -m mpi4py train.py``) in ``host``'s namespace."""
    found = []
    for pid in namespace_pids(host):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        # the interpreter itself (python -m mpi4py train.py), not shoal-rank around it
        if cmdline[1:4] == [b"-m", b"mpi4py", b"train.py"]:
            found.append(pid)
    return found


def signal_pids(pids, sig) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def finish(job: Job, budget: float) -> dict:
    """Waits for the job's end and checks what every case checks; its description."""
    try:
        job.backend_job.wait(logs=None)
    except Exception:  # JobFailedError / JobStoppedError: the description says which
        pass
    ended = time.monotonic()
    print(f"{job.name}: the job ended {ended - job.fault_at:.1f} s after the fault", flush=True)
    description = job.backend_job.describe()
    assert ended - job.fault_at <= budget, (ended - job.fault_at, description.get("FailureReason"))
    assert_nothing_left(job)
    return description


def assert_nothing_left(job: Job) -> None:
    deadline = time.monotonic() + 10  # the supervisor is the last to go
    while True:
        leftover = subprocess.run(["pgrep", "-f", str(job.dir)], capture_output=True,
                                  text=True).stdout.split()
        if not leftover or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert leftover == [], subprocess.run(["ps", "-o", "pid,args", "-p", ",".join(leftover)],
                                          capture_output=True, text=True).stdout
    assert not job.own_ns & set(namespaces.list_namespaces())
    assert not (job.dir / "ssh").exists()
    new_segments = set(os.listdir("/dev/shm")) - job.before_shm
    assert not [s for s in new_segments if "shoal" in s.lower()], new_segments


def model_files(job: Job) -> dict[str, bytes]:
    archive = job.tmp / f"out-{job.name}" / job.name / "output" / "model.tar.gz"
    with tarfile.open(archive) as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}


def checkpoints(job: Job) -> list[int]:
    return sorted(int(p.name.split("-")[1]) for p in (job.tmp / "checkpoints").glob("step-*"))


def mark_fault(job: Job) -> None:
    job.fault_at = time.monotonic()


__all__ = ["COLLECTIVE_TIMEOUT", "Job", "start", "host_namespace", "namespace_pids", "rank_pids",
           "signal_pids", "finish", "model_files", "checkpoints", "mark_fault", "signal"]
