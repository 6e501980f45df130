"""Runner precedence and the non-MPI command lines."""

import pytest
from shoal.errors import DistributionError
from shoal.launcher.runners import (
    Distribution,
    Runner,
    choose_runner,
    entry_point_kind,
    multi_worker_mirrored_tf_config,
    parameter_server_tf_config,
    simulated_tf_addresses,
    torchrun_argv,
    user_command,
)


@pytest.mark.parametrize("params, hosts, expected", [
    ({}, 1, Runner.PROCESS),
    ({}, 2, Runner.PROCESS),
    ({"sagemaker_mpi_enabled": True}, 1, Runner.MPI),
    ({"sagemaker_mpi_enabled": True, "sagemaker_distributed_dataparallel_enabled": True}, 2,
     Runner.MPI),
    ({"sagemaker_pytorch_ddp_enabled": True}, 2, Runner.DATAPARALLEL),
    ({"sagemaker_distributed_dataparallel_enabled": True}, 1, Runner.DATAPARALLEL),
    ({"sagemaker_distributed_dataparallel_enabled": True,
      "sagemaker_torch_distributed_enabled": True}, 2, Runner.DATAPARALLEL),
    ({"sagemaker_torch_distributed_enabled": True}, 2, Runner.TORCH_DISTRIBUTED),
    ({"sagemaker_parameter_server_enabled": True, "sagemaker_mpi_enabled": True}, 2,
     Runner.PARAMETER_SERVER),
    ({"sagemaker_parameter_server_enabled": True}, 1, Runner.PROCESS),
    ({"sagemaker_multi_worker_mirrored_strategy_enabled": True}, 2, Runner.PROCESS),
    ({"sagemaker_mpi_enabled": "true"}, 1, Runner.MPI),
    ({"sagemaker_mpi_enabled": "false"}, 1, Runner.PROCESS),
])  # fmt: skip
def test_precedence(params, hosts, expected):
    assert choose_runner(Distribution.from_params(params), hosts) is expected


def test_hosts_outside_the_distribution_groups_run_one_process():
    dist = Distribution.from_params({"sagemaker_mpi_enabled": True})
    assert choose_runner(dist, 3, in_distribution=False) is Runner.PROCESS


def test_processes_per_host_default_and_override():
    assert Distribution().ranks_per_host(num_gpus=0) == 1
    assert Distribution().ranks_per_host(num_gpus=8) == 8
    dist = Distribution.from_params({"sagemaker_mpi_num_of_processes_per_host": "2"})
    assert dist.ranks_per_host(num_gpus=8) == 2


def test_bad_process_count_is_reported():
    with pytest.raises(DistributionError, match=r"'processes_per_host' must be >= 1 \(got 0\)"):
        Distribution.from_params({"sagemaker_mpi_num_of_processes_per_host": 0})
    with pytest.raises(DistributionError, match="expected an integer"):
        Distribution.from_params({"sagemaker_mpi_num_processes": "many"})


def test_torchrun_single_and_multi_node():
    assert torchrun_argv(["algo-1"], "algo-1", 8, "train.py", ["--lr", "1"]) == [
        "torchrun", "--nnodes", "1", "--nproc_per_node", "8", "train.py", "--lr", "1"]
    assert torchrun_argv(["algo-1", "algo-2"], "algo-2", 4, "train.py", []) == [
        "torchrun", "--nnodes", "2", "--nproc_per_node", "4", "--master_addr", "algo-1",
        "--master_port", "7777", "--node_rank", "1", "train.py"]
    with pytest.raises(DistributionError, match="Python script"):
        torchrun_argv(["algo-1"], "algo-1", 1, "train.sh", [])


def test_parameter_server_tf_config():
    hosts = ["algo-1", "algo-2", "algo-3"]
    assert parameter_server_tf_config(hosts, "algo-1") == {
        "cluster": {"master": ["algo-1:2222"], "ps": ["algo-1:2223", "algo-2:2223", "algo-3:2223"],
                    "worker": ["algo-2:2222", "algo-3:2222"]},
        "environment": "cloud", "task": {"index": 0, "type": "master"}}
    assert parameter_server_tf_config(hosts, "algo-3")["task"] == {"index": 1, "type": "worker"}
    assert parameter_server_tf_config(hosts, "algo-2", ps_task=True)["task"] == {
        "index": 1, "type": "ps"}


def test_multi_worker_mirrored_tf_config():
    assert multi_worker_mirrored_tf_config(["algo-1", "algo-2"], "algo-2") == {
        "cluster": {"worker": ["algo-1:8890", "algo-2:8890"]}, "environment": "cloud",
        "task": {"index": 1, "type": "worker"}}


def test_simulated_hosts_get_an_address_per_task_and_parameter_server():
    ports = iter(range(41000, 41100))
    table = simulated_tf_addresses(["algo-1", "algo-2"], lambda: next(ports))
    assert table == {"algo-1": {"task": "127.0.0.1:41000", "ps": "127.0.0.1:41001"},
                     "algo-2": {"task": "127.0.0.1:41002", "ps": "127.0.0.1:41003"}}
    ps = parameter_server_tf_config(["algo-1", "algo-2"], "algo-2", table=table)
    assert ps["cluster"] == {"master": ["127.0.0.1:41000"],
                             "ps": ["127.0.0.1:41001", "127.0.0.1:41003"],
                             "worker": ["127.0.0.1:41002"]}
    assert ps["task"] == {"index": 0, "type": "worker"}
    mwms = multi_worker_mirrored_tf_config(["algo-1", "algo-2"], "algo-1", table)
    assert mwms["cluster"] == {"worker": ["127.0.0.1:41000", "127.0.0.1:41002"]}


def test_user_command_kinds(tmp_path):
    assert entry_point_kind(str(tmp_path), "train.py") == "program"
    assert entry_point_kind(str(tmp_path), "train.sh") == "command"
    (tmp_path / "setup.py").write_text("")
    assert entry_point_kind(str(tmp_path), "train.py") == "package"
    py = ["/usr/bin/python3", "-m", "mpi4py"]
    assert user_command("program", "train.py", ["--a", "1"], py) == [*py, "train.py", "--a", "1"]
    assert user_command("package", "train.py", [], py) == [*py, "-m", "train"]
    assert user_command("command", "train.sh", ["--msg", "a b"], py) == [
        "/bin/sh", "-c", "./train.sh --msg 'a b'"]
