"""The advisor's checks of the job description, each tip or pitfall as a tested check."""

import pytest
from shoal.inputs import TrainingInput
from shoal.planning import advisor, job_checks

from tests.unit.test_planning_advisor import codes, only, pytorch, smp

# ---------------------------------------------------------------- data parallel


def test_data_parallel_on_one_host():
    finding = only(advisor.advise(pytorch(instance_count=1)), "SHOAL-DP001")
    assert finding.severity == "info"  # 8 GPUs: NVLink helps, the library is still usable
    assert "two or more nodes" in finding.message and "NVLink" in finding.message
    assert finding.source == "Single Versus Multiple Nodes"
    single_gpu = advisor.advise(pytorch(instance_count=1, instance_type="ml.p3.2xlarge"))
    assert only(single_gpu, "SHOAL-DP001").severity == "warning"
    assert "SHOAL-DP001" not in codes(advisor.advise(pytorch(instance_count=2)))


@pytest.mark.parametrize("image, major", [
    ("1.dkr.ecr.us-west-2.amazonaws.com/pt:2.0.1-gpu-py310-cu121-ubuntu20.04", 12),
    ("1.dkr.ecr.us-west-2.amazonaws.com/pt:1.8.1-gpu-py36-cu102", 10),
    ("1.dkr.ecr.us-west-2.amazonaws.com/pt:1.12.1-gpu-py38-cu113", 11),
    ("nvidia/cuda:12.1.0-devel-ubuntu22.04", 12),
    ("myrepo/cuda11.8-train:latest", 11),
    ("1.dkr.ecr.us-west-2.amazonaws.com/shoal-pytorch-training:1.13.1-gpu-py39", 11),
    ("1.dkr.ecr.us-west-2.amazonaws.com/my-training:latest", None),
])
def test_image_cuda_major(image, major):
    assert job_checks.image_cuda_major(image) == major


def test_data_parallel_image_that_is_not_cuda_11_is_an_error():
    est = pytorch(image_uri="1.dkr.ecr.us-west-2.amazonaws.com/pt:1.8.1-gpu-py36-cu102")
    finding = only(advisor.advise(est), "SHOAL-DP002")
    assert finding.severity == "error"
    assert "CUDA 10" in finding.message and "only CUDA 11" in finding.message
    ok = pytorch(image_uri="1.dkr.ecr.us-west-2.amazonaws.com/pt:1.12.1-gpu-py38-cu113")
    assert "SHOAL-DP002" not in codes(advisor.advise(ok))
    assert "SHOAL-DP002" not in codes(advisor.advise(pytorch()))  # Shoal's own image


def test_an_image_without_a_cuda_mark_is_flagged_as_unknown():
    est = pytorch(image_uri="1.dkr.ecr.us-west-2.amazonaws.com/my-training:latest")
    finding = only(advisor.advise(est), "SHOAL-DP002")
    assert finding.severity == "info" and "cannot tell the CUDA version" in finding.message


def test_multi_node_s3_file_mode_suggests_fsx():
    finding = only(advisor.advise(pytorch(), "s3://data-us-west-2/train"), "SHOAL-DP005")
    assert finding.severity == "info"
    assert "FSx for Lustre" in finding.fix and "FastFile" in finding.fix
    fast = TrainingInput("s3://data-us-west-2/train", input_mode="FastFile")
    assert "SHOAL-DP005" not in codes(advisor.advise(pytorch(), fast))
    assert "SHOAL-DP005" not in codes(advisor.advise(pytorch(input_mode="Pipe"),
                                                     "s3://data-us-west-2/train"))


def test_dataset_hints_size_fsx_through_the_planner():
    findings = advisor.advise(pytorch(instance_count=4), "s3://data-us-west-2/train",
                              dataset_gb=100, epoch_seconds=30)
    assert only(findings, "SHOAL-DP005").severity == "warning"
    plan = only(findings, "SHOAL-DP006")
    assert "about 3.3 GB/s" in plan.message
    assert "SCRATCH_2 at its minimum 1.2 TiB gives 240 MB/s" in plan.message
    assert "16.8 TiB of SCRATCH_2 (3360 MB/s)" in plan.fix
    assert "after the first epoch" in plan.fix


def test_batch_size_and_learning_rate_scaling():
    est = pytorch(instance_count=4, hyperparameters={"batch-size": 64, "learning_rate": "0.01"})
    finding = only(advisor.advise(est), "SHOAL-DP008")
    assert finding.severity == "info"
    assert finding.message == ("the global batch is 2048 (batch-size=64 x 32 processes): with "
                               "learning_rate=0.01 tuned for a batch of 64, the linear scaling "
                               "rule gives 0.32")
    assert "warm-up" in finding.fix
    assert "SHOAL-DP008" not in codes(advisor.advise(pytorch(hyperparameters={"epochs": 3})))


def test_mpi_processes_per_host_count_for_the_global_batch():
    dist = {"mpi": {"enabled": True, "processes_per_host": 2}}
    est = pytorch(distribution=dist, hyperparameters={"batch_size": 16, "lr": 0.1})
    assert "x 4 processes" in only(advisor.advise(est), "SHOAL-DP008").message
    # a job file's processes_per_host travels as the launcher's hyperparameter
    est = pytorch(hyperparameters={"batch_size": 16, "lr": 0.1,
                                   "sagemaker_mpi_num_of_processes_per_host": 3})
    assert "x 6 processes" in only(advisor.advise(est), "SHOAL-DP008").message


@pytest.mark.parametrize("options, severity", [
    ("-verbose -x NCCL_DEBUG=VERSION", "info"),
    ("-x NCCL_DEBUG=INFO", "warning"),
    ("-x FI_EFA_USE_DEVICE_RDMA=1", None),
])
def test_custom_mpi_options(options, severity):
    dist = {"smdistributed": {"dataparallel": {"enabled": True, "custom_mpi_options": options}}}
    findings = advisor.advise(pytorch(distribution=dist))
    if severity is None:
        assert "SHOAL-DP009" not in codes(findings)
    else:
        assert only(findings, "SHOAL-DP009").severity == severity


def test_disabled_profiler_on_a_multi_node_job_suggests_debugger_rules():
    finding = only(advisor.advise(pytorch(disable_profiler=True)), "SHOAL-DP010")
    for rule in ("CPUBottleneck", "LoadBalancing", "LowGPUUtilization"):
        assert rule in finding.fix
    one_node = pytorch(disable_profiler=True, instance_count=1)
    assert "SHOAL-DP010" not in codes(advisor.advise(one_node))


# ---------------------------------------------------------------- model parallel


def test_microbatches_must_divide_the_batch_size():
    est = smp({"partitions": 2, "microbatches": 3}, hyperparameters={"batch_size": 32})
    finding = only(advisor.advise(est), "SHOAL-MP001")
    assert finding.severity == "error"
    assert finding.message == "microbatches (3) does not divide the batch size (32)"
    assert "[1, 2, 4, 8, 16, 32]" in finding.fix
    fine = smp({"partitions": 2, "microbatches": 4}, hyperparameters={"batch_size": 32})
    assert not [c for c in codes(advisor.advise(fine)) if c.startswith("SHOAL-MP")]


def test_last_batch_against_microbatches_with_a_dataset_size():
    est = smp({"partitions": 2, "microbatches": 4}, hyperparameters={"batch_size": 32})
    finding = only(advisor.advise(est, dataset_size=1002), "SHOAL-MP002")  # last batch: 10
    assert finding.message == ("the epoch's last batch holds 10 samples, not divisible by 4 "
                               "microbatches")
    assert "drop_last=True" in finding.fix
    assert "SHOAL-MP002" not in codes(advisor.advise(est, dataset_size=1000))  # last batch: 8


def test_microbatch_starting_point():
    for count in (1, 64):
        est = smp({"partitions": 2, "microbatches": count}, hyperparameters={"batch_size": 128})
        finding = only(advisor.advise(est), "SHOAL-MP003")
        assert "start with 2 or 4 microbatches" in finding.fix
    tiny = smp({"partitions": 2, "microbatches": 8}, hyperparameters={"batch_size": 8})
    assert "SHOAL-MP003" in codes(advisor.advise(tiny))  # microbatches of one sample
