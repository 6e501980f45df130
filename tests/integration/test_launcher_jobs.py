"""Whole jobs through ``train`` with the real mpirun: 2 simulated hosts x 2 ranks."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import psutil
import pytest
from shoal.launcher.ports import free_port
from shoal.launcher.simulate import host_environment, run_job

pytestmark = [
    pytest.mark.mpi,
    pytest.mark.skipif(shutil.which("mpirun") is None, reason="Open MPI's mpirun is not installed"),
]

HOSTS = ["algo-1", "algo-2"]

WRITE_RANK = """
import json, os, socket, sys
rank = int(os.environ["RANK"])
record = {"rank": rank, "local_rank": int(os.environ["LOCAL_RANK"]),
          "size": int(os.environ["WORLD_SIZE"]), "local_size": int(os.environ["LOCAL_WORLD_SIZE"]),
          "host": os.environ["SHOAL_HOST"], "sm_host": os.environ["SM_CURRENT_HOST"],
          "job_id": os.environ["SHOAL_JOB_ID"], "args": sys.argv[1:],
          "ompi_rank": int(os.environ["OMPI_COMM_WORLD_RANK"]),
          "hostname": socket.gethostname()}
with open(os.path.join(os.environ["SM_MODEL_DIR"], f"rank-{rank}.json"), "w") as f:
    json.dump(record, f)
"""

FAIL_RANK_1 = """
import os, signal, time
if int(os.environ["RANK"]) == 1:
    time.sleep(1)
    {action}
time.sleep(300)
"""

WAIT_FOREVER = """
import os, time
open(os.path.join(os.environ["SM_MODEL_DIR"], "started-" + os.environ["RANK"]), "w").close()
time.sleep(300)
"""


def make_job(root, script, flag="sagemaker_mpi_enabled", ppn=2):
    hps = {"sagemaker_program": json.dumps("train.py"), flag: "true",
           "sagemaker_mpi_num_of_processes_per_host": str(ppn), "epochs": "2"}  # fmt: skip
    for host in HOSTS:
        config = root / host / "input" / "config"
        config.mkdir(parents=True)
        (config / "resourceconfig.json").write_text(json.dumps(
            {"current_host": host, "hosts": HOSTS, "network_interface_name": "eth0"}))
        (config / "hyperparameters.json").write_text(json.dumps(hps))
        (config / "inputdataconfig.json").write_text(json.dumps({"train": {}}))
        (root / host / "code").mkdir()
        (root / host / "code" / "train.py").write_text(script)
    return root


def job_processes(root):
    found = []
    for p in psutil.process_iter():
        try:
            if p.environ().get("SHOAL_SIMULATED_ROOT") == str(root) and p.status() != "zombie":
                found.append(p)
        except psutil.Error:
            pass
    return found


def failure_text(root, host):
    return (root / host / "output" / "failure").read_text()


@pytest.mark.parametrize("flag", ["sagemaker_mpi_enabled",
                                  "sagemaker_distributed_dataparallel_enabled"])
def test_every_rank_reports_rank_local_rank_size_and_host(tmp_path, flag):
    root = make_job(tmp_path / "job", WRITE_RANK, flag)
    assert run_job(str(root), HOSTS, timeout=120) == 0
    records = {}
    for host in HOSTS:
        for path in (root / host / "model").glob("rank-*.json"):
            records[json.loads(path.read_text())["rank"]] = (host, json.loads(path.read_text()))
        assert (root / host / "output" / "success").exists()
    assert sorted(records) == [0, 1, 2, 3]
    for rank, (model_host, rec) in records.items():
        expected_host = HOSTS[rank // 2]
        assert model_host == expected_host  # written to its own host's SM_MODEL_DIR
        assert rec["host"] == rec["sm_host"] == rec["hostname"] == expected_host
        assert (rec["local_rank"], rec["size"], rec["local_size"]) == (rank % 2, 4, 2)
        assert rec["ompi_rank"] == rank
        assert rec["args"] == ["--epochs", "2"]
    assert len({rec["job_id"] for _, rec in records.values()}) == 1
    assert job_processes(root) == []


@pytest.mark.parametrize("action, how", [
    ("raise ValueError('rank one failed on purpose')", "exited with code 1"),
    ("os.kill(os.getpid(), signal.SIGKILL)", "was killed by SIGKILL"),
])  # fmt: skip
def test_failing_rank_ends_the_job_on_every_host(tmp_path, action, how):
    root = make_job(tmp_path / "job", FAIL_RANK_1.format(action=action))
    started = time.monotonic()
    code = run_job(str(root), HOSTS, timeout=30)
    assert code not in (0, 124), "the job must fail, and before the 30 s limit"
    assert time.monotonic() - started < 30
    for host in HOSTS:
        text = failure_text(root, host)
        assert text.startswith(f"Rank 1 on host algo-1 {how}."), text
        assert "ExitCode" in text and "Command \"mpirun" in text
        assert len(text) <= 1024
        assert not (root / host / "output" / "success").exists()
    if "raise" in action:
        assert "ValueError: rank one failed on purpose" in failure_text(root, "algo-1")
    time.sleep(0.5)
    assert job_processes(root) == []


def test_sigterm_to_the_launcher_ends_every_rank(tmp_path):
    root = make_job(tmp_path / "job", WAIT_FOREVER)
    base = {**os.environ, "SHOAL_MASTER_PORT": str(free_port()),
            "SHOAL_STATUS_PORT": str(free_port()), "SHOAL_STOP_GRACE": "5"}  # fmt: skip
    procs = {h: subprocess.Popen([sys.executable, "-m", "shoal.launcher.entrypoint"],
                                 env=host_environment(str(root), h, base)) for h in HOSTS}  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        started = lambda: sum(len(list((root / h / "model").glob("started-*"))) for h in HOSTS)  # noqa: E731
        while started() < 4 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert started() == 4
        procs["algo-1"].send_signal(signal.SIGTERM)
        assert procs["algo-1"].wait(timeout=30) != 0
        assert procs["algo-2"].wait(timeout=30) != 0
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
    assert failure_text(root, "algo-1").startswith("Training stopped by SIGTERM.")
    assert failure_text(root, "algo-2").startswith("Training stopped by SIGTERM.")
    time.sleep(0.5)
    assert job_processes(root) == []


def test_a_worker_that_cannot_start_fails_the_job_everywhere(tmp_path):
    root = make_job(tmp_path / "job", WRITE_RANK)
    (root / "algo-2" / "code" / "train.py").unlink()
    hps = json.loads((root / "algo-2" / "input/config/hyperparameters.json").read_text())
    hps["sagemaker_submit_directory"] = json.dumps(str(tmp_path / "missing-source"))
    (root / "algo-2" / "input/config/hyperparameters.json").write_text(json.dumps(hps))
    code = run_job(str(root), HOSTS, timeout=60, env={**os.environ, "SHOAL_STATUS_LINGER": "5"})
    assert code not in (0, 124)
    assert "does not exist" in failure_text(root, "algo-2")
    assert "host algo-2 could not start" in failure_text(root, "algo-1")
    assert list((root / "algo-1" / "model").glob("rank-*.json")) == []
    assert job_processes(root) == []


# The atexit line is printed after the traceback: it is the rank's last line.
PRINT_THEN_RAISE = """
import atexit, os, time
def saved():
    time.sleep(0.5)
    print("emergency checkpoint saved", flush=True)
if int(os.environ["RANK"]) == 1:
    print("epoch 1 finished; loss 0.25", flush=True)
    atexit.register(saved)
    raise ValueError("boom")
time.sleep(300)
"""


def test_failure_headline_quotes_the_exception_not_the_last_stdout_line(tmp_path):
    root = make_job(tmp_path / "job", PRINT_THEN_RAISE)
    assert run_job(str(root), HOSTS, timeout=60) not in (0, 124)
    for host in HOSTS:
        headline = failure_text(root, host).splitlines()[0]
        assert headline == "Rank 1 on host algo-1 exited with code 1. ValueError: boom", headline
