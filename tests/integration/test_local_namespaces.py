"""A local job whose hosts live in network namespaces of their own (SHOAL_LOCAL_NETWORK=
namespaces): the path a SageMaker job takes. Checked from inside the ranks of a 2-host x
2-process data-parallel job: each host's own non-loopback eth0 address, algo-N resolving to
those addresses, the second host's ranks started over SSH by the master's mpirun, and an
allreduce across the hosts; then nothing of the job is left."""

from __future__ import annotations

import json
import re
import subprocess

import pytest
from shoal.backends.local import LocalBackend
from shoal.errors import InputError
from shoal.local.network import namespaces, preflight

pytestmark = [pytest.mark.netns, pytest.mark.mpi, pytest.mark.torch, pytest.mark.runtime,
              pytest.mark.slow, pytest.mark.skipif(
                  bool(preflight.missing()), reason="; ".join(preflight.missing()) or "ok")]

TRAIN = """
import json, os, socket
import psutil
import shoal.dataparallel.torch  # noqa: F401 - registers smddp
import torch, torch.distributed as dist
dist.init_process_group("smddp")
rank = dist.get_rank()
total = torch.tensor([float(rank + 1)])
dist.all_reduce(total)
eth0 = [a.address for a in psutil.net_if_addrs().get("eth0", []) if a.family == socket.AF_INET]
print("RANK " + json.dumps({
    "rank": rank, "world": dist.get_world_size(), "host": socket.gethostname(), "eth0": eth0,
    "resolved": {h: socket.gethostbyname(h) for h in ("algo-1", "algo-2")},
    "over_ssh": "SSH_CONNECTION" in os.environ, "sum": total.item()}), flush=True)
dist.destroy_process_group()
"""


def request(tmp_path, name: str) -> dict:
    code = tmp_path / "code"
    code.mkdir(exist_ok=True)
    (code / "train.py").write_text(TRAIN)
    return {
        "TrainingJobName": name, "RoleArn": "arn:aws:iam::111122223333:role/R",
        "AlgorithmSpecification": {"TrainingImage": "local", "TrainingInputMode": "File"},
        "HyperParameters": {"sagemaker_program": json.dumps("train.py"),
                            "sagemaker_submit_directory": json.dumps(code.as_uri()),
                            "sagemaker_distributed_dataparallel_enabled": "true",
                            "sagemaker_mpi_num_of_processes_per_host": "2"},
        "OutputDataConfig": {"S3OutputPath": (tmp_path / "out").as_uri()},
        "ResourceConfig": {"InstanceType": "local", "InstanceCount": 2, "VolumeSizeInGB": 30},
        "StoppingCondition": {"MaxRuntimeInSeconds": 300},
    }


def test_two_namespaced_hosts_run_the_real_cluster_path(tmp_path, monkeypatch):
    monkeypatch.setenv("SHOAL_LOCAL_NETWORK", "namespaces")
    job = LocalBackend(root=tmp_path / "jobs").submit(request(tmp_path, "ns-job"))
    job.wait(logs=None)
    log = job.paths.log_file.read_text()
    ranks = [json.loads(line.split("RANK ", 1)[1]) for line in log.splitlines() if "RANK {" in line]
    assert sorted(r["rank"] for r in ranks) == [0, 1, 2, 3], log[-3000:]
    by_host = {h: [r for r in ranks if r["host"] == h] for h in ("algo-1", "algo-2")}
    assert [len(v) for v in by_host.values()] == [2, 2]
    addresses = {h: {a for r in v for a in r["eth0"]} for h, v in by_host.items()}
    for host, found in addresses.items():
        [address] = found  # one address, the same for the host's ranks
        assert not address.startswith("127.")
        assert all(r["resolved"][host] == address for r in ranks)
    assert addresses["algo-1"] != addresses["algo-2"]
    assert all(r["over_ssh"] for r in by_host["algo-2"])  # started by mpirun over SSH
    assert not any(r["over_ssh"] for r in by_host["algo-1"])
    assert all(r["sum"] == 10.0 and r["world"] == 4 for r in ranks)  # 1 + 2 + 3 + 4
    # nothing left: namespaces, the job's keys, processes in the job's tree
    slot = int(re.search(r"network slot (\d+):", log)[1])
    assert not [n for n in namespaces.list_namespaces() if namespaces.slot_of(n) == slot]
    assert not (job.paths.job_dir / "ssh").exists()
    leftover = subprocess.run(["pgrep", "-f", str(job.paths.job_dir)], capture_output=True,
                              text=True).stdout.split()
    assert leftover == []


def test_an_unknown_network_mode_fails_the_submission(tmp_path, monkeypatch):
    monkeypatch.setenv("SHOAL_LOCAL_NETWORK", "bridged")
    with pytest.raises(InputError, match="'SHOAL_LOCAL_NETWORK' must be one of loopback, namespaces"):
        LocalBackend(root=tmp_path / "jobs").submit(request(tmp_path, "bad-mode"))


def test_the_cli_runs_namespaced_hosts_and_stop_leaves_nothing(tmp_path):
    """``shoal run --local --network namespaces``, then ``shoal stop --wait`` (SageMaker's
    stop) while the ranks train: Stopped, and the namespaces, keys and processes gone."""
    import os
    import sys
    import time

    code = tmp_path / "code"
    code.mkdir()
    (code / "train.py").write_text("import time\nprint('the script runs', flush=True)\n"
                                   "time.sleep(300)\n")
    env = {**os.environ, "SHOAL_LOCAL_ROOT": str(tmp_path / "jobs")}

    def shoal(*args):
        return subprocess.run([sys.executable, "-m", "shoal.cli", *args], env=env,
                              capture_output=True, text=True, timeout=180)

    started = shoal("run", "--local", "--network", "namespaces", "--framework", "pytorch",
                    "--framework-version", "1.13.1", "--py-version", "py39",
                    "--entry-point", "train.py", "--source-dir", str(code), "--instance-count",
                    "2", "--role", "arn:aws:iam::111122223333:role/R", "--job-name", "ns-stop",
                    "--output-path", (tmp_path / "out").as_uri(), "--detach")
    assert started.returncode == 0 and started.stdout.strip() == "local://ns-stop", started.stderr
    try:
        log = tmp_path / "jobs" / "ns-stop" / "logs.txt"
        deadline = time.monotonic() + 120
        while log.read_text().count("the script runs") < 2:  # both hosts' scripts
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.2)
        assert "hosts in network namespaces of their own" in log.read_text()
        slot = int(re.search(r"network slot (\d+):", log.read_text())[1])
        assert len([n for n in namespaces.list_namespaces() if namespaces.slot_of(n) == slot]) == 3
    finally:
        stopped = shoal("stop", "local://ns-stop", "--wait")
    assert stopped.returncode == 0, stopped.stderr
    status = json.loads(shoal("status", "local://ns-stop", "--output", "json").stdout)
    assert status["TrainingJobStatus"] == "Stopped"
    assert not [n for n in namespaces.list_namespaces() if namespaces.slot_of(n) == slot]
    assert not (tmp_path / "jobs" / "ns-stop" / "ssh").exists()
    leftover = subprocess.run(["pgrep", "-f", str(tmp_path / "jobs" / "ns-stop")],
                              capture_output=True, text=True).stdout.split()
    assert leftover == []
