"""Simulated hosts: per-host environment and the rsh agent."""

import os
import subprocess
import sys

from shoal.launcher.simulate import agent_command, host_environment, remote_command, tag_line


def test_host_environment(tmp_path):
    env = host_environment(str(tmp_path), "algo-2", {"KEEP": "1", "SHOAL_HOST": "algo-1"})
    assert env == {"KEEP": "1", "SHOAL_HOST": "algo-2", "SHOAL_MASTER_ADDR": "127.0.0.1",
                   "SAGEMAKER_BASE_DIR": str(tmp_path / "algo-2"),
                   "SHOAL_SIMULATED_ROOT": str(tmp_path),
                   "OMPI_MCA_rtc_hwloc_vmhole": "none"}  # fmt: skip


def test_agent_runs_the_remote_command_locally_as_the_target_host(tmp_path):
    env = {**os.environ, "SHOAL_SIMULATED_ROOT": str(tmp_path), "SHOAL_HOST": "algo-1"}
    argv = agent_command().split() + ["algo-2", " echo", "--daemonize",
                                      '"$SHOAL_HOST $SAGEMAKER_BASE_DIR"']  # fmt: skip
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"algo-2 {tmp_path / 'algo-2'}"


def test_agent_refuses_outside_a_simulated_job():
    env = {k: v for k, v in os.environ.items() if k != "SHOAL_SIMULATED_ROOT"}
    done = subprocess.run([sys.executable, "-m", "shoal.launcher.simulate", "algo-2", "true"],
                          env=env, capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode != 0 and "not a simulated job" in done.stderr


def test_remote_command_gives_the_host_its_own_session_directory():
    # mpirun repeats its own orte_tmpdir_base on the orted line, where it beats the environment.
    words = [" orted", "--daemonize", "-mca", "ess_base_vpid", "2",
             "-mca", "orte_tmpdir_base", '"/tmp/shoal-x/mpirun"', "-mca", "plm", '"rsh"']
    assert remote_command(words, "/tmp/shoal-x/algo 2") == [
        " orted", "-mca", "ess_base_vpid", "2",
        "-mca", "orte_tmpdir_base", "'/tmp/shoal-x/algo 2'", "-mca", "plm", '"rsh"']
    assert remote_command(words, None) == [w for w in words if w != "--daemonize"]


def test_agent_runs_orted_with_the_hosts_session_directory(tmp_path):
    session = tmp_path / "s"
    env = {**os.environ, "SHOAL_SIMULATED_ROOT": str(tmp_path), "SHOAL_SIMULATED_TMP": str(session)}
    argv = agent_command().split() + ["algo-2", " echo", "-mca", "orte_tmpdir_base",
                                      f'"{session}/mpirun"', "$OMPI_MCA_orte_tmpdir_base"]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    here = session / "algo-2"
    assert done.stdout.split() == ["-mca", "orte_tmpdir_base", str(here), str(here)]
    assert here.is_dir()


def test_tag_line_names_the_host_once():
    assert tag_line("algo-2", "Epoch 1 loss 0.5") == "[algo-2] Epoch 1 loss 0.5"
    assert tag_line("algo-2", "[algo-2] 2026-01-01 shoal.launcher INFO: x") == (
        "[algo-2] 2026-01-01 shoal.launcher INFO: x")
    # Rank output relayed by the master names the rank's own host already.
    assert tag_line("algo-1", "[1,mpirank:3,algo-2]<stdout>:hi") == "[1,mpirank:3,algo-2]<stdout>:hi"
    assert tag_line("algo-1", "[algo-2] not mine") == "[algo-1] [algo-2] not mine"
