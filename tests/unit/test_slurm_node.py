"""One node's part of a Slurm job: its host name, and Slurm's variables kept from Open MPI."""

from __future__ import annotations

import os

from shoal.slurm import hosts, node


def test_the_node_id_names_the_host_and_slurms_variables_move_aside():
    environ = {"SLURM_NODEID": "1", "SLURM_JOB_ID": "77", "SLURMD_NODENAME": "node2",
               "SLURM_JOB_NODELIST": "node[1-2]", "PMIX_RANK": "1", "PATH": "/bin"}
    assert node.host_of(environ) == "algo-2"
    env = node.launcher_environment(environ)
    assert env == {"PATH": "/bin", "SHOAL_SLURM_JOB_ID": "77", "SHOAL_SLURM_NODE": "node2"}


def test_the_job_hosts_file_names_each_host_at_its_nodes_address():
    text = hosts.hosts_file(["algo-1", "algo-2"], ["10.0.0.5", "10.0.0.9"])
    assert text.splitlines()[-2:] == ["10.0.0.5\talgo-1", "10.0.0.9\talgo-2"]
    assert "127.0.0.1\tlocalhost" in text


def test_one_task_per_node_labelled_and_the_others_given_time_after_the_first_ends(tmp_path):
    argv = hosts.srun_argv(3, tmp_path, "/venv/bin/python", 15.0)
    assert argv[:7] == ["srun", "--nodes=3", "--ntasks=3", "--ntasks-per-node=1",
                        "--kill-on-bad-exit=0", "--wait=15", "--label"]
    assert argv[-4:] == ["-u", "-m", "shoal.slurm.node", str(tmp_path)]


def test_labelled_lines_go_to_their_host(tmp_path):
    import io

    seen = []
    pipe = io.BytesIO(b"0: first\n 1: second\nsrun: error: node2: task 1: Exited\n")
    hosts._relay(pipe, ["algo-1", "algo-2"], lambda h, line: seen.append((h, line))).join(5)
    assert seen == [("algo-1", "first"), ("algo-2", "second"),
                    ("algo-1", "srun: error: node2: task 1: Exited")]


def test_root_binds_opt_ml_and_runs_train_in_place_of_the_shell(tmp_path):
    argv, env = node.host_command(tmp_path, "algo-2", {"SLURM_JOB_ID": "5"}, privileged=True,
                                  opt_ml=True, python="/py")
    assert argv[:2] == ["unshare", "--mount"] and "--user" not in argv
    script = argv[-1].split("; ")
    assert f"mount --bind {tmp_path / 'algo-2'} /opt/ml" in script
    assert f"mount --bind {tmp_path / 'hosts'} /etc/hosts" in script
    assert script[-1] == "exec /py -m shoal.launcher.entrypoint"
    assert "SAGEMAKER_BASE_DIR" not in env and env["SHOAL_SLURM_JOB_ID"] == "5"


def test_a_user_is_root_in_a_user_namespace_to_mount_then_runs_train_as_the_user(tmp_path):
    argv, env = node.host_command(tmp_path, "algo-2", {}, privileged=False, opt_ml=True,
                                  python="/py")
    assert argv[:3] == ["unshare", "--user", "--map-root-user"]
    script = argv[-1].split("; ")
    assert f"mount --bind {tmp_path / 'algo-2'} /opt/ml" in script
    # the shell stays in the namespaces' user namespace for the agent; train is the user
    assert script[-1] == (f"unshare --user --map-user={os.getuid()} --map-group={os.getgid()} "
                          "/py -m shoal.launcher.entrypoint")


def test_a_user_on_a_node_without_opt_ml_gets_the_tree_by_sagemaker_base_dir(tmp_path):
    argv, env = node.host_command(tmp_path, "algo-2", {}, privileged=False, opt_ml=False,
                                  python="/py")
    assert not any("/opt/ml" in step for step in argv[-1].split("; "))
    assert env["SAGEMAKER_BASE_DIR"] == str(tmp_path / "algo-2")
