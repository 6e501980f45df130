"""mpirun's way to another node of a Slurm job: a step of the job (srun --overlap on the host's
node), which enters that host's namespaces with the host's environment; and what the Slurm
hosts' launcher is told (the agent, no sshd)."""

from __future__ import annotations

import subprocess
import time

import psutil
import pytest
from shoal.launcher.mpi import RSH_AGENT_ENV
from shoal.slurm import agent, hosts

ORTED = ["orted", "-mca", "ess", '"env"', "-mca", "orte_tmpdir_base", "/tmp/x", "--daemonize"]


def job_env(tmp_path):
    agent.write_nodes(tmp_path, {"algo-1": "node1", "algo-2": "node7"})
    return {agent.JOB_ROOT_ENV: str(tmp_path), agent.JOB_ID_ENV: "41"}


def test_the_agent_starts_the_daemon_as_an_overlapping_step_on_the_hosts_node(tmp_path):
    argv = agent.launch(["algo-2", *ORTED], job_env(tmp_path), python="/venv/bin/python")
    assert argv[:6] == ["srun", "--jobid=41", "--overlap", "--nodes=1", "--ntasks=1",
                        "--nodelist=node7"]
    assert "--chdir=/" in argv and "--input=none" in argv  # the node has no /opt/ml/code outside
    tail = argv.index("--enter")
    assert argv[tail - 4:tail] == ["/venv/bin/python", "-u", "-m", "shoal.slurm.agent"]
    assert argv[tail + 1:] == ["algo-2", *ORTED]


def test_the_agent_refuses_an_unknown_host_or_a_process_outside_a_slurm_job(tmp_path):
    with pytest.raises(agent.AgentError, match="algo-3 is not a host of this job"):
        agent.launch(["algo-3", "orted"], job_env(tmp_path))
    with pytest.raises(agent.AgentError, match="not a Slurm job's host"):
        agent.launch(["algo-2", "orted"], {})
    with pytest.raises(agent.AgentError, match="usage"):
        agent.launch(["algo-2"], job_env(tmp_path))


def test_entering_forks_into_the_hosts_pid_namespace_and_keeps_the_daemon_in_the_foreground():
    argv = agent.enter_argv(1234, ORTED)
    assert argv[:6] == ["nsenter", "--target=1234", "--mount", "--uts", "--pid", "--"]
    assert argv[6:8] == ["/bin/sh", "-c"]
    assert "--daemonize" not in argv[8] and argv[8].startswith("orted -mca ess")


def test_a_users_daemon_joins_the_user_namespace_then_is_the_user_again():
    argv = agent.enter_argv(1234, ORTED, run_as=(1000, 100))
    assert argv[:5] == ["nsenter", "--target=1234", "--user", "--preserve-credentials", "--mount"]
    i = argv.index("--")
    assert argv[i + 1:i + 5] == ["unshare", "--user", "--map-user=1000", "--map-group=100"]
    assert argv[i + 5:i + 7] == ["/bin/sh", "-c"]


def test_the_namespaces_are_found_as_the_child_of_the_nodes_unshare(tmp_path):
    maker = subprocess.Popen(["unshare", "--fork", "sleep", "30"])  # no namespace: no root
    try:
        agent.write_pid(tmp_path, "algo-2", maker.pid)
        pid = agent.namespace_process(tmp_path, "algo-2", timeout=10)
        assert psutil.Process(pid).ppid() == maker.pid
        # the child may not have exec'd yet: the pid is what the agent needs, and it becomes sleep
        deadline = time.monotonic() + 10
        while psutil.Process(pid).cmdline()[0] != "sleep" and time.monotonic() < deadline:
            time.sleep(0.01)
        assert psutil.Process(pid).cmdline()[0] == "sleep"
    finally:
        maker.kill()
        maker.wait()


def test_a_host_whose_namespaces_are_gone_is_named(tmp_path):
    agent.write_pid(tmp_path, "algo-2", 2 ** 22 + 7)  # above any pid_max default
    start = time.monotonic()
    with pytest.raises(agent.AgentError, match="algo-2's namespaces are not running"):
        agent.namespace_process(tmp_path, "algo-2", timeout=0.3)
    assert time.monotonic() - start < 5


def test_the_daemon_gets_the_hosts_environment_and_its_step(tmp_path, monkeypatch):
    monkeypatch.setattr(agent, "namespace_process", lambda root, host: 99)
    monkeypatch.setattr(agent, "host_environ", lambda pid: {"SM_CURRENT_HOST": "algo-2"})
    monkeypatch.setattr(agent, "own_user_namespace", lambda pid: False)
    argv, env = agent.enter(["algo-2", "orted"], {agent.JOB_ROOT_ENV: str(tmp_path),
                                                   "SLURM_JOB_ID": "41", "SLURM_STEP_ID": "3"})
    assert env == {"SM_CURRENT_HOST": "algo-2", agent.STEP_ENV: "41.3"}
    assert argv[1] == "--target=99"


def test_the_slurm_hosts_use_the_agent_and_keep_the_real_path(tmp_path):
    env = hosts.slurm_environment({"SHOAL_SIMULATED_ROOT": "/x", "KEEP": "1"}, tmp_path, "/py")
    assert env[RSH_AGENT_ENV] == "/py -m shoal.slurm.agent"
    assert env[agent.JOB_ROOT_ENV] == str(tmp_path)
    assert "SHOAL_SIMULATED_ROOT" not in env and env["KEEP"] == "1"
    assert "OMPI_MCA_plm_rsh_agent" not in env  # the launcher passes the agent to mpirun
