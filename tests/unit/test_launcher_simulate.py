"""Simulated hosts: per-host environment and the rsh agent."""

import os
import subprocess
import sys

from shoal.launcher.simulate import agent_command, host_environment


def test_host_environment(tmp_path):
    env = host_environment(str(tmp_path), "algo-2", {"KEEP": "1", "SHOAL_HOST": "algo-1"})
    assert env == {"KEEP": "1", "SHOAL_HOST": "algo-2", "SHOAL_MASTER_ADDR": "127.0.0.1",
                   "SAGEMAKER_BASE_DIR": str(tmp_path / "algo-2"),
                   "SHOAL_SIMULATED_ROOT": str(tmp_path)}  # fmt: skip


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
