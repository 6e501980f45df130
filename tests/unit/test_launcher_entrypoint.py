"""``train`` end to end on one host, and the pieces it assembles."""

import json
import logging
import os
import subprocess
import sys

from shoal.launcher.entrypoint import Launch, log_level
from shoal.launcher.environment import load_environment
from shoal.launcher.paths import JobPaths


def write_job(root, hps, host="algo-1", hosts=("algo-1",), script=None):
    config = root / "input" / "config"
    config.mkdir(parents=True)
    (config / "resourceconfig.json").write_text(json.dumps(
        {"current_host": host, "hosts": list(hosts), "network_interface_name": "eth0"}))
    (config / "hyperparameters.json").write_text(json.dumps(
        {"sagemaker_program": json.dumps("train.py"), **hps}))
    if script is not None:
        (root / "code").mkdir()
        (root / "code" / "train.py").write_text(script)
    return JobPaths(str(root))


def run_train(root, **extra):
    env = {k: v for k, v in os.environ.items() if not k.endswith("LOG_LEVEL")}
    env.update(SAGEMAKER_BASE_DIR=str(root), SHOAL_HOST="algo-1", **extra)
    return subprocess.run([sys.executable, "-m", "shoal.launcher.entrypoint"], env=env,
                          capture_output=True, text=True, timeout=120)  # fmt: skip


def test_single_host_success(tmp_path):
    write_job(tmp_path, {"lr": "0.5"}, script="import os, sys\n"
              "open(os.path.join(os.environ['SM_MODEL_DIR'], 'm'), 'w').write(' '.join(sys.argv[1:]))\n")
    done = run_train(tmp_path)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "model" / "m").read_text() == "--lr 0.5"
    assert (tmp_path / "output" / "success").exists()


def test_startup_errors_write_the_failure_file(tmp_path):
    done = run_train(tmp_path)  # no configuration at all
    assert done.returncode == 1
    assert (tmp_path / "output" / "failure").read_text().startswith(
        "LaunchError: missing job configuration file")


def test_bad_distribution_is_a_configuration_failure(tmp_path):
    write_job(tmp_path, {"sagemaker_mpi_enabled": "true",
                         "sagemaker_mpi_num_of_processes_per_host": "0"}, script="")  # fmt: skip
    done = run_train(tmp_path)
    assert done.returncode == 2
    assert "'processes_per_host' must be >= 1 (got 0)" in (
        tmp_path / "output" / "failure").read_text()


def test_secret_hyperparameters_are_not_logged(tmp_path):
    write_job(tmp_path, {"api_token": json.dumps("s3cr3t-value")}, script="import sys\n")
    done = run_train(tmp_path)
    assert done.returncode == 0
    assert "s3cr3t-value" not in done.stderr + done.stdout


def test_exported_variables_are_counted_and_named_at_debug_level_only(tmp_path):
    write_job(tmp_path, {"db_password": json.dumps("hunter2hunter2")}, script="")
    done = run_train(tmp_path)
    assert done.returncode == 0, done.stderr
    exporting = [ln for ln in done.stderr.splitlines() if "exporting" in ln]
    assert len(exporting) == 1 and exporting[0].endswith(
        "variables to the job's processes (SM_LOG_LEVEL=debug names them)")
    assert "SM_MODEL_DIR" not in done.stderr
    done = run_train(tmp_path, SM_LOG_LEVEL="debug")
    named = [ln for ln in done.stderr.splitlines() if "DEBUG: exported variables:" in ln]
    assert len(named) == 1 and "SM_MODEL_DIR" in named[0] and "SM_HP_DB_PASSWORD" in named[0]
    assert "hunter2hunter2" not in done.stderr + done.stdout


def test_log_level_takes_a_number_or_a_name():
    assert log_level({}) == logging.INFO
    assert log_level({"SM_LOG_LEVEL": "10"}) == logging.DEBUG
    assert log_level({"SM_LOG_LEVEL": "debug"}) == logging.DEBUG
    assert log_level({"SAGEMAKER_CONTAINER_LOG_LEVEL": "WARNING"}) == logging.WARNING
    assert log_level({"SM_LOG_LEVEL": "loud"}) == logging.INFO


def test_mpirun_line_runs_every_rank_through_shoal_rank(tmp_path):
    paths = write_job(tmp_path, {"sagemaker_distributed_dataparallel_enabled": "true",
                                 "sagemaker_instance_type": json.dumps("ml.p4d.24xlarge"),
                                 "sagemaker_mpi_num_of_processes_per_host": "8"},
                      hosts=("algo-1", "algo-2"), script="")  # fmt: skip
    launch = Launch(load_environment(paths, {}, num_gpus=0, num_cpus=2), {})
    argv = launch.mpirun_argv()
    assert argv[:5] == ["mpirun", "--host", "algo-1:8,algo-2:8", "-np", "16"]
    i = next(i for i, tok in enumerate(argv) if tok.endswith("shoal-rank"))
    assert argv[i + 1:] == [sys.executable, "-m", "mpi4py", "train.py"]
    assert "SAGEMAKER_INSTANCE_TYPE=ml.p4d.24xlarge" in argv
    assert "FI_EFA_USE_DEVICE_RDMA=1" in argv


def test_a_platform_agent_replaces_ssh_and_the_sshd(tmp_path):
    paths = write_job(tmp_path, {"sagemaker_mpi_enabled": "true",
                                 "sagemaker_mpi_num_of_processes_per_host": "2"},
                      hosts=("algo-1", "algo-2"), script="")  # fmt: skip
    job = load_environment(paths, {}, num_gpus=0, num_cpus=2)
    over_ssh = Launch(job, {})
    assert over_ssh.over_ssh and "plm_rsh_agent" not in over_ssh.mpirun_argv()
    launch = Launch(job, {"SHOAL_RSH_AGENT": "/py -m shoal.slurm.agent"})
    assert not launch.over_ssh  # no sshd started, none waited for on port 22
    argv = launch.mpirun_argv()
    i = argv.index("plm_rsh_agent")
    assert argv[i - 1:i + 2] == ["-mca", "plm_rsh_agent", "/py -m shoal.slurm.agent"]


def test_launcher_log_lines_name_their_host(tmp_path):
    # No SHOAL_HOST (as on SageMaker): the host comes from the resource configuration.
    write_job(tmp_path, {}, host="algo-3", hosts=("algo-3",), script="print('from the script')\n")
    env = {k: v for k, v in os.environ.items() if k != "SHOAL_HOST"}
    done = subprocess.run([sys.executable, "-m", "shoal.launcher.entrypoint"],
                          env={**env, "SAGEMAKER_BASE_DIR": str(tmp_path)},
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    launcher = [ln for ln in done.stderr.splitlines() if " shoal.launcher" in ln]
    assert launcher, done.stderr
    assert all(ln.startswith("[algo-3] ") for ln in launcher), launcher


def test_the_launcher_and_local_runner_import_no_heavy_libraries():
    # Every host and rank pays for these imports before the user's first line runs.
    code = ("import sys, shoal.launcher.entrypoint, shoal.launcher.rank, shoal.launcher.simulate,"
            " shoal.local.runner\n"
            "print(sorted({m.split('.')[0] for m in sys.modules}"
            " & {'boto3', 'botocore', 'torch', 'tensorflow', 'numpy', 'rich', 'jinja2'}))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
