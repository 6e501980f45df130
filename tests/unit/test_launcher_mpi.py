"""The mpirun argv equals the training toolkit's tokens for the same configuration."""

import pytest
from shoal.errors import DistributionError
from shoal.launcher.mpi import (
    MpiPlan,
    dataparallel_argv,
    mpi_argv,
    parse_custom_mpi_options,
)

COMMAND = ["/usr/bin/python3", "-m", "mpi4py", "train.py", "-v", "--lr", "35"]
PRELOAD = "/libchangehostname.so"


def dp_expected(hosts, np, iface, flag, extra=(), efa=(), server=(), preload=True):
    return [
        "mpirun", "--host", hosts, "-np", str(np), "--allow-run-as-root", "--tag-output",
        "--oversubscribe",
        "-mca", "btl_tcp_if_include", iface, "-mca", "oob_tcp_if_include", iface,
        "-mca", "plm_rsh_no_tree_spawn", "1", "-mca", "pml", "ob1", "-mca", "btl", "^openib",
        "-mca", "orte_abort_on_non_zero_status", "1",
        "-mca", "btl_vader_single_copy_mechanism", "none",
        "-mca", "plm_rsh_num_concurrent", str(hosts.count(",") + 1),
        "-x", f"NCCL_SOCKET_IFNAME={iface}", "-x", "NCCL_DEBUG=INFO",
        "-x", "LD_LIBRARY_PATH", "-x", "PATH", "-x", flag,
        "-x", "FI_PROVIDER=efa", "-x", "RDMAV_FORK_SAFE=1",
        *(["-x", f"LD_PRELOAD={PRELOAD}"] if preload else []),
        *extra, *efa, *server, "shoal-rank", *COMMAND,
    ]  # fmt: skip


def mpi_expected(hosts, np, iface, nccl_debug="INFO", extra=(), efa=(), names=()):
    env = [tok for name in names for tok in ("-x", name)]
    return [
        "mpirun", "--host", hosts, "-np", str(np), "--allow-run-as-root", "--display-map",
        "--tag-output",
        "-mca", "btl_tcp_if_include", iface, "-mca", "oob_tcp_if_include", iface,
        "-mca", "plm_rsh_no_tree_spawn", "1", "-bind-to", "none", "-map-by", "slot",
        "-mca", "pml", "ob1", "-mca", "btl", "^openib",
        "-mca", "orte_abort_on_non_zero_status", "1",
        "-mca", "btl_vader_single_copy_mechanism", "none",
        "-x", "NCCL_MIN_NRINGS=4", "-x", f"NCCL_SOCKET_IFNAME={iface}",
        "-x", f"NCCL_DEBUG={nccl_debug}", "-x", "LD_LIBRARY_PATH", "-x", "PATH",
        "-x", f"LD_PRELOAD={PRELOAD}", *extra, *efa, *env, "shoal-rank", *COMMAND,
    ]  # fmt: skip


SERVER_P3 = ["-x", "SMDATAPARALLEL_SERVER_ADDR=algo-1", "-x", "SMDATAPARALLEL_SERVER_PORT=7592",
             "-x", "SAGEMAKER_INSTANCE_TYPE=ml.p3.16xlarge"]  # fmt: skip


def test_dataparallel_multi_node_matches_toolkit_test_case():
    # The toolkit's own multi-node case: 2 hosts x 8, ethw3, ml.p3.16xlarge, "--verbose".
    plan = MpiPlan(hosts=["algo-1", "algo-2"], processes_per_host=8, network_interface="ethw3",
                   instance_type="ml.p3.16xlarge", custom_mpi_options="--verbose",
                   preload=PRELOAD)  # fmt: skip
    assert dataparallel_argv(plan, COMMAND) == dp_expected(
        "algo-1:8,algo-2:8", 16, "ethw3", "SMDATAPARALLEL_USE_HOMOGENEOUS=1",
        extra=["--verbose"], server=SERVER_P3)


@pytest.mark.parametrize(
    "hosts, ppn, itype, custom, host_token, np, flag, extra, efa",
    [
        (["algo-1"], 1, "ml.p3.2xlarge", "", "algo-1", 1, "SINGLENODE", [], []),
        (["algo-1"], 2, "ml.g5.12xlarge", "", "algo-1", 2, "SINGLENODE", [], []),
        (["algo-1"], 8, "ml.p4d.24xlarge", "--verbose", "algo-1", 8, "SINGLENODE", ["--verbose"],
         ["-x", "NCCL_PROTO=simple", "-x", "FI_EFA_USE_DEVICE_RDMA=1"]),
        (["algo-1"], 8, "ml.p5.48xlarge", "", "algo-1", 8, "SINGLENODE", [],
         ["-x", "NCCL_PROTO=simple"]),
        (["algo-1", "algo-2"], 1, "ml.g4dn.12xlarge", "", "algo-1:1,algo-2:1", 2, "HOMOGENEOUS",
         [], ["-x", "NCCL_PROTO=simple"]),
        (["algo-1", "algo-2"], 2, "ml.p3dn.24xlarge", "-verbose -x NCCL_DEBUG=VERSION",
         "algo-1:2,algo-2:2", 4, "HOMOGENEOUS", ["-verbose", "-x", "NCCL_DEBUG=VERSION"],
         ["-x", "NCCL_PROTO=simple"]),
        (["algo-1", "algo-2", "algo-3"], 8, "ml.p4de.24xlarge", "", "algo-1:8,algo-2:8,algo-3:8",
         24, "HOMOGENEOUS", [], ["-x", "NCCL_PROTO=simple", "-x", "FI_EFA_USE_DEVICE_RDMA=1"]),
        (["algo-1", "algo-2"], 8, "ml.trn1.32xlarge", "", "algo-1:8,algo-2:8", 16, "HOMOGENEOUS",
         [], ["-x", "NCCL_PROTO=simple", "-x", "FI_EFA_USE_DEVICE_RDMA=1"]),
    ],
)
def test_dataparallel_table(hosts, ppn, itype, custom, host_token, np, flag, extra, efa):
    plan = MpiPlan(hosts=hosts, processes_per_host=ppn, network_interface="eth0",
                   instance_type=itype, custom_mpi_options=custom, preload=PRELOAD)  # fmt: skip
    server = []
    if len(hosts) > 1:
        server = ["-x", "SMDATAPARALLEL_SERVER_ADDR=algo-1",
                  "-x", "SMDATAPARALLEL_SERVER_PORT=7592",
                  "-x", f"SAGEMAKER_INSTANCE_TYPE={itype}"]  # fmt: skip
    expected = dp_expected(host_token, np, "eth0", f"SMDATAPARALLEL_USE_{flag}=1",
                           extra=extra, efa=efa, server=server)  # fmt: skip
    assert dataparallel_argv(plan, COMMAND) == expected


def test_mpi_matches_toolkit_test_case_without_credentials(monkeypatch):
    # The toolkit's case forwards AWS_ACCESS_KEY_ID when set: Shoal never does.
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIA")
    plan = MpiPlan(hosts=["algo-1", "algo-2"], processes_per_host=2, network_interface="ethw3",
                   instance_type="ml.p3.16xlarge", custom_mpi_options="-v --lr 35",
                   preload=PRELOAD, env_names=["LD_CONFIG_PATH"])  # fmt: skip
    assert mpi_argv(plan, COMMAND) == mpi_expected(
        "algo-1:2,algo-2:2", 4, "ethw3", extra=["-v", "--lr", "35"], names=["LD_CONFIG_PATH"])


@pytest.mark.parametrize(
    "hosts, ppn, num, itype, host_token, np, efa",
    [
        (["algo-1"], 1, None, "ml.c5.xlarge", "algo-1", 1, []),
        (["algo-1", "algo-2"], 1, None, "ml.p3.2xlarge", "algo-1,algo-2", 2, []),
        (["algo-1", "algo-2"], 2, None, "ml.g4dn.8xlarge", "algo-1:2,algo-2:2", 4,
         ["-x", "FI_PROVIDER=efa", "-x", "NCCL_PROTO=simple"]),
        (["algo-1", "algo-2"], 8, 12, "ml.p4d.24xlarge", "algo-1:8,algo-2:8", 12,
         ["-x", "FI_PROVIDER=efa", "-x", "NCCL_PROTO=simple", "-x", "FI_EFA_USE_DEVICE_RDMA=1"]),
        (["algo-1"], 8, None, "ml.p5.48xlarge", "algo-1:8", 8,
         ["-x", "FI_PROVIDER=efa", "-x", "NCCL_PROTO=simple"]),
    ],
)
def test_mpi_table(hosts, ppn, num, itype, host_token, np, efa):
    names = ["SM_HOSTS", "SM_CURRENT_HOST"]
    plan = MpiPlan(hosts=hosts, processes_per_host=ppn, num_processes=num, instance_type=itype,
                   custom_mpi_options="--NCCL_DEBUG WARN", preload=PRELOAD,
                   env_names=names)  # fmt: skip
    assert mpi_argv(plan, COMMAND) == mpi_expected(host_token, np, "eth0", nccl_debug="WARN",
                                                   efa=efa, names=names)  # fmt: skip


def test_credentials_in_custom_options_and_env_names_are_dropped(caplog):
    plan = MpiPlan(hosts=["algo-1"], processes_per_host=1, preload=None,
                   custom_mpi_options="-x AWS_SECRET_ACCESS_KEY -x AWS_SESSION_TOKEN=abc "
                                      "-x AWS_REGION -x NCCL_DEBUG=VERSION",
                   env_names=["AWS_ACCESS_KEY_ID", "SM_HOSTS"])  # fmt: skip
    for argv in (mpi_argv(plan, COMMAND), dataparallel_argv(plan, COMMAND)):
        joined = " ".join(argv)
        assert "AWS_SECRET_ACCESS_KEY" not in joined
        assert "AWS_SESSION_TOKEN" not in joined
        assert "AWS_ACCESS_KEY_ID" not in joined
        assert "-x AWS_REGION -x NCCL_DEBUG=VERSION" in joined
        assert "LD_PRELOAD" not in joined
    assert "AWS_SECRET_ACCESS_KEY" in caplog.text


def test_custom_options_nccl_debug_override_and_quotes():
    opts = parse_custom_mpi_options("--NCCL_DEBUG=TRACE -x FOO='a b' --mca btl_tcp_if_exclude lo")
    assert opts.nccl_debug == "TRACE"
    assert opts.extra == ("-x", "FOO=a b", "--mca", "btl_tcp_if_exclude", "lo")


def test_unbalanced_quotes_are_a_distribution_error():
    with pytest.raises(DistributionError, match="custom_mpi_options"):
        parse_custom_mpi_options("-x FOO='unterminated")


def test_processes_per_host_must_be_positive():
    with pytest.raises(DistributionError, match=r"'processes_per_host' must be >= 1 \(got 0\)"):
        MpiPlan(hosts=["algo-1"], processes_per_host=0)


def test_simulated_agent_goes_just_before_the_rank_wrapper():
    plan = MpiPlan(hosts=["algo-1", "algo-2"], processes_per_host=2, rsh_agent="py -m agent",
                   rank_wrapper="/venv/bin/shoal-rank")  # fmt: skip
    argv = mpi_argv(plan, COMMAND)
    i = argv.index("/venv/bin/shoal-rank")
    assert argv[i - 3:i] == ["-mca", "plm_rsh_agent", "py -m agent"]
    assert argv[i + 1:] == COMMAND
