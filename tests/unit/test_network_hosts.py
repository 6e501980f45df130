"""What a namespaced host runs, as data: its script (hostname, /opt/ml, sshd, train), its
environment (the simulation's switches gone, mpirun's ssh with the job's key), the job's SSH
material, and the buildah command of a host inside an image."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from shoal.launcher import simulate
from shoal.local.network import hosts


def test_the_host_script_names_the_host_mounts_its_tree_starts_sshd_then_train(tmp_path):
    script = hosts.host_script("algo-2", tmp_path / "algo-2", "/venv/bin/python",
                               keys=tmp_path / "ssh")
    steps = script.split("; ")
    assert steps[0] == "set -e"
    assert steps[1] == "hostname algo-2"
    assert steps[2] == f"mount --bind {tmp_path / 'algo-2'} /opt/ml"
    assert steps[-2] == f"/usr/sbin/sshd -f {tmp_path / 'ssh' / 'sshd_config'}"
    assert steps[-1] == "exec /venv/bin/python -m shoal.launcher.entrypoint"


def test_a_cluster_node_binds_the_jobs_hosts_file_and_starts_no_sshd_without_keys(tmp_path):
    script = hosts.host_script("algo-2", tmp_path / "algo-2", "/venv/bin/python",
                               hosts_file=tmp_path / "hosts")
    steps = script.split("; ")
    assert steps[3] == f"mount --bind {tmp_path / 'hosts'} /etc/hosts"
    assert not any("sshd" in step for step in steps)
    assert steps[-1] == "exec /venv/bin/python -m shoal.launcher.entrypoint"


def test_a_host_takes_the_real_path_not_the_simulation(tmp_path):
    base = {simulate.SIMULATED_ROOT_ENV: "/jobs/x", "SAGEMAKER_BASE_DIR": "/jobs/x/algo-1",
            "SHOAL_HOST": "algo-1", "SHOAL_MASTER_ADDR": "127.0.0.1", "KEEP": "1"}
    env = hosts.host_environment(base, tmp_path)
    assert not set(base) - {"KEEP"} & set(env)
    assert env["KEEP"] == "1"
    assert env["OMPI_MCA_plm_rsh_agent"].startswith(f"ssh -i {tmp_path / 'id'} ")
    assert "StrictHostKeyChecking=no" in env["OMPI_MCA_plm_rsh_agent"]
    assert (env["SHOAL_STATUS_LINGER"], env["SHOAL_FAILURE_GRACE"]) == ("5", "5")
    assert hosts.host_environment({"SHOAL_STATUS_LINGER": "30"}, tmp_path)["SHOAL_STATUS_LINGER"] == "30"


@pytest.mark.skipif(shutil.which("ssh-keygen") is None, reason="OpenSSH's ssh-keygen is not installed")
def test_the_jobs_keys_and_sshd_config(tmp_path):
    folder = hosts.make_keys(tmp_path)
    assert (folder / "authorized_keys").read_text() == (folder / "id.pub").read_text()
    config = (folder / "sshd_config").read_text().splitlines()
    assert f"HostKey {folder / 'host_key'}" in config
    assert "PasswordAuthentication no" in config and "PermitRootLogin prohibit-password" in config
    assert oct(folder.stat().st_mode & 0o777) == "0o700"


def test_a_host_inside_an_image_is_a_buildah_run_of_its_entrypoint():
    image = hosts.Image("localhost/shoal-pytorch-training:1.13.1-cpu-py39",
                        ("buildah", "--storage-driver", "vfs"), {"MY_SETTING": "x"})
    argv = image.run_argv("algo-2", "ctr-2", Path("/jobs/j/algo-2"))
    assert argv[:4] == ["buildah", "--storage-driver", "vfs", "run"]
    assert argv[argv.index("--network") + 1] == "host"  # the namespace it is run from
    assert argv[argv.index("--hostname") + 1] == "algo-2"
    assert argv[argv.index("--volume") + 1] == "/jobs/j/algo-2:/opt/ml"
    assert argv[argv.index("--env") + 1] == "MY_SETTING=x"
    assert argv[argv.index("ctr-2"):] == ["ctr-2", "--", "/usr/local/bin/shoal-entrypoint", "train"]
