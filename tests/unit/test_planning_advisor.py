"""The advisor: each tip or pitfall of the distributed libraries as a tested check, and
``fit()`` running it (logged once, strict mode, off)."""

import logging

import boto3
import pytest
import shoal
from botocore.stub import Stubber
from moto import mock_aws
from shoal.planning import advisor
from shoal import estimator as estimator_module
from shoal.errors import ValidationError
from shoal.inputs import FileSystemInput, TrainingInput

ROLE = "arn:aws:iam::123456789012:role/SageMakerRole"
REGION = "us-west-2"
SMDDP = {"smdistributed": {"dataparallel": {"enabled": True}}}


def session():
    return shoal.Session(boto_session=boto3.Session(region_name=REGION))


def pytorch(**changes):
    args = {"entry_point": "train.py", "role": ROLE, "instance_count": 2,
            "instance_type": "ml.p4d.24xlarge", "framework_version": "1.13.1",
            "py_version": "py39", "distribution": SMDDP, "sagemaker_session": session()}
    return shoal.PyTorch(**{**args, **changes})


def smp(parameters, **changes):
    distribution = {"smdistributed": {"modelparallel": {"enabled": True,
                                                        "parameters": parameters}},
                    "mpi": {"enabled": True, "processes_per_host": 8}}
    return pytorch(distribution=distribution, **changes)


def codes(findings):
    return [f.code for f in findings]


def only(findings, code):
    found = [f for f in findings if f.code == code]
    assert len(found) == 1, codes(findings)
    return found[0]


# ---------------------------------------------------------------- findings


def test_finding_is_frozen_and_validated():
    finding = advisor.Finding("SHOAL-DP001", "info", "m", "f", "s")
    with pytest.raises(AttributeError):
        finding.code = "x"
    with pytest.raises(ValueError, match="'severity' must be in"):
        advisor.Finding("SHOAL-DP001", "fatal", "m", "f", "s")
    assert finding.to_dict() == {"code": "SHOAL-DP001", "severity": "info", "message": "m",
                                 "fix": "f", "source": "s"}


def test_a_plain_job_has_no_findings():
    est = pytorch(distribution=None, instance_count=1, instance_type="ml.c5.xlarge")
    assert advisor.advise(est, "s3://sagemaker-us-west-2-123456789012/data") == []


def test_findings_are_sorted_errors_first():
    est = pytorch(instance_count=1, image_uri="r/x:1-cu102",
                  hyperparameters={"batch_size": 32, "lr": 0.1})
    severities = [f.severity for f in advisor.advise(est)]
    assert severities == sorted(severities, key=["error", "warning", "info"].index)
    assert severities[0] == "error"


def test_advise_refuses_what_is_not_an_estimator():
    with pytest.raises(TypeError, match="needs a Shoal estimator"):
        advisor.advise({"instance_count": 2})


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
    assert advisor.image_cuda_major(image) == major


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


@pytest.mark.parametrize("bucket, region", [
    ("data-eu-west-1", "eu-west-1"),
    ("sagemaker-us-west-2-123456789012", "us-west-2"),
    ("my.bucket.ap-southeast-2.archive", "ap-southeast-2"),
    ("arn:aws:s3:eu-central-1:123456789012:accesspoint/train", "eu-central-1"),
    ("training-data", None),
    ("bus-west-20", None),
])
def test_bucket_region_from_its_name(bucket, region):
    assert advisor.bucket_region_from_name(bucket) == region


def test_s3_input_in_another_region_is_an_error():
    findings = advisor.advise(pytorch(), {"train": "s3://data-eu-west-1/train",
                                          "test": "s3://data-us-west-2/test"})
    finding = only(findings, "SHOAL-DP003")
    assert finding.severity == "error"
    assert finding.message == ("channel 'train' reads S3 bucket 'data-eu-west-1' in eu-west-1, "
                               "but the job runs in us-west-2")


def test_access_point_arn_region():
    uri = "s3://arn:aws:s3:eu-central-1:123456789012:accesspoint/train/prefix/"
    finding = only(advisor.advise(pytorch(), uri), "SHOAL-DP003")
    assert "eu-central-1" in finding.message


def test_bucket_region_through_get_bucket_location():
    s3 = boto3.client("s3", region_name=REGION)
    with Stubber(s3) as stub:
        stub.add_response("get_bucket_location", {"LocationConstraint": "EU"},
                          {"Bucket": "training-data"})
        findings = advisor.advise(pytorch(), "s3://training-data/x", s3_client=s3)
    assert "in eu-west-1" in only(findings, "SHOAL-DP003").message
    with Stubber(s3) as stub:
        stub.add_response("get_bucket_location", {}, {"Bucket": "training-data"})
        assert advisor.bucket_region("training-data", s3) == "us-east-1"
    with Stubber(s3) as stub:
        stub.add_client_error("get_bucket_location", "AccessDenied")
        assert advisor.bucket_region("training-data", s3) is None


def test_no_region_known_means_no_region_check():
    est = pytorch(instance_type="local", distribution=None, instance_count=1)
    assert advisor.advise(est, "s3://data-eu-west-1/train") == []


def test_file_system_in_the_subnets_other_region():
    fsx = FileSystemInput("fs-0123456789abcdef0", "FSxLustre", "/fsx/train")
    est = pytorch(subnets=["subnet-0abc"], security_group_ids=["sg-0abc"])
    ec2 = boto3.client("ec2", region_name=REGION)
    with Stubber(ec2) as stub:
        stub.add_response("describe_subnets",
                          {"Subnets": [{"SubnetId": "subnet-0abc", "AvailabilityZone": "eu-west-1a"}]},
                          {"SubnetIds": ["subnet-0abc"]})
        finding = only(advisor.advise(est, {"train": fsx}, ec2_client=ec2), "SHOAL-DP004")
    assert finding.severity == "error"
    assert "FSxLustre file system 'fs-0123456789abcdef0' in eu-west-1" in finding.message
    # without a way to know the subnets' region, file systems are not judged
    assert "SHOAL-DP004" not in codes(advisor.advise(est, {"train": fsx}))


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


TORCH_SCRIPT = """
from torchvision import transforms
loader = DataLoader(dataset, batch_size=64, num_workers=8, shuffle=True)
"""
TF_SCRIPT = """
ds = tf.data.TFRecordDataset(files).map(parse_image).batch(64)
"""


def test_cpu_preprocessing_in_the_script():
    finding = only(advisor.advise(pytorch(), script_text=TORCH_SCRIPT), "SHOAL-DP007")
    assert finding.severity == "warning"
    assert "DataLoader num_workers=8" in finding.message
    assert "torchvision transforms" in finding.message
    assert "competes" in finding.message
    assert "before training" in finding.fix and "GPU" in finding.fix
    assert advisor.cpu_preprocessing(TF_SCRIPT) == ["tf.data map without num_parallel_calls"]
    parallel = "ds = tf.data.Dataset.from_tensor_slices(x).map(f, num_parallel_calls=AUTOTUNE)"
    assert advisor.cpu_preprocessing(parallel) == []
    assert advisor.cpu_preprocessing("DataLoader(ds, num_workers=2)") == []
    assert advisor.cpu_preprocessing("img = cv2.imread(p)\nfrom PIL import Image") == [
        "PIL image decoding", "OpenCV decoding"]


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


def test_drop_last_missing_in_the_script():
    script = "loader = DataLoader(ds, batch_size=32, shuffle=True)\nds2 = ds.batch(32)\n"
    finding = only(advisor.advise(smp({"partitions": 2}), script_text=script), "SHOAL-MP002")
    assert "DataLoader(ds, batch_size=32, shuffle=True)" in finding.message
    assert ".batch(32)" in finding.message
    assert "drop_last=True" in finding.fix and "drop_remainder=True" in finding.fix
    done = "DataLoader(ds, batch_size=32, drop_last=True)\nds.batch(32, drop_remainder=True)"
    assert "SHOAL-MP002" not in codes(advisor.advise(smp({"partitions": 2}), script_text=done))


def test_manual_partitioning_with_tied_weights():
    script = "self.decoder.weight = self.embedding.weight\n"
    est = smp({"partitions": 2, "auto_partition": False, "default_partition": 0})
    finding = only(advisor.advise(est, script_text=script), "SHOAL-MP004")
    assert finding.severity == "warning"
    assert "the script ties weights" in finding.message
    assert "same device" in finding.message
    assert "SHOAL-MP004" not in codes(advisor.advise(smp({"partitions": 2})))


def test_sharding_by_rank_instead_of_dp_rank():
    script = "ds = ds.shard(smp.size(), smp.rank())\n"
    finding = only(advisor.advise(smp({"partitions": 2}), script_text=script), "SHOAL-MP005")
    assert "smp.dp_rank()" in finding.fix
    assert "SHOAL-MP005" in codes(advisor.advise(smp({"partitions": 2}),
                                                 script_text="torch.manual_seed(smp.rank())"))
    good = "ds = ds.shard(smp.dp_size(), smp.dp_rank())\n"
    assert "SHOAL-MP005" not in codes(advisor.advise(smp({"partitions": 2}), script_text=good))


def test_step_with_more_inputs_needs_non_split_inputs():
    script = "@smp.step\ndef train_step(model, data, target, scale):\n    pass\n"
    finding = only(advisor.advise(smp({"partitions": 2}), script_text=script), "SHOAL-MP006")
    assert "['data', 'target', 'scale']" in finding.message
    assert "non_split_inputs" in finding.fix
    named = ("@smp.step(non_split_inputs=['scale'])\n"
             "def train_step(model, data, target, scale):\n    pass\n")
    assert "SHOAL-MP006" not in codes(advisor.advise(smp({"partitions": 2}), script_text=named))
    plain = "@smp.step\ndef train_step(model, data, target):\n    pass\n"
    assert "SHOAL-MP006" not in codes(advisor.advise(smp({"partitions": 2}), script_text=plain))
    other = "@tf.function\ndef train_step(model, data, target, scale):\n    pass\n"
    assert "SHOAL-MP006" not in codes(advisor.advise(smp({"partitions": 2}), script_text=other))


def test_forward_returning_intermediate_tensors():
    script = ("class Net(nn.Module):\n    def forward(self, x):\n        h = self.a(x)\n"
              "        return self.b(h), h\n\nmodel = smp.DistributedModel(Net())\n")
    finding = only(advisor.advise(smp({"partitions": 2}), script_text=script), "SHOAL-MP007")
    assert "broadcast to all ranks" in finding.message
    assert "forward() of ['Net']" in finding.message
    for one in ("return self.b(h)", "return F.softmax(self.b(h), dim=1)"):
        single = script.replace("return self.b(h), h", one)
        assert advisor.forwards_returning_several(single) == []
    assert "SHOAL-MP007" not in codes(advisor.advise(smp({"partitions": 2}), script_text=single))


def test_script_checks_read_the_syntax_not_the_text():
    assert advisor.batches_keeping_the_last(
        "a = DataLoader(ds, drop_last=False)\nb = DataLoader(ds, **opts)\n"
        "c = torch.utils.data.DataLoader(ds, batch_size=4, drop_last=True)\n"
        "# DataLoader(ds) in a comment\n") == ["DataLoader(ds, drop_last=False)"]
    assert advisor.shards_by_rank(
        "sampler = DistributedSampler(ds, num_replicas=smp.dp_size(), rank=smp.rank())\n"
        "print(smp.rank())\n") == [
        "DistributedSampler(ds, num_replicas=smp.dp_size(), rank=smp.rank())"]
    # a script that does not parse gives no script findings rather than guesses
    broken = "def forward(self, x):\n    return a, b\nDataLoader(ds\n"
    findings = advisor.advise(smp({"partitions": 2}), script_text=broken + "DistributedModel")
    assert [c for c in codes(findings) if c in ("SHOAL-MP002", "SHOAL-MP007")] == []


# ---------------------------------------------------------------- fit() and the modes


class FakeJob:
    name = "job"

    def wait(self, logs="All"):
        pass


class FakeBackend:
    def __init__(self):
        self.submitted = []

    def submit(self, request):
        self.submitted.append(request)
        return FakeJob()


@pytest.fixture
def backend(monkeypatch, tmp_path):
    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "train.py").write_text(TORCH_SCRIPT)
    monkeypatch.chdir(tmp_path)
    fake = FakeBackend()
    monkeypatch.setattr(estimator_module, "backend_for", lambda instance_type, session: fake)
    monkeypatch.setattr(estimator_module.EstimatorBase, "_stage_code", lambda self, name: None)
    monkeypatch.delenv(advisor.ENV_MODE, raising=False)
    with mock_aws():
        yield fake


def advisor_records(caplog):
    return [r for r in caplog.records if r.name == "shoal.advisor"]


def test_fit_logs_each_finding_once(backend, caplog):
    caplog.set_level(logging.INFO, logger="shoal.advisor")
    est = pytorch(source_dir="code", instance_count=1)
    est.fit("s3://data-eu-west-1/train", job_name="job-1")
    est.fit("s3://data-eu-west-1/train", job_name="job-2")
    messages = [r.getMessage() for r in advisor_records(caplog)]
    assert len(backend.submitted) == 2  # errors do not stop a job by default
    for code in ("SHOAL-DP001", "SHOAL-DP003", "SHOAL-DP007"):  # DP007 read from train.py
        assert len([m for m in messages if m.startswith(code)]) == 1, messages
    levels = {r.getMessage()[:11]: r.levelno for r in advisor_records(caplog)}
    assert levels["SHOAL-DP003"] == logging.ERROR
    assert levels["SHOAL-DP007"] == logging.WARNING


def test_strict_mode_from_the_environment_rejects_errors(backend, monkeypatch):
    monkeypatch.setenv(advisor.ENV_MODE, "strict")
    est = pytorch(source_dir="code")
    with pytest.raises(ValidationError, match="SHOAL-DP003: channel 'train' reads S3 bucket"):
        est.fit({"train": "s3://data-eu-west-1/train"}, job_name="job-1")
    assert backend.submitted == []
    est.fit({"train": "s3://data-us-west-2/train"}, job_name="job-2")  # warnings pass
    assert len(backend.submitted) == 1


def test_strict_estimator_option(backend):
    est = pytorch(source_dir="code", advice="strict",
                  image_uri="1.dkr.ecr.us-west-2.amazonaws.com/pt:1.8.1-gpu-py36-cu102")
    with pytest.raises(ValidationError, match="SHOAL-DP002"):
        est.fit(job_name="job-1")
    assert backend.submitted == []


def test_off_silences_the_advisor(backend, monkeypatch, caplog):
    caplog.set_level(logging.INFO, logger="shoal.advisor")
    monkeypatch.setenv(advisor.ENV_MODE, "off")
    pytorch(source_dir="code", instance_count=1).fit("s3://data-eu-west-1/x", job_name="job-1")
    assert advisor_records(caplog) == []
    assert len(backend.submitted) == 1


def test_the_estimator_option_wins_over_the_environment(backend, monkeypatch, caplog):
    caplog.set_level(logging.INFO, logger="shoal.advisor")
    monkeypatch.setenv(advisor.ENV_MODE, "strict")
    pytorch(source_dir="code", advice="warn").fit("s3://data-eu-west-1/x", job_name="job-1")
    assert len(backend.submitted) == 1
    assert any(r.getMessage().startswith("SHOAL-DP003") for r in advisor_records(caplog))


def test_invalid_modes_are_refused(monkeypatch):
    with pytest.raises(ValidationError, match=r"'advice' must be in \('warn', 'strict', 'off'\)"):
        pytorch(advice="loud")
    monkeypatch.setenv(advisor.ENV_MODE, "loud")
    with pytest.raises(ValidationError, match="'SHOAL_ADVICE' must be in"):
        advisor.mode()


def test_read_script_only_reads_local_files(tmp_path):
    (tmp_path / "train.py").write_text("print(1)\n")
    est = pytorch(entry_point="train.py", source_dir=str(tmp_path))
    assert advisor.read_script(est.config) == "print(1)\n"
    assert advisor.read_script(pytorch(source_dir="s3://bucket/code.tar.gz").config) is None
    assert advisor.read_script(pytorch(entry_point="missing.py").config) is None


def test_a_job_spec_brings_its_inputs_and_region():
    from shoal.config import parse_spec

    spec = parse_spec({"framework": "pytorch", "entry_point": "train.py", "role": ROLE,
                       "framework_version": "1.13.1", "py_version": "py39",
                       "region": "eu-west-1", "instance_type": "ml.p4d.24xlarge",
                       "instance_count": 1, "distribution": SMDDP,
                       "inputs": {"train": "s3://data-us-east-1/train"}})
    findings = advisor.advise(spec)
    assert codes(findings) == ["SHOAL-DP003", "SHOAL-DP001"]
    assert "job runs in eu-west-1" in findings[0].message


def test_a_training_config_alone_gets_the_checks_it_can_answer():
    config = pytorch(disable_profiler=True, instance_count=3).config
    findings = advisor.advise(config, "s3://data-eu-west-1/x", region=REGION)
    assert codes(findings) == ["SHOAL-DP003", "SHOAL-DP010"]


def test_tensorflow_data_parallel_job():
    est = shoal.TensorFlow(entry_point="train.py", role=ROLE, instance_count=2,
                           instance_type="ml.p3.16xlarge", framework_version="2.11.0",
                           py_version="py39", distribution=SMDDP, sagemaker_session=session(),
                           hyperparameters={"batch_size": 64, "learning_rate": 0.001})
    findings = advisor.advise(est, script_text=TF_SCRIPT)
    assert codes(findings) == ["SHOAL-DP007", "SHOAL-DP008"]
    assert "tf.data map without num_parallel_calls" in findings[0].message
    assert "x 16 processes" in findings[1].message
