"""``shoal run`` in local mode, as a user runs it: a job file, the handle on stdout, exit codes,
the root cause of a failure on stderr, Ctrl-C, and ``--dry-run`` against what ``fit()`` submits."""

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import shoal
import yaml
from shoal import config as config_mod
from shoal.backends import local as local_backend

pytestmark = [pytest.mark.mpi, pytest.mark.slow]
SHOAL = str(Path(sys.executable).parent / "shoal")

SCRIPT = """
import os, sys, time
# One write per line: ranks share mpirun's output, and PYTHONUNBUFFERED splits a print().
sys.stdout.write("script started on %s\\n" % os.environ["SM_CURRENT_HOST"])
sys.stdout.flush()
if os.environ.get("BOOM"):
    raise RuntimeError("boom: the data is bad")
if os.environ.get("SLEEP"):
    time.sleep(float(os.environ["SLEEP"]))
open(os.path.join(os.environ["SM_MODEL_DIR"], "model.txt"), "w").write("trained")
"""


@pytest.fixture
def project(tmp_path, monkeypatch):
    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "train.py").write_text(SCRIPT)
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "x.csv").write_text("1\n")
    job = {
        "framework": "pytorch", "entry_point": "train.py", "source_dir": "code",
        "framework_version": "1.13.1", "py_version": "py39", "instance_type": "local",
        "instance_count": 2, "processes_per_host": 1, "distribution": {"mpi": {"enabled": True}},
        "output_path": (tmp_path / "out").as_uri(), "hyperparameters": {"epochs": 2},
        "inputs": {"train": (tmp_path / "data").as_uri()},
    }
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(job))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SHOAL_LOCAL_ROOT", str(tmp_path / "jobs"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    monkeypatch.delenv("SHOAL_CONFIG", raising=False)
    return tmp_path


def shoal_cli(*args, timeout=300):
    return subprocess.run([SHOAL, *args], capture_output=True, text=True, timeout=timeout)


def leftovers(job_dir):
    found = []
    for proc in psutil.process_iter(["cmdline", "environ"]):
        try:
            text = " ".join(proc.info["cmdline"] or []) + json.dumps(proc.info["environ"] or {})
            if str(job_dir) in text and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
        except psutil.Error:
            continue
    return found


def test_run_prints_the_handle_and_completes(project):
    result = shoal_cli("run", "job.yaml", "--job-name", "cli-ok")
    assert result.returncode == 0, result.stderr
    assert result.stdout == "local://cli-ok\n"
    assert "script started on algo-2" in result.stderr
    assert (project / "out" / "cli-ok" / "output" / "model.tar.gz").exists()
    status = shoal_cli("status", "local://cli-ok", "--output", "json")
    assert status.returncode == 0 and json.loads(status.stdout)["TrainingJobStatus"] == "Completed"
    listed = json.loads(shoal_cli("list", "--output", "json").stdout)
    assert [row["Handle"] for row in listed] == ["local://cli-ok"]
    logs = shoal_cli("logs", "local://cli-ok")
    assert "script started on algo-1" in logs.stdout


def test_a_failing_script_exits_1_with_its_root_cause(project):
    result = shoal_cli("run", "job.yaml", "--job-name", "cli-bad", "--env", "BOOM=1")
    assert result.returncode == 1
    assert result.stdout == "local://cli-bad\n"
    final = result.stderr.split("error: local job cli-bad failed:", 1)[1]
    assert "RuntimeError: boom: the data is bad" in final
    status = shoal_cli("status", "local://cli-bad")
    assert status.returncode == 1 and "boom: the data is bad" in status.stdout


def test_detach_then_stop_from_another_process(project):
    result = shoal_cli("run", "job.yaml", "--job-name", "cli-det", "--env", "SLEEP=300", "--detach")
    assert result.returncode == 0 and result.stdout == "local://cli-det\n"
    job_dir = project / "jobs" / "cli-det"
    deadline = time.monotonic() + 60
    while "script started" not in (job_dir / "logs.txt").read_text():
        assert time.monotonic() < deadline
        time.sleep(0.2)
    stopped = shoal_cli("stop", "local://cli-det", "--wait")
    assert stopped.returncode == 0
    status = shoal_cli("status", "local://cli-det", "--output", "json")
    assert status.returncode == 1 and json.loads(status.stdout)["TrainingJobStatus"] == "Stopped"
    assert not leftovers(job_dir)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_ctrl_c_or_sigterm_stops_the_job_and_leaves_no_process(project, sig):
    name = f"cli-sig{int(sig)}"
    proc = subprocess.Popen([SHOAL, "run", "job.yaml", "--job-name", name, "--env",
                             "SLEEP=300"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    job_dir = project / "jobs" / name
    deadline = time.monotonic() + 60
    while not (job_dir / "logs.txt").exists() or \
            "script started" not in (job_dir / "logs.txt").read_text():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(proc.communicate()[1][-3000:])
        time.sleep(0.2)
    assert leftovers(job_dir)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "stopped" in err
    assert not leftovers(job_dir)
    record = json.loads((job_dir / "job.json").read_text())
    assert record["TrainingJobStatus"] == "Stopped"


def test_dry_run_prints_exactly_what_fit_submits(project, monkeypatch):
    result = shoal_cli("run", "job.yaml", "--job-name", "same-job", "--dry-run")
    assert result.returncode == 0, result.stderr
    printed = json.loads(result.stdout)
    assert not (project / "jobs").exists()  # nothing ran

    submitted = []

    class Recorder:
        def __init__(self, session=None):
            pass

        def submit(self, request):
            submitted.append(request)
            raise SystemExit  # stop before anything runs

    monkeypatch.setattr(local_backend, "backend", Recorder)
    estimator = config_mod.build_estimator(config_mod.load_spec(project / "job.yaml"))
    assert isinstance(estimator, shoal.PyTorch)
    with pytest.raises(SystemExit):
        estimator.fit(config_mod.load_spec(project / "job.yaml").inputs, job_name="same-job")
    assert json.loads(json.dumps(submitted[0], default=str)) == printed


def test_secret_looking_values_are_refused_without_echoing_them(project):
    result = shoal_cli("run", "job.yaml", "--job-name", "sec-job", "--dry-run",
                       "--env", "DB_PASSWORD=hunter2hunter2")
    assert result.returncode == 2
    assert "DB_PASSWORD" in result.stderr
    assert "hunter2hunter2" not in result.stdout + result.stderr


def test_the_example_job_file_plans_the_demo_job(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    example = Path(__file__).resolve().parents[2] / "examples" / "pytorch"
    result = shoal_cli("run", str(example / "job.yaml"), "--job-name", "planned", "--dry-run")
    assert result.returncode == 0, result.stderr
    request = json.loads(result.stdout)
    hps = {k: json.loads(v) for k, v in request["HyperParameters"].items()}
    assert hps["sagemaker_submit_directory"] == example.as_uri()
    assert hps["sagemaker_program"] == "train_digits.py"
    assert hps["sagemaker_distributed_dataparallel_enabled"] is True
    assert hps["sagemaker_mpi_num_of_processes_per_host"] == 2
    assert request["ResourceConfig"]["InstanceCount"] == 2
