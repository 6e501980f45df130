"""The rank environment contract of shoal-rank."""

import json
import os
import signal
import subprocess
import sys
import time

from shoal.launcher.rank import FAILURE_MARKER, failure_line, job_id, rank_environment

OMPI = {"OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_SIZE": "4",
        "OMPI_COMM_WORLD_LOCAL_RANK": "1", "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
        "OMPI_MCA_ess_base_jobid": "1470562305", "TRAINING_JOB_NAME": "my-job"}  # fmt: skip


def test_from_open_mpi_variables():
    env = rank_environment({**OMPI, "SHOAL_HOST": "algo-2"}, master_host="algo-1",
                           network_interface="eth0")  # fmt: skip
    assert env == {"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2",
                   "MASTER_ADDR": "algo-1", "MASTER_PORT": "7777", "SHOAL_HOST": "algo-2",
                   "SHOAL_JOB_ID": "my-job-1470562305",
                   "SHOAL_NETWORK_INTERFACE": "eth0"}  # fmt: skip


def test_torchrun_style_environment_is_kept():
    env = rank_environment({"RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "1",
                            "LOCAL_WORLD_SIZE": "4", "MASTER_ADDR": "10.0.0.1",
                            "MASTER_PORT": "29500", "SHOAL_JOB_ID": "j"}, host="algo-9")  # fmt: skip
    assert (env["RANK"], env["WORLD_SIZE"], env["LOCAL_RANK"], env["LOCAL_WORLD_SIZE"]) == (
        "5", "8", "1", "4")
    assert (env["MASTER_ADDR"], env["MASTER_PORT"], env["SHOAL_HOST"]) == (
        "10.0.0.1", "29500", "algo-9")
    assert env["SHOAL_JOB_ID"] == "j"
    assert "SHOAL_NETWORK_INTERFACE" not in env


def test_simulation_overrides_win():
    env = rank_environment({**OMPI, "SHOAL_MASTER_ADDR": "127.0.0.1", "SHOAL_MASTER_PORT": "4000",
                            "MASTER_PORT": "1"}, master_host="algo-1")  # fmt: skip
    assert (env["MASTER_ADDR"], env["MASTER_PORT"]) == ("127.0.0.1", "4000")


def test_job_id_same_across_ranks_of_a_job_and_distinct_between_jobs():
    a = job_id({**OMPI, "OMPI_COMM_WORLD_RANK": "0"})
    b = job_id({**OMPI, "OMPI_COMM_WORLD_RANK": "3", "SHOAL_JOB_ID": "other"})
    c = job_id({**OMPI, "OMPI_MCA_ess_base_jobid": "99"})
    assert a == b != c
    assert job_id({"TRAINING_JOB_NAME": "a/b c"}) == "a_b_c"
    assert job_id({}) != job_id({})


def test_failure_line_names_rank_host_and_signal():
    ranks = {"RANK": "1", "LOCAL_RANK": "1", "SHOAL_HOST": "algo-1"}
    line = failure_line(ranks, -signal.SIGKILL)
    assert line.startswith(FAILURE_MARKER + " ")
    assert json.loads(line.split(" ", 1)[1]) == {"rank": 1, "local_rank": 1, "host": "algo-1",
                                                 "exit_code": 137, "signal": "SIGKILL"}  # fmt: skip


def _run_rank(code, tmp_path, extra_env=None):
    env = {**os.environ, **OMPI, "SHOAL_HOST": "algo-2", "SAGEMAKER_BASE_DIR": str(tmp_path),
           **(extra_env or {})}  # fmt: skip
    return subprocess.run([sys.executable, "-m", "shoal.launcher.rank", sys.executable, "-c", code],
                          env=env, capture_output=True, text=True, timeout=60)  # fmt: skip


def test_wrapper_sets_variables_and_passes_exit_code(tmp_path):
    done = _run_rank("import os,sys; print(os.environ['RANK'], os.environ['SHOAL_HOST']);"
                     " sys.exit(3)", tmp_path)  # fmt: skip
    assert done.returncode == 3
    assert done.stdout.strip() == "3 algo-2"
    assert done.stderr.splitlines()[0] == "shoal-rank: rank 3 of 4 (local 1 of 2) on algo-2"
    record = json.loads(done.stderr.strip().splitlines()[-1].split(" ", 1)[1])
    assert record["rank"] == 3 and record["exit_code"] == 3 and record["host"] == "algo-2"


def test_wrapper_reports_a_killed_child(tmp_path):
    done = _run_rank("import os,signal; os.kill(os.getpid(), signal.SIGKILL)", tmp_path)
    assert done.returncode == 137
    assert '"signal": "SIGKILL"' in done.stderr


def test_wrapper_success_prints_no_marker(tmp_path):
    done = _run_rank("pass", tmp_path)
    assert done.returncode == 0 and FAILURE_MARKER not in done.stderr


def test_wrapper_recomputes_sm_variables_for_its_host(tmp_path):
    config = tmp_path / "input" / "config"
    config.mkdir(parents=True)
    (config / "resourceconfig.json").write_text(json.dumps(
        {"current_host": "algo-2", "hosts": ["algo-1", "algo-2"]}))
    done = _run_rank("import os; print(os.environ['SM_CURRENT_HOST'], os.environ['SM_MODEL_DIR'],"
                     " os.environ['MASTER_ADDR'])", tmp_path,
                     {"SM_CURRENT_HOST": "algo-1", "SM_MODEL_DIR": "/elsewhere"})  # fmt: skip
    assert done.stdout.split() == ["algo-2", str(tmp_path / "model"), "algo-1"]


def test_host_environment_file_is_private_and_is_the_base_of_the_rank_env(tmp_path):
    from shoal.launcher.rank import write_host_environment

    path = write_host_environment(str(tmp_path / "input"), {"FROM_CONTAINER": "yes",
                                                            "OVERRIDDEN": "file"})  # fmt: skip
    assert os.stat(path).st_mode & 0o777 == 0o600
    done = _run_rank("import os; print(os.environ['FROM_CONTAINER'], os.environ['OVERRIDDEN'])",
                     tmp_path, {"OVERRIDDEN": "mpirun"})  # fmt: skip
    assert done.stdout.split() == ["yes", "mpirun"]


def test_the_hosts_launcher_ends_its_running_ranks(tmp_path):
    """A wrapper notes itself under input/shoal-ranks while its rank runs (ranks on a worker
    host are not the launcher's children); end_host_ranks ends those, and only those."""
    from shoal.launcher.rank import RANKS_DIR, end_host_ranks

    env = {**os.environ, **OMPI, "SHOAL_HOST": "algo-2", "SAGEMAKER_BASE_DIR": str(tmp_path)}
    rank = subprocess.Popen([sys.executable, "-m", "shoal.launcher.rank", sys.executable, "-c",
                             "import time; time.sleep(60)"], env=env, stderr=subprocess.PIPE)
    folder = tmp_path / "input" / RANKS_DIR
    deadline = time.monotonic() + 30
    while not (folder / str(rank.pid)).exists():
        assert time.monotonic() < deadline and rank.poll() is None
        time.sleep(0.05)
    stranger = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    (folder / str(stranger.pid)).touch()  # a pid reused by another process: left alone
    (folder / "not-a-pid").touch()
    try:
        assert end_host_ranks(str(tmp_path / "input"), grace=5) == 1
        rank.wait(timeout=10)  # (its status went to psutil, which reaped it)
        assert stranger.poll() is None
        assert FAILURE_MARKER not in rank.stderr.read().decode()  # stopped, not failed
        assert not (folder / str(rank.pid)).exists()
    finally:
        stranger.kill()
        stranger.wait()
        rank.kill()
        rank.wait()
