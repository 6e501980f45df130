"""``shoal serve`` with the real clients, unchanged: boto3 (and its waiter), the AWS CLI, and
SageMaker SDK v2's PyTorch estimator with 2 instances and S3 data on a local S3 server.
Every job really runs, on the local backend, and its hosts' output comes back as log streams.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import boto3
import pytest
from botocore.exceptions import ClientError, WaiterError

pytestmark = [pytest.mark.slow]

GROUP = "/aws/sagemaker/TrainingJobs"
IMAGE = "763104351884.dkr.ecr.us-east-1.amazonaws.com/pytorch-training:2.0.1-cpu-py310"
ROLE = "arn:aws:iam::111122223333:role/SageMakerRole"
FAKE_KEYS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
             "AWS_DEFAULT_REGION": "us-east-1"}
TRAIN = """
import os, sys, time
host = os.environ["SM_CURRENT_HOST"]
print(f"hello from {host}", flush=True)
print(f"to stderr from {host}", file=sys.stderr, flush=True)
time.sleep(float(os.environ.get("SLEEP", "0")))
data = os.environ.get("SM_CHANNEL_TRAIN")
if data:
    print(f"{host} sees", sorted(os.listdir(data)), flush=True)
with open(os.path.join(os.environ["SM_MODEL_DIR"], f"model-{host}.txt"), "w") as f:
    f.write(host)
sys.exit(int(os.environ.get("EXIT", "0")))
"""


class Server:
    def __init__(self, root: Path, env: dict | None = None, args=()):
        self.process = subprocess.Popen(
            [sys.executable, "-m", "shoal.cli", "serve", "--port", "0", *args],
            env={**os.environ, **FAKE_KEYS, "SHOAL_LOCAL_ROOT": str(root), **(env or {})},
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.url = self.process.stdout.readline().strip()
        assert self.url.startswith("http://127.0.0.1:"), self.process.stderr.read()

    def client(self, service: str, **kwargs):
        return boto3.client(service, endpoint_url=self.url, region_name="us-east-1",
                            aws_access_key_id=kwargs.pop("key", "testing"),
                            aws_secret_access_key=kwargs.pop("secret", "testing"), **kwargs)

    def stop(self):
        self.process.terminate()
        self.process.wait(timeout=30)


@pytest.fixture
def code(tmp_path):
    folder = tmp_path / "code"
    folder.mkdir()
    (folder / "train.py").write_text(TRAIN)
    return folder


@pytest.fixture
def server(tmp_path):
    s = Server(tmp_path / "jobs")
    yield s
    s.stop()


def request(name: str, code: Path, out: Path, hosts: int = 2, **environment) -> dict:
    return {
        "TrainingJobName": name, "RoleArn": ROLE,
        "AlgorithmSpecification": {"TrainingImage": IMAGE, "TrainingInputMode": "File"},
        "HyperParameters": {"sagemaker_program": json.dumps("train.py"),
                            "sagemaker_submit_directory": json.dumps(code.as_uri())},
        "OutputDataConfig": {"S3OutputPath": out.as_uri()},
        "ResourceConfig": {"InstanceType": "ml.m5.xlarge", "InstanceCount": hosts,
                           "VolumeSizeInGB": 30},
        "StoppingCondition": {"MaxRuntimeInSeconds": 600},
        "Environment": {k: str(v) for k, v in environment.items()},
        "Tags": [{"Key": "team", "Value": "research"}],
    }


def point_sdk_v2_at(monkeypatch, tmp_path: Path, variables: dict[str, str]) -> None:
    """SageMaker SDK v2 pointed at local endpoints by the environment alone (``variables``),
    with its telemetry, which calls AWS itself, off as a user without network would have it."""
    config = tmp_path / "sagemaker-config.yaml"
    config.write_text("SchemaVersion: '1.0'\nSageMaker:\n  PythonSDK:\n    Modules:\n"
                      "      TelemetryOptOut: true\n")
    for key, value in {**variables, "SAGEMAKER_USER_CONFIG_OVERRIDE": str(config),
                       "SAGEMAKER_SUPPRESS_V2_WARNING": "1"}.items():
        monkeypatch.setenv(key, value)


def stream_lines(logs, job: str) -> dict[str, list[str]]:
    streams = logs.describe_log_streams(logGroupName=GROUP, logStreamNamePrefix=f"{job}/",
                                        orderBy="LogStreamName", limit=50)
    assert "nextToken" not in streams  # SageMaker SDK v2 loops on it
    out = {}
    for s in streams["logStreams"]:
        host = s["logStreamName"].split("/")[1].rsplit("-", 1)[0]
        events = logs.get_log_events(logGroupName=GROUP, logStreamName=s["logStreamName"],
                                     startFromHead=True)["events"]
        out[host] = [e["message"] for e in events]
    return out


def test_boto3_submits_waits_describes_reads_logs_and_stops(server, code, tmp_path):
    sm, logs = server.client("sagemaker"), server.client("logs")
    arn = sm.create_training_job(**request("boto-job", code, tmp_path / "out"))["TrainingJobArn"]
    assert arn == "arn:aws:sagemaker:us-east-1:000000000000:training-job/boto-job"
    sm.get_waiter("training_job_completed_or_stopped").wait(
        TrainingJobName="boto-job", WaiterConfig={"Delay": 1, "MaxAttempts": 300})
    job = sm.describe_training_job(TrainingJobName="boto-job")
    assert (job["TrainingJobStatus"], job["SecondaryStatus"]) == ("Completed", "Completed")
    # a file:// output path gets the tree SageMaker writes on S3: <path>/<job>/output/
    assert job["ModelArtifacts"]["S3ModelArtifacts"] == \
        (tmp_path / "out" / "boto-job" / "output" / "model.tar.gz").as_uri()
    assert job["CreationTime"] <= job["TrainingStartTime"] <= job["TrainingEndTime"]
    assert [t["Status"] for t in job["SecondaryStatusTransitions"]] == [
        "Starting", "Downloading", "Training", "Uploading", "Completed"]
    lines = stream_lines(logs, "boto-job")
    assert set(lines) == {"algo-1", "algo-2"}
    for host, messages in lines.items():
        assert f"hello from {host}" in messages and f"to stderr from {host}" in messages
    assert sm.list_tags(ResourceArn=arn)["Tags"] == [{"Key": "team", "Value": "research"}]
    summaries = sm.list_training_jobs(StatusEquals="Completed")["TrainingJobSummaries"]
    assert [s["TrainingJobName"] for s in summaries] == ["boto-job"]

    sm.create_training_job(**request("boto-slow", code, tmp_path / "out", hosts=1, SLEEP=300))
    deadline = time.monotonic() + 120
    while sm.describe_training_job(TrainingJobName="boto-slow")["SecondaryStatus"] != "Training":
        assert time.monotonic() < deadline
        time.sleep(0.2)
    sm.stop_training_job(TrainingJobName="boto-slow")
    sm.get_waiter("training_job_completed_or_stopped").wait(
        TrainingJobName="boto-slow", WaiterConfig={"Delay": 1, "MaxAttempts": 120})
    assert sm.describe_training_job(TrainingJobName="boto-slow")["TrainingJobStatus"] == "Stopped"
    with pytest.raises(ClientError) as stopped_again:
        sm.stop_training_job(TrainingJobName="boto-slow")
    assert stopped_again.value.response["Error"]["Code"] == "ValidationException"


def test_a_failed_job_fails_the_waiter_and_says_why(server, code, tmp_path):
    sm = server.client("sagemaker")
    sm.create_training_job(**request("boto-fails", code, tmp_path / "out", hosts=1, EXIT=3))
    with pytest.raises(WaiterError, match="Failed"):
        sm.get_waiter("training_job_completed_or_stopped").wait(
            TrainingJobName="boto-fails", WaiterConfig={"Delay": 1, "MaxAttempts": 300})
    assert "exit" in sm.describe_training_job(TrainingJobName="boto-fails")["FailureReason"].lower()


@pytest.mark.parametrize("case, mutate, code_expected", [
    ("missing role", lambda r: r.pop("RoleArn"), "ValidationException"),
    ("bad name", lambda r: r.update(TrainingJobName="bad_name!"), "ValidationException"),
    ("long name", lambda r: r.update(TrainingJobName="a" * 64), "ValidationException"),
    ("custom image", lambda r: r["AlgorithmSpecification"].update(
        TrainingImage="111122223333.dkr.ecr.us-east-1.amazonaws.com/my-algo:latest"),
     "ValidationException"),
    ("count above the limit", lambda r: r["HyperParameters"].update(
        {f"k{i}": "v" for i in range(101)}), "ValidationException"),
])
def test_bad_requests_get_the_apis_errors_and_run_nothing(server, code, tmp_path, case, mutate,
                                                          code_expected):
    req = request("bad-job", code, tmp_path / "out")
    mutate(req)
    body = json.dumps(req).encode()
    answer = raw_call(server.url, "SageMaker.CreateTrainingJob", body)
    assert answer[0] == 400 and answer[1]["__type"] == code_expected, answer
    assert answer[1]["message"]
    assert not (tmp_path / "jobs" / "bad-job").exists()


def raw_call(url: str, target: str, body: bytes, headers: dict | None = None):
    """A call as any HTTP client makes it (botocore validates locally before sending, so
    requests it would refuse are sent raw to reach the endpoint's own checks)."""
    import urllib.error
    import urllib.request

    call = urllib.request.Request(url + "/", data=body, method="POST", headers={
        "X-Amz-Target": target, "Content-Type": "application/x-amz-json-1.1", **(headers or {})})
    try:
        with urllib.request.urlopen(call, timeout=30) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def test_duplicate_names_and_unknown_jobs_get_the_apis_errors(server, code, tmp_path):
    sm, logs = server.client("sagemaker"), server.client("logs")
    sm.create_training_job(**request("dup-job", code, tmp_path / "out", hosts=1))
    for name in ("dup-job", "DUP-JOB"):  # names are unique regardless of case, as ARNs are
        with pytest.raises(ClientError) as duplicate:
            sm.create_training_job(**request(name, code, tmp_path / "out", hosts=1))
        assert duplicate.value.response["Error"]["Code"] == "ResourceInUse"
    with pytest.raises(ClientError) as missing:
        sm.describe_training_job(TrainingJobName="no-such-job")
    assert missing.value.response["Error"] == {"Code": "ValidationException",
                                               "Message": "Requested resource not found."}
    with pytest.raises(logs.exceptions.ResourceNotFoundException):
        logs.get_log_events(logGroupName=GROUP, logStreamName="no-such-job/algo-1-1")
    sm.get_waiter("training_job_completed_or_stopped").wait(
        TrainingJobName="dup-job", WaiterConfig={"Delay": 1, "MaxAttempts": 300})


def test_signatures_are_required_when_an_access_key_is(tmp_path, code):
    s = Server(tmp_path / "jobs", env={"SHOAL_SERVE_SECRET_ACCESS_KEY": "s3cr3t"},
               args=("--access-key-id", "AKIDSHOAL"))
    try:
        good = s.client("sagemaker", key="AKIDSHOAL", secret="s3cr3t")
        assert good.list_training_jobs()["TrainingJobSummaries"] == []
        for key, secret, expected in (("AKIDSHOAL", "wrong", "InvalidSignatureException"),
                                      ("AKIDOTHER", "s3cr3t", "UnrecognizedClientException")):
            with pytest.raises(ClientError) as refused:
                s.client("sagemaker", key=key, secret=secret).create_training_job(
                    **request("unsigned-job", code, tmp_path / "out", hosts=1))
            assert refused.value.response["Error"]["Code"] == expected
        status, body = raw_call(s.url, "SageMaker.ListTrainingJobs", b"{}")
        assert (status, body["__type"]) == (403, "MissingAuthenticationTokenException")
        assert not (tmp_path / "jobs" / "unsigned-job").exists()
    finally:
        s.stop()


def test_listening_beyond_loopback_needs_an_access_key(tmp_path):
    done = subprocess.run([sys.executable, "-m", "shoal.cli", "serve", "--host", "0.0.0.0"],
                          env={**os.environ, "SHOAL_LOCAL_ROOT": str(tmp_path)},
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "--access-key-id" in done.stderr


@pytest.mark.skipif(shutil.which("aws") is None and not (Path(sys.executable).parent / "aws").exists(),
                    reason="the AWS CLI is not installed")
def test_the_aws_cli_submits_waits_describes_reads_logs_and_stops(server, code, tmp_path):
    aws = shutil.which("aws") or str(Path(sys.executable).parent / "aws")
    env = {**os.environ, **FAKE_KEYS, "AWS_ENDPOINT_URL_SAGEMAKER": server.url,
           "AWS_ENDPOINT_URL_CLOUDWATCH_LOGS": server.url, "AWS_CONFIG_FILE": "/dev/null"}

    def cli(*args, check=True):
        done = subprocess.run([aws, *args, "--output", "json"], env=env, capture_output=True,
                              text=True, timeout=300)
        assert not check or done.returncode == 0, done.stderr
        return json.loads(done.stdout) if done.stdout.strip() else done

    spec = tmp_path / "job.json"
    spec.write_text(json.dumps(request("cli-job", code, tmp_path / "out")))
    created = cli("sagemaker", "create-training-job", "--cli-input-json", spec.as_uri())
    assert created["TrainingJobArn"].endswith(":training-job/cli-job")
    # the CLI's waiter polls every 120 s: it is asked once the job has ended, and must then
    # return at its first poll (the in-progress polling is the same waiter, run by boto3 above)
    sm = server.client("sagemaker")
    sm.get_waiter("training_job_completed_or_stopped").wait(
        TrainingJobName="cli-job", WaiterConfig={"Delay": 1, "MaxAttempts": 300})
    started = time.monotonic()
    cli("sagemaker", "wait", "training-job-completed-or-stopped", "--training-job-name", "cli-job")
    assert time.monotonic() - started < 60
    described = cli("sagemaker", "describe-training-job", "--training-job-name", "cli-job")
    assert described["TrainingJobStatus"] == "Completed"
    streams = cli("logs", "describe-log-streams", "--log-group-name", GROUP,
                  "--log-stream-name-prefix", "cli-job/")["logStreams"]
    assert len(streams) == 2
    events = cli("logs", "get-log-events", "--log-group-name", GROUP, "--log-stream-name",
                 streams[1]["logStreamName"], "--start-from-head")["events"]
    assert "hello from algo-2" in [e["message"] for e in events]
    found = cli("logs", "filter-log-events", "--log-group-name", GROUP,
                "--log-stream-name-prefix", "cli-job/", "--filter-pattern", '"hello from"')
    assert sorted(e["message"] for e in found["events"]) == ["hello from algo-1",
                                                              "hello from algo-2"]
    listed = cli("sagemaker", "list-training-jobs", "--name-contains", "cli")
    assert [j["TrainingJobName"] for j in listed["TrainingJobSummaries"]] == ["cli-job"]

    spec.write_text(json.dumps(request("cli-slow", code, tmp_path / "out", hosts=1, SLEEP=300)))
    cli("sagemaker", "create-training-job", "--cli-input-json", spec.as_uri())
    deadline = time.monotonic() + 120
    while sm.describe_training_job(TrainingJobName="cli-slow")["SecondaryStatus"] != "Training":
        assert time.monotonic() < deadline
        time.sleep(0.2)
    cli("sagemaker", "stop-training-job", "--training-job-name", "cli-slow")
    sm.get_waiter("training_job_completed_or_stopped").wait(
        TrainingJobName="cli-slow", WaiterConfig={"Delay": 1, "MaxAttempts": 120})
    cli("sagemaker", "wait", "training-job-completed-or-stopped", "--training-job-name", "cli-slow")
    bad = cli("sagemaker", "describe-training-job", "--training-job-name", "nope", check=False)
    assert bad.returncode != 0 and "ValidationException" in bad.stderr


def test_sagemaker_sdk_v2_pytorch_fit_with_two_instances_and_s3_data(tmp_path, code, local_s3,
                                                                      monkeypatch, capsys):
    """SDK v2, unchanged, pointed at the endpoint by the environment alone: its S3 uploads,
    STS and the job's own S3 reads and writes go to a local S3 server; fit(logs=True)
    follows both hosts' streams until the job completes."""
    sagemaker = pytest.importorskip("sagemaker")
    from sagemaker.pytorch import PyTorch

    aws = {**FAKE_KEYS, "AWS_ENDPOINT_URL_S3": local_s3}
    s = Server(tmp_path / "jobs", env=aws)
    try:
        point_sdk_v2_at(monkeypatch, tmp_path, {**aws, "AWS_ENDPOINT_URL_SAGEMAKER": s.url,
                                                "AWS_ENDPOINT_URL_CLOUDWATCH_LOGS": s.url})
        s3 = boto3.client("s3", region_name="us-east-1")
        s3.create_bucket(Bucket="training-data")
        for name in ("a.csv", "b.csv"):
            s3.put_object(Bucket="training-data", Key=f"digits/{name}", Body=b"1,2\n")
        # a named bucket: the SDK's default one is named from STS, which it calls at a fixed
        # regional URL (no endpoint variable reaches it)
        session = sagemaker.Session(boto3.Session(region_name="us-east-1"),
                                    default_bucket="sagemaker-local-artifacts")
        estimator = PyTorch(entry_point="train.py", source_dir=str(code), role=ROLE,
                            instance_count=2, instance_type="ml.m5.xlarge",
                            framework_version="2.0.1", py_version="py310",
                            sagemaker_session=session, base_job_name="sdk-v2")
        estimator.fit({"train": "s3://training-data/digits"}, logs=True)
        printed = capsys.readouterr().out
        job = estimator.latest_training_job.describe()
        assert job["TrainingJobStatus"] == "Completed"
        model = estimator.model_data
        assert model.startswith(f"s3://{session.default_bucket()}/") and model.endswith(
            f"{job['TrainingJobName']}/output/model.tar.gz")
        bucket, key = model[len("s3://"):].split("/", 1)
        s3.head_object(Bucket=bucket, Key=key)
        for host in ("algo-1", "algo-2"):  # every host's lines, as the SDK prints them
            assert f"hello from {host}" in printed
            assert f"{host} sees ['a.csv', 'b.csv']" in printed
    finally:
        s.stop()


def test_shoals_own_sdk_runs_a_sagemaker_job_through_the_endpoint(tmp_path, code, local_s3,
                                                                   monkeypatch, capsys):
    """Shoal's estimator with a SageMaker instance type, pointed at the endpoint by the same
    variables: staging to S3, the request, and its own log follower, unchanged."""
    import shoal

    aws = {**FAKE_KEYS, "AWS_ENDPOINT_URL_S3": local_s3, "AWS_ENDPOINT_URL_STS": local_s3}
    s = Server(tmp_path / "jobs", env=aws)
    try:
        for key, value in {**aws, "AWS_ENDPOINT_URL_SAGEMAKER": s.url,
                           "AWS_ENDPOINT_URL_CLOUDWATCH_LOGS": s.url}.items():
            monkeypatch.setenv(key, value)
        boto3.client("s3", region_name="us-east-1").create_bucket(Bucket="shoal-out")
        estimator = shoal.PyTorch(entry_point="train.py", source_dir=str(code), role=ROLE,
                                  instance_type="ml.m5.xlarge", instance_count=2,
                                  image_uri=IMAGE, output_path="s3://shoal-out/jobs",
                                  code_location="s3://shoal-out/code",
                                  sagemaker_session=shoal.Session(
                                      boto3.Session(region_name="us-east-1")))
        estimator.fit(job_name="shoal-sdk-job", logs=True)
        printed = capsys.readouterr()
        job = estimator.latest_training_job.describe()
        assert job["TrainingJobStatus"] == "Completed"
        assert estimator.model_data == "s3://shoal-out/jobs/shoal-sdk-job/output/model.tar.gz"
        boto3.client("s3", region_name="us-east-1").head_object(
            Bucket="shoal-out", Key="jobs/shoal-sdk-job/output/model.tar.gz")
        both = printed.out + printed.err
        assert "hello from algo-1" in both and "hello from algo-2" in both
    finally:
        s.stop()


def test_a_restarted_server_knows_every_job_and_a_running_job_survives_it(tmp_path, code):
    first = Server(tmp_path / "jobs")
    try:
        sm = first.client("sagemaker")
        sm.create_training_job(**request("done-before", code, tmp_path / "out", hosts=1))
        sm.get_waiter("training_job_completed_or_stopped").wait(
            TrainingJobName="done-before", WaiterConfig={"Delay": 1, "MaxAttempts": 300})
        sm.create_training_job(**request("spans-restart", code, tmp_path / "out", hosts=2,
                                         SLEEP=8))
        deadline = time.monotonic() + 120
        while sm.describe_training_job(TrainingJobName="spans-restart")["SecondaryStatus"] != "Training":
            assert time.monotonic() < deadline
            time.sleep(0.2)
    finally:
        first.stop()
    second = Server(tmp_path / "jobs")
    try:
        sm, logs = second.client("sagemaker"), second.client("logs")
        assert sm.describe_training_job(TrainingJobName="spans-restart")["TrainingJobStatus"] == \
            "InProgress"
        sm.get_waiter("training_job_completed_or_stopped").wait(
            TrainingJobName="spans-restart", WaiterConfig={"Delay": 1, "MaxAttempts": 300})
        names = sorted(j["TrainingJobName"] for j in
                       sm.list_training_jobs(StatusEquals="Completed")["TrainingJobSummaries"])
        assert names == ["done-before", "spans-restart"]
        lines = stream_lines(logs, "spans-restart")
        assert all(f"hello from {h}" in lines[h] for h in ("algo-1", "algo-2"))
    finally:
        second.stop()


def test_the_shoal_cli_and_the_endpoint_see_the_same_jobs(server, code, tmp_path):
    sm = server.client("sagemaker")
    sm.create_training_job(**request("seen-both", code, tmp_path / "out", hosts=2))
    sm.get_waiter("training_job_completed_or_stopped").wait(
        TrainingJobName="seen-both", WaiterConfig={"Delay": 1, "MaxAttempts": 300})
    env = {**os.environ, "SHOAL_LOCAL_ROOT": str(tmp_path / "jobs")}

    def shoal(*args):
        done = subprocess.run([sys.executable, "-m", "shoal.cli", *args], env=env,
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        return done.stdout

    listed = json.loads(shoal("list", "--output", "json"))
    assert [j["Handle"] for j in listed] == ["local://seen-both"]
    assert json.loads(shoal("status", "local://seen-both", "--output", "json"))[
        "TrainingJobStatus"] == "Completed"
    printed = shoal("logs", "local://seen-both")
    assert "hello from algo-1" in printed and "hello from algo-2" in printed

    sm.create_training_job(**request("stopped-by-cli", code, tmp_path / "out", hosts=1,
                                     SLEEP=300))
    deadline = time.monotonic() + 120
    while sm.describe_training_job(TrainingJobName="stopped-by-cli")["SecondaryStatus"] != "Training":
        assert time.monotonic() < deadline
        time.sleep(0.2)
    shoal("stop", "local://stopped-by-cli", "--wait")
    assert sm.describe_training_job(TrainingJobName="stopped-by-cli")["TrainingJobStatus"] == \
        "Stopped"
