"""attach(): the estimator rebuilt from DescribeTrainingJob and ListTags."""

import json
from datetime import datetime, timezone

import boto3
import pytest
from botocore.stub import Stubber
from shoal import attaching as attach_mod
from shoal.attaching import (
    attach,
    framework_from_image,
    init_params,
    input_from_channel,
    inputs_from_description,
    user_hyperparameters,
)
from shoal.backends.sagemaker import SageMakerTrainingJob
from shoal.distribution import parse_distribution
from shoal.inputs import FileSystemInput, ShuffleConfig, TrainingInput, channel
from shoal.session import Session

REGION = "us-west-2"
JOB = "pytorch-training-2024-01-01-00-00-00-000"
IMAGE = "123456789012.dkr.ecr.us-west-2.amazonaws.com/shoal-pytorch-training:1.13.1-gpu-py39"
SMDDP = {
    "smdistributed": {
        "dataparallel": {"enabled": True, "custom_mpi_options": "-verbose -x NCCL_DEBUG=VERSION"}
    }
}


def encoded_hyperparameters(distribution=SMDDP):
    dist = parse_distribution(
        distribution,
        framework="pytorch",
        framework_version="1.13.1",
        py_version="py39",
        instance_type="ml.p4d.24xlarge",
        instance_count=2,
    )
    values = {
        "epochs": 10,
        "lr": 0.05,
        "model_name": "resnet50",
        "layers": [1, 2, 3],
        "sagemaker_program": "train.py",
        "sagemaker_submit_directory": f"s3://code-bucket/{JOB}/source/sourcedir.tar.gz",
        "sagemaker_container_log_level": 20,
        "sagemaker_region": REGION,
        "sagemaker_job_name": JOB,
        **dist.hyperparameters(),
    }
    return {k: json.dumps(v) for k, v in values.items()}


TRAIN = TrainingInput(
    "s3://data-bucket/train/",
    distribution="ShardedByS3Key",
    input_mode="FastFile",
    shuffle_config=ShuffleConfig(7),
)
FSX = FileSystemInput("fs-0123456789abcdef0", "FSxLustre", "/fsx/data", "ro")


def description(**extra):
    d = {
        "TrainingJobName": JOB,
        "TrainingJobArn": f"arn:aws:sagemaker:{REGION}:123456789012:training-job/{JOB}",
        "ModelArtifacts": {"S3ModelArtifacts": f"s3://out/{JOB}/output/model.tar.gz"},
        "TrainingJobStatus": "Completed",
        "SecondaryStatus": "Completed",
        "HyperParameters": encoded_hyperparameters(),
        "AlgorithmSpecification": {"TrainingImage": IMAGE, "TrainingInputMode": "File"},
        "RoleArn": "arn:aws:iam::123456789012:role/SageMakerRole",
        "InputDataConfig": [
            channel("train", TRAIN),
            channel("fsx", FSX),
            channel("model", TrainingInput("s3://models/m.tar.gz", content_type="application/x-sagemaker-model", input_mode="File")),
        ],
        "OutputDataConfig": {"S3OutputPath": "s3://out/", "KmsKeyId": "alias/out"},
        "ResourceConfig": {"InstanceType": "ml.p4d.24xlarge", "InstanceCount": 2, "VolumeSizeInGB": 100},
        "VpcConfig": {"SecurityGroupIds": ["sg-1"], "Subnets": ["subnet-1"]},
        "StoppingCondition": {"MaxRuntimeInSeconds": 7200},
        "CreationTime": datetime(2024, 1, 1, tzinfo=timezone.utc),
        "CheckpointConfig": {"S3Uri": "s3://ckpt/", "LocalPath": "/opt/ml/checkpoints"},
        "Environment": {"NCCL_DEBUG": "INFO"},
    }
    d.update(extra)
    return d


TAGS = [{"Key": "project", "Value": "shoal"}, {"Key": "aws:sagemaker:x", "Value": "y"}]


def test_framework_from_image():
    assert framework_from_image(IMAGE) == ("pytorch", "1.13.1", "py39")
    assert framework_from_image(
        "763104351884.dkr.ecr.us-west-2.amazonaws.com/tensorflow-training:2.11.0-gpu-py39-cu112-ubuntu20.04-sagemaker"
    ) == ("tensorflow", "2.11.0", "py39")
    assert framework_from_image("123.dkr.ecr.us-west-2.amazonaws.com/my-algo:latest") is None
    assert framework_from_image(None) is None


def test_user_hyperparameters_are_decoded_and_reserved_ones_dropped():
    hps = encoded_hyperparameters()
    hps["_tuning_objective_metric"] = "validation:loss"  # set raw by a tuner
    assert user_hyperparameters(hps) == {
        "epochs": 10,
        "lr": 0.05,
        "model_name": "resnet50",
        "layers": [1, 2, 3],
        "_tuning_objective_metric": "validation:loss",
    }


@pytest.mark.parametrize("value", [TRAIN, FSX, TrainingInput("s3://b/p", compression="Gzip", content_type="text/csv")])
def test_channels_round_trip_into_input_objects(value):
    rebuilt = input_from_channel(channel("c", value))
    assert type(rebuilt) is type(value)
    assert channel("c", rebuilt) == channel("c", value)


def test_init_params_restore_everything():
    params = init_params(description(), TAGS)
    assert params["entry_point"] == "train.py"
    assert params["source_dir"] == f"s3://code-bucket/{JOB}/source/sourcedir.tar.gz"
    assert params["container_log_level"] == 20
    assert params["hyperparameters"] == {"epochs": 10, "lr": 0.05, "model_name": "resnet50", "layers": [1, 2, 3]}
    assert params["distribution"] == SMDDP
    assert (params["framework_version"], params["py_version"]) == ("1.13.1", "py39")
    assert params["image_uri"] == IMAGE
    assert (params["instance_count"], params["instance_type"], params["volume_size"]) == (2, "ml.p4d.24xlarge", 100)
    assert params["role"].endswith("role/SageMakerRole")
    assert (params["output_path"], params["output_kms_key"]) == ("s3://out/", "alias/out")
    assert (params["subnets"], params["security_group_ids"]) == (["subnet-1"], ["sg-1"])
    assert params["max_run"] == 7200
    assert params["checkpoint_s3_uri"] == "s3://ckpt/"
    assert params["environment"] == {"NCCL_DEBUG": "INFO"}
    assert (params["model_uri"], params["model_channel_name"]) == ("s3://models/m.tar.gz", "model")
    assert params["tags"] == [{"Key": "project", "Value": "shoal"}]
    assert "max_wait" not in params  # absent in the description: left to the default


def test_init_params_restore_mpi_distribution():
    mpi = {"mpi": {"enabled": True, "processes_per_host": 8, "custom_mpi_options": "-x A=1"}}
    params = init_params(description(HyperParameters=encoded_hyperparameters(mpi)))
    assert params["distribution"] == mpi


def test_inputs_leave_the_model_channel_out():
    assert inputs_from_description(description()) == {"train": TRAIN, "fsx": FSX}


class Recorder:
    """Stands in for an estimator class: records what attach() gives it."""

    def __init__(self, sagemaker_session=None, entry_point=None, source_dir=None,
                 hyperparameters=None, distribution=None, instance_count=None, tags=None):
        self.kwargs = dict(entry_point=entry_point, source_dir=source_dir,
                           hyperparameters=hyperparameters, distribution=distribution,
                           instance_count=instance_count, tags=tags)
        self.sagemaker_session = sagemaker_session


class Narrow:
    def __init__(self, sagemaker_session=None, role=None, image_uri=None):
        self.role, self.image_uri = role, image_uri


def stubbed(session, desc=None):
    stub = Stubber(session.sagemaker_client)
    stub.add_response("describe_training_job", desc or description(), {"TrainingJobName": JOB})
    arn = description()["TrainingJobArn"]
    stub.add_response("list_tags", {"Tags": TAGS[:1], "NextToken": "t2"}, {"ResourceArn": arn})
    stub.add_response("list_tags", {"Tags": TAGS[1:]}, {"ResourceArn": arn, "NextToken": "t2"})
    return stub


def test_attach_builds_and_binds_the_estimator():
    session = Session(boto_session=boto3.Session(region_name=REGION))
    with stubbed(session) as stub:
        est = attach(JOB, sagemaker_session=session, estimator_cls=Recorder)
        stub.assert_no_pending_responses()
    assert est.sagemaker_session is session
    assert est.kwargs["distribution"] == SMDDP
    assert est.kwargs["hyperparameters"]["epochs"] == 10
    assert est.kwargs["tags"] == [{"Key": "project", "Value": "shoal"}]
    assert est.inputs == {"train": TRAIN, "fsx": FSX}
    assert isinstance(est.latest_training_job, SageMakerTrainingJob)
    assert est.latest_training_job.name == JOB
    assert est._current_job_name == JOB


def test_attach_gives_a_class_only_what_it_takes():
    session = Session(boto_session=boto3.Session(region_name=REGION))
    with stubbed(session):
        est = attach(JOB, sagemaker_session=session, estimator_cls=Narrow)
    assert est.image_uri == IMAGE


def test_attach_wait_follows_the_job(monkeypatch):
    session = Session(boto_session=boto3.Session(region_name=REGION))
    followed = []
    monkeypatch.setattr(SageMakerTrainingJob, "wait", lambda self, logs="All": followed.append((self.name, logs)))
    with stubbed(session):
        attach(JOB, sagemaker_session=session, estimator_cls=Recorder, wait=True, logs=False)
    assert followed == [(JOB, "None")]


def test_estimator_class_follows_the_image():
    from shoal.estimator import Estimator
    from shoal.pytorch import PyTorch
    from shoal.tensorflow import TensorFlow

    assert attach_mod.estimator_class_for({"image_uri": IMAGE}) is PyTorch
    tf = IMAGE.replace("pytorch", "tensorflow").replace("1.13.1", "2.11.0")
    assert attach_mod.estimator_class_for({"image_uri": tf}) is TensorFlow
    assert attach_mod.estimator_class_for({"image_uri": "x/algo:1"}) is Estimator


def test_attach_rebuilds_a_pytorch_estimator_that_can_run_again():
    from moto import mock_aws
    from shoal.pytorch import PyTorch

    with mock_aws():
        session = Session(boto_session=boto3.Session(region_name=REGION))
        with stubbed(session):
            est = attach(JOB, sagemaker_session=session)
        assert type(est) is PyTorch
        assert (est.framework_version, est.py_version) == ("1.13.1", "py39")
        assert est.distribution == SMDDP
        request = est.build_request(est.inputs, "again-1")
    hps = request["HyperParameters"]
    assert hps["sagemaker_distributed_dataparallel_enabled"] == "true"
    assert hps["sagemaker_program"] == '"train.py"'
    assert hps["sagemaker_submit_directory"] == json.dumps(
        f"s3://code-bucket/{JOB}/source/sourcedir.tar.gz"
    )
    assert (hps["epochs"], hps["layers"]) == ("10", "[1, 2, 3]")
    assert [c["ChannelName"] for c in request["InputDataConfig"]] == ["train", "fsx", "model"]
    assert request["ResourceConfig"]["InstanceCount"] == 2
    assert request["AlgorithmSpecification"]["TrainingImage"] == IMAGE


def test_classmethod_attach_keeps_the_class_and_what_it_takes():
    from moto import mock_aws
    from shoal.estimator import Estimator
    from shoal.pytorch import PyTorch

    with mock_aws():
        session = Session(boto_session=boto3.Session(region_name=REGION))
        with stubbed(session):
            generic = Estimator.attach(JOB, sagemaker_session=session)
        with stubbed(session):
            torch_est = PyTorch.attach(JOB, sagemaker_session=session)
    assert type(generic) is Estimator
    assert generic.image_uri == IMAGE and generic.entry_point == "train.py"
    assert type(torch_est) is PyTorch and torch_est.distribution == SMDDP
    assert torch_est.latest_training_job.name == JOB


def test_module_function_is_exported():
    import shoal

    assert shoal.attach is attach


def test_heterogeneous_cluster_comes_back_as_instance_groups():
    from shoal.request import InstanceGroup

    groups = [
        {"InstanceGroupName": "gpus", "InstanceType": "ml.p4d.24xlarge", "InstanceCount": 2},
        {"InstanceGroupName": "cpus", "InstanceType": "ml.c5.18xlarge", "InstanceCount": 4},
    ]
    params = init_params(description(ResourceConfig={"InstanceGroups": groups, "VolumeSizeInGB": 30}))
    assert params["instance_groups"] == [
        InstanceGroup("gpus", "ml.p4d.24xlarge", 2),
        InstanceGroup("cpus", "ml.c5.18xlarge", 4),
    ]
    assert "instance_count" not in params and "instance_type" not in params
