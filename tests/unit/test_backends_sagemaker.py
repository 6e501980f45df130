"""The SageMaker backend: submit, describe, wait, stop, model_data, Ctrl-C, error mapping."""

import random
from datetime import datetime, timezone

import boto3
import pytest
from botocore.exceptions import NoCredentialsError
from botocore.stub import Stubber
from moto import mock_aws
from shoal.backends import Backend, TrainingJob, backend_for
from shoal.backends.sagemaker import SageMakerBackend, SageMakerTrainingJob, backend
from shoal.errors import CredentialsError, Interrupted, PermissionError_
from shoal.session import Session

REGION = "us-west-2"
ROLE = "arn:aws:iam::123456789012:role/SageMakerRole"
JOB = "shoal-backend-test"


def request(name=JOB):
    return {
        "TrainingJobName": name,
        "RoleArn": ROLE,
        "AlgorithmSpecification": {
            "TrainingImage": "123456789012.dkr.ecr.us-west-2.amazonaws.com/shoal-pytorch-training:2.0.1-gpu-py310",
            "TrainingInputMode": "File",
        },
        "OutputDataConfig": {"S3OutputPath": "s3://out-bucket/out"},
        "ResourceConfig": {"InstanceType": "ml.p4d.24xlarge", "InstanceCount": 2, "VolumeSizeInGB": 30},
        "StoppingCondition": {"MaxRuntimeInSeconds": 3600},
        "HyperParameters": {"sagemaker_program": '"train.py"'},
    }


class NoSleep:
    def __init__(self, interrupt_after=None):
        self.t = 0.0
        self.n = 0
        self.interrupt_after = interrupt_after

    def clock(self):
        return self.t

    def sleep(self, s):
        self.n += 1
        self.t += s
        if self.interrupt_after is not None and self.n >= self.interrupt_after:
            raise KeyboardInterrupt


def options(lines, timer):
    return {"out": lines.append, "clock": timer.clock, "sleep": timer.sleep, "rng": random.Random(0)}


def describe_response(status, **extra):
    r = {
        "TrainingJobName": JOB,
        "TrainingJobArn": f"arn:aws:sagemaker:{REGION}:123456789012:training-job/{JOB}",
        "ModelArtifacts": {"S3ModelArtifacts": f"s3://out-bucket/out/{JOB}/output/model.tar.gz"},
        "TrainingJobStatus": status,
        "SecondaryStatus": "Training" if status == "InProgress" else status,
        "AlgorithmSpecification": {"TrainingInputMode": "File"},
        "ResourceConfig": {"InstanceCount": 1, "VolumeSizeInGB": 30},
        "StoppingCondition": {"MaxRuntimeInSeconds": 3600},
        "CreationTime": datetime(2024, 1, 1, tzinfo=timezone.utc),
    }
    r.update(extra)
    return r


@pytest.fixture
def session():
    with mock_aws():
        yield Session(boto_session=boto3.Session(region_name=REGION))


def test_protocols_and_factory(session):
    be = backend_for("ml.p4d.24xlarge", session)
    assert isinstance(be, SageMakerBackend) and isinstance(be, Backend)
    assert isinstance(be.submit(request()), TrainingJob)


def test_submit_creates_the_job_and_waits_to_completion(session):
    lines, timer = [], NoSleep()
    job = backend(session, **options(lines, timer)).submit(request())
    assert job.name == JOB
    described = session.sagemaker_client.describe_training_job(TrainingJobName=JOB)
    assert described["ResourceConfig"]["InstanceCount"] == 2
    final = job.wait()
    assert final["TrainingJobStatus"] == "Completed"  # moto completes jobs at once
    assert job.model_data == final["ModelArtifacts"]["S3ModelArtifacts"]


def test_ctrl_c_detaches_without_stopping(session):
    sm = session.sagemaker_client
    lines, timer = [], NoSleep(interrupt_after=2)
    job = SageMakerTrainingJob(JOB, session, **options(lines, timer))
    with Stubber(sm) as stub:
        for _ in range(3):
            stub.add_response("describe_training_job", describe_response("InProgress"))
        with pytest.raises(Interrupted) as info:
            job.wait(logs="None")
        # No StopTrainingJob was queued: the stubber would fail on an unexpected call.
    message = str(info.value)
    assert f"shoal.attach('{JOB}').logs()" in message
    assert f"shoal logs sagemaker://{REGION}/{JOB}" in message
    assert lines[-1] == message
    assert info.value.exit_code == 130


def test_stop_calls_stop_training_job(session):
    sm = session.sagemaker_client
    with Stubber(sm) as stub:
        stub.add_response("stop_training_job", {}, {"TrainingJobName": JOB})
        SageMakerTrainingJob(JOB, session).stop()
        stub.assert_no_pending_responses()


def test_model_data_is_none_while_running(session):
    sm = session.sagemaker_client
    with Stubber(sm) as stub:
        stub.add_response(
            "describe_training_job", describe_response("InProgress", ModelArtifacts={"S3ModelArtifacts": ""})
        )
        stub.add_response("describe_training_job", describe_response("Completed"))
        job = SageMakerTrainingJob(JOB, session)
        assert not job.model_data
        assert job.model_data.endswith("/output/model.tar.gz")


def test_logs_without_wait_reads_once(session):
    sm = session.sagemaker_client
    lines, timer = [], NoSleep()
    with Stubber(sm) as stub:
        stub.add_response("describe_training_job", describe_response("InProgress"))
        SageMakerTrainingJob(JOB, session, **options(lines, timer)).logs(wait=False)
    assert timer.n == 0


@pytest.mark.parametrize(
    "code, error",
    [
        ("AccessDeniedException", PermissionError_),
        ("ExpiredTokenException", CredentialsError),
        ("UnrecognizedClientException", CredentialsError),
        ("InvalidClientTokenId", CredentialsError),
    ],
)
def test_submit_errors_map_to_the_error_tree(session, code, error):
    sm = session.sagemaker_client
    with Stubber(sm) as stub:
        stub.add_client_error("create_training_job", code, "nope")
        with pytest.raises(error):
            backend(session).submit(request())


def test_missing_credentials_map_to_credentials_error(session):
    sm = session.sagemaker_client

    def no_creds(**_):
        raise NoCredentialsError()

    sm.meta.events.register("before-call.sagemaker.CreateTrainingJob", no_creds)
    with pytest.raises(CredentialsError, match="no usable AWS credentials"):
        backend(session).submit(request())


def test_wait_writes_to_a_given_stream(session):
    import io

    sm = session.sagemaker_client
    stream = io.StringIO()
    with Stubber(sm) as stub:
        stub.add_response(
            "describe_training_job",
            describe_response(
                "Completed",
                SecondaryStatusTransitions=[{
                    "Status": "Completed", "StatusMessage": "Training job completed",
                    "StartTime": datetime(2024, 1, 1, tzinfo=timezone.utc)}],
                TrainingTimeInSeconds=10, BillableTimeInSeconds=10,
            ),
        )
        SageMakerTrainingJob(JOB, session, sleep=lambda s: None).wait(logs="None", out=stream)
    assert stream.getvalue().splitlines() == [
        "2024-01-01 00:00:00 Completed - Training job completed",
        "Training seconds: 10",
        "Billable seconds: 10",
    ]
