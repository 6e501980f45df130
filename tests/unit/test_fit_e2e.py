"""fit() end to end against moto: bucket, archive, job, and following status and logs.

moto completes a job the moment it is created, so an ``after-call`` hook on
DescribeTrainingJob reports it in progress for the first few polls, while the fake
sleep writes log events for two hosts into moto's CloudWatch Logs.
"""

import io
import os
import random
import tarfile
import time

import boto3
import pytest
import shoal
from moto import mock_aws
from shoal.backends import sagemaker as sagemaker_backend
from shoal.errors import CapacityError, JobFailedError, StagingError
from shoal.logs import LOG_GROUP
from shoal.session import Session

REGION = "us-west-2"
ACCOUNT = "123456789012"
BUCKET = f"sagemaker-{REGION}-{ACCOUNT}"
ROLE = f"arn:aws:iam::{ACCOUNT}:role/SageMakerRole"
NOW_MS = int(time.time() * 1000)
SMDDP = {"smdistributed": {"dataparallel": {"enabled": True, "custom_mpi_options": "-verbose"}}}


class Job:
    """The job's side: status for the first polls, and log events written while we sleep."""

    def __init__(self, logs_client, in_progress_polls=3):
        self.logs = logs_client
        self.in_progress_polls = in_progress_polls
        self.polls = 0
        self.sleeps = 0
        self.now = 0.0
        self.job_name = None
        self.final = {}

    def clock(self):
        return self.now

    def sleep(self, seconds):
        self.now += seconds
        self.sleeps += 1
        if self.polls <= self.in_progress_polls:
            self.write_step(self.sleeps)

    def write_step(self, n):
        # algo-2's line of each step is older than algo-1's: order must come from timestamps
        for host, offset in ((1, 5), (2, 1)):
            stream = f"{self.job_name}/algo-{host}-1700000000"
            self.logs.put_log_events(
                logGroupName=LOG_GROUP,
                logStreamName=stream,
                logEvents=[{"timestamp": NOW_MS + 10 * n + offset, "message": f"h{host} step {n}"}],
            )

    def start(self, job_name):
        self.job_name = job_name
        for host in (1, 2):
            self.logs.create_log_stream(
                logGroupName=LOG_GROUP, logStreamName=f"{job_name}/algo-{host}-1700000000"
            )

    def after_describe(self, parsed, **_):
        self.polls += 1
        if self.polls <= self.in_progress_polls:
            parsed["TrainingJobStatus"] = "InProgress"
            parsed["SecondaryStatus"] = "Training"
        else:
            parsed.update(self.final)


@pytest.fixture
def world(monkeypatch, tmp_path):
    with mock_aws():
        session = Session(boto_session=boto3.Session(region_name=REGION))
        logs_client = session.client("logs")
        logs_client.create_log_group(logGroupName=LOG_GROUP)
        job = Job(logs_client)
        lines = []
        session.sagemaker_client.meta.events.register(
            "after-call.sagemaker.DescribeTrainingJob", job.after_describe
        )
        monkeypatch.setattr(
            sagemaker_backend,
            "backend",
            lambda s: sagemaker_backend.SageMakerBackend(
                s, out=lines.append, clock=job.clock, sleep=job.sleep, rng=random.Random(0)
            ),
        )
        code = tmp_path / "code"
        for rel, text in {
            "train.py": "print('hi')\n",
            "model/net.py": "NET = 1\n",
            "model/__pycache__/net.cpython-311.pyc": "x",
            ".git/config": "[core]\n",
            ".venv/pyvenv.cfg": "home = /usr\n",
            ".ipynb_checkpoints/train-checkpoint.py": "old",
        }.items():
            (code / rel).parent.mkdir(parents=True, exist_ok=True)
            (code / rel).write_text(text)
        yield session, job, lines, code


def estimator(session, code, **kw):
    return shoal.PyTorch(
        entry_point="train.py",
        source_dir=str(code),
        role=ROLE,
        instance_count=2,
        instance_type="ml.p4d.24xlarge",
        framework_version="1.13.1",
        py_version="py39",
        distribution=SMDDP,
        hyperparameters={"epochs": 3},
        sagemaker_session=session,
        **kw,
    )


def archive_bytes(session, job_name):
    key = f"{job_name}/source/sourcedir.tar.gz"
    return session.s3_client.get_object(Bucket=BUCKET, Key=key)["Body"].read()


def test_fit_stages_submits_and_follows_two_hosts(world):
    session, job, lines, code = world
    owners = []
    session.s3_client.meta.events.register(
        "provide-client-params.s3.*",
        lambda params, model, **_: owners.append((model.name, params.get("ExpectedBucketOwner"))),
    )
    job.start("e2e-1")
    est = estimator(session, code)
    est.fit({"train": "s3://data-bucket/train"}, job_name="e2e-1")
    fit_calls = list(owners)  # the calls fit() made

    # the default bucket was created, every other call carried the owner check
    assert BUCKET in [b["Name"] for b in session.s3_client.list_buckets()["Buckets"]]
    assert {op for op, owner in fit_calls if owner != ACCOUNT} == {"CreateBucket"}
    assert "PutObject" in [op for op, _ in fit_calls]

    with tarfile.open(fileobj=io.BytesIO(archive_bytes(session, "e2e-1"))) as tar:
        assert sorted(tar.getnames()) == ["model", "model/net.py", "train.py"]

    described = session.sagemaker_client.describe_training_job(TrainingJobName="e2e-1")
    hps = described["HyperParameters"]
    assert hps["sagemaker_submit_directory"] == f'"s3://{BUCKET}/e2e-1/source/sourcedir.tar.gz"'
    assert hps["sagemaker_program"] == '"train.py"'
    assert hps["sagemaker_distributed_dataparallel_enabled"] == "true"

    logged = [line for line in lines if line.startswith("[algo-")]
    steps = range(1, job.in_progress_polls + 1)
    assert logged == [line for n in steps for line in (f"[algo-2] h2 step {n}", f"[algo-1] h1 step {n}")]
    assert any(line.endswith("Starting - Preparing the instances for training") for line in lines)
    assert est.model_data == f"s3://{BUCKET}/e2e-1/output/model.tar.gz"
    assert est.latest_training_job.name == "e2e-1"


def test_archive_is_reproducible_across_jobs(world):
    session, job, lines, code = world
    for name in ("e2e-a", "e2e-b"):
        job.start(name)
        job.polls = 0
        estimator(session, code).fit(job_name=name, wait=False)
    assert archive_bytes(session, "e2e-a") == archive_bytes(session, "e2e-b")


def test_symlink_escape_refused_before_any_job(world, tmp_path):
    session, job, lines, code = world
    (tmp_path / "secret.txt").write_text("secret")
    os.symlink(tmp_path / "secret.txt", code / "model" / "leak.txt")
    with pytest.raises(StagingError, match="points outside"):
        estimator(session, code).fit(job_name="e2e-leak")
    assert session.sagemaker_client.list_training_jobs()["TrainingJobSummaries"] == []


def test_failed_job_raises_with_its_reason(world):
    session, job, lines, code = world
    job.start("e2e-fail")
    job.final = {"TrainingJobStatus": "Failed", "SecondaryStatus": "Failed",
                 "FailureReason": "AlgorithmError: ExecuteUserScriptError"}
    with pytest.raises(JobFailedError) as info:
        estimator(session, code).fit(job_name="e2e-fail")
    assert not isinstance(info.value, CapacityError)
    assert info.value.job_name == "e2e-fail"
    assert info.value.reason == "AlgorithmError: ExecuteUserScriptError"


def test_attach_to_the_job_fit_started(world, capsys):
    session, job, lines, code = world
    job.in_progress_polls = 0  # attach() and logs() see the job as moto has it: done
    job.start("e2e-2")
    job.write_step(1)
    estimator(session, code).fit({"train": "s3://data-bucket/train"}, job_name="e2e-2", wait=False)
    again = shoal.attach("e2e-2", sagemaker_session=session)
    assert type(again) is shoal.PyTorch
    assert again.distribution == SMDDP
    assert again.hyperparameters()["epochs"] == "3"
    assert again.source_dir == f"s3://{BUCKET}/e2e-2/source/sourcedir.tar.gz"
    assert again.inputs["train"].s3_data == "s3://data-bucket/train"
    assert again.latest_training_job.describe()["TrainingJobName"] == "e2e-2"
    again.logs()
    printed = capsys.readouterr().out.splitlines()
    logs = [line for line in printed if line.startswith("[algo-")]
    assert logs[-2:] == ["[algo-2] h2 step 1", "[algo-1] h1 step 1"]
    # then the closing summary: moto's job carries a FinalMetricDataList
    assert printed[-1].startswith("Final metrics: ")


def test_code_already_in_s3_is_not_uploaded_again(world):
    session, job, lines, code = world
    job.in_progress_polls = 0
    previous = f"s3://{BUCKET}/e2e-old/source/sourcedir.tar.gz"
    puts = []
    session.s3_client.meta.events.register(
        "provide-client-params.s3.PutObject", lambda params, **_: puts.append(params)
    )
    est = estimator(session, code)
    est.source_dir = previous
    est.fit(job_name="e2e-reuse", wait=False)
    assert puts == []
    hps = session.sagemaker_client.describe_training_job(TrainingJobName="e2e-reuse")["HyperParameters"]
    assert hps["sagemaker_submit_directory"] == f'"{previous}"'
