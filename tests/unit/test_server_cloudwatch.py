"""``shoal serve``'s CloudWatch metrics API with a real boto3 client (JSON 1.0, as botocore sends
it): GetMetricStatistics buckets a job's datapoints by Period from StartTime under the exact
``[TrainingJobName]`` dimension set, ListMetrics names them, GetMetricData gives the series;
DescribeTrainingJob carries FinalMetricDataList; SageMaker SDK v2's TrainingJobAnalytics reads
them unchanged."""

from __future__ import annotations

import contextlib
import datetime as dt
import threading
import time

import boto3
import pytest
from botocore.exceptions import ClientError
from shoal.local import layout, metrics, state
from shoal.server import app

T0 = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)
NS = "/aws/sagemaker/TrainingJobs"
JOB = "metrics-job"
DEFS = [{"Name": "loss", "Regex": r"loss=(\S+)"}, {"Name": "acc", "Regex": r"acc=(\S+)"}]
# (host, seconds after T0, line)
LINES = [("algo-1", 1, "loss=0.9"), ("algo-1", 10, "acc=0.1"), ("algo-1", 30, "loss=0.7"),
         ("algo-1", 70, "loss=0.5"), ("algo-2", 65, "loss=0.6"), ("algo-1", 130, "loss=0.3")]
KEYS = {"region_name": "us-east-1", "aws_access_key_id": "testing",
        "aws_secret_access_key": "testing"}


def make_job(root, name: str = JOB, lines=LINES) -> None:
    request = {"TrainingJobName": name, "RoleArn": "arn:aws:iam::111122223333:role/R",
               "AlgorithmSpecification": {"TrainingImage": "img", "TrainingInputMode": "File",
                                          "MetricDefinitions": DEFS},
               "ResourceConfig": {"InstanceType": "local", "InstanceCount": 2,
                                  "VolumeSizeInGB": 30}}
    paths = layout.JobPaths(root / name)
    paths.job_dir.mkdir(parents=True)
    record = state.transition(state.transition(state.initial(request), "Training"), "Completed")
    record["TrainingStartTime"], record["TrainingEndTime"] = T0, T0 + dt.timedelta(seconds=200)
    state.write(paths.state_file, record)
    recorder = metrics.Recorder(paths.job_dir, metrics.definitions(request))
    for host, seconds, line in lines:
        recorder.feed(host, line, int((T0.timestamp() + seconds) * 1000))
    recorder.close()


@contextlib.contextmanager
def serving(root, verifier=None):
    """``shoal serve``'s app in this process, on a free loopback port."""
    import uvicorn

    sock = app.bind("127.0.0.1", 0)
    server = uvicorn.Server(uvicorn.Config(app.create_app(app.Endpoint(root, verifier=verifier)),
                                           log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    try:
        yield app.url_of(sock)
    finally:
        server.should_exit = True
        thread.join(10)


@pytest.fixture(scope="module")
def url(tmp_path_factory):
    root = tmp_path_factory.mktemp("jobs")
    make_job(root)
    make_job(root, "other-job", [("algo-1", 5, "loss=9")])
    with serving(root) as served:
        yield served


@pytest.fixture
def cw(url):
    return boto3.client("cloudwatch", endpoint_url=url, **KEYS)


def stats(cw, job=JOB, **extra):
    params = {"Namespace": NS, "MetricName": "loss", "StartTime": T0,
              "Dimensions": [{"Name": "TrainingJobName", "Value": job}],
              "EndTime": T0 + dt.timedelta(seconds=260), "Period": 60, "Statistics": ["Average"],
              **extra}
    return cw.get_metric_statistics(**{k: v for k, v in params.items() if v is not None})


def test_get_metric_statistics_buckets_by_period_from_the_start(cw):
    out = stats(cw, Statistics=["Average", "SampleCount", "Minimum", "Maximum", "Sum"])
    assert out["Label"] == "loss"
    points = sorted(out["Datapoints"], key=lambda p: p["Timestamp"])
    assert [p["Timestamp"] for p in points] == [T0 + dt.timedelta(seconds=s) for s in (0, 60, 120)]
    assert [p["Average"] for p in points] == pytest.approx([0.8, 0.55, 0.3])
    assert [p["SampleCount"] for p in points] == [2.0, 2.0, 1.0]
    assert (points[1]["Minimum"], points[1]["Maximum"]) == (0.5, 0.6)
    assert points[0]["Sum"] == pytest.approx(1.6) and points[0]["Unit"] == "None"


def test_only_the_asked_statistics_and_the_window_count(cw):
    out = stats(cw, StartTime=T0 + dt.timedelta(seconds=60), Statistics=["Maximum"])
    assert [sorted(p) for p in out["Datapoints"]] == [["Maximum", "Timestamp", "Unit"]] * 2
    percentile = stats(cw, Statistics=None, ExtendedStatistics=["p50"])["Datapoints"]
    assert sorted(p["ExtendedStatistics"]["p50"] for p in percentile) == [0.3, 0.5, 0.7]


@pytest.mark.parametrize("change", [
    {"Dimensions": [{"Name": "TrainingJobName", "Value": JOB}, {"Name": "Host", "Value": "x"}]},
    {"Dimensions": []}, {"Namespace": "AWS/EC2"}, {"MetricName": "nope"},
])
def test_another_dimension_set_or_namespace_has_no_datapoints(cw, change):
    assert stats(cw, **change)["Datapoints"] == []
    assert stats(cw, "no-such-job")["Datapoints"] == []


@pytest.mark.parametrize("change, code", [
    ({"Statistics": None}, "InvalidParameterCombination"),
    ({"ExtendedStatistics": ["p90"]}, "InvalidParameterCombination"),
    ({"Period": 90}, "InvalidParameterValue"),
    ({"EndTime": T0}, "InvalidParameterValue"),
])
def test_bad_parameters_get_cloudwatchs_errors(cw, change, code):
    with pytest.raises(ClientError) as caught:
        stats(cw, **change)
    assert caught.value.response["Error"]["Code"] == code


def test_list_metrics_names_each_jobs_metrics(cw):
    listed = cw.list_metrics(Namespace=NS)["Metrics"]
    assert sorted((m["MetricName"], m["Dimensions"][0]["Value"]) for m in listed) == [
        ("acc", JOB), ("loss", JOB), ("loss", "other-job")]
    assert all(m["Dimensions"][0]["Name"] == "TrainingJobName" for m in listed)
    only = cw.list_metrics(Namespace=NS, MetricName="loss",
                           Dimensions=[{"Name": "TrainingJobName", "Value": "other-job"}])
    assert [m["MetricName"] for m in only["Metrics"]] == ["loss"]
    assert cw.list_metrics(Namespace="AWS/EC2")["Metrics"] == []


def test_get_metric_data_gives_the_series_newest_first(cw):
    metric = {"Namespace": NS, "MetricName": "loss",
              "Dimensions": [{"Name": "TrainingJobName", "Value": JOB}]}
    out = cw.get_metric_data(
        MetricDataQueries=[{"Id": "l", "MetricStat": {"Metric": metric, "Period": 60,
                                                      "Stat": "Minimum"}},
                           {"Id": "hidden", "ReturnData": False,
                            "MetricStat": {"Metric": metric, "Period": 60, "Stat": "Sum"}}],
        StartTime=T0, EndTime=T0 + dt.timedelta(minutes=5))
    [result] = out["MetricDataResults"]
    assert (result["Id"], result["StatusCode"], result["Values"]) == ("l", "Complete",
                                                                      [0.3, 0.5, 0.7])
    assert result["Timestamps"][0] == T0 + dt.timedelta(seconds=120)


def test_describe_through_the_endpoint_carries_the_final_metrics(url):
    sm = boto3.client("sagemaker", endpoint_url=url, **KEYS)
    job = sm.describe_training_job(TrainingJobName=JOB)
    assert job["AlgorithmSpecification"]["MetricDefinitions"] == DEFS
    assert [(m["MetricName"], m["Value"], m["Timestamp"]) for m in job["FinalMetricDataList"]] == [
        ("loss", 0.3, T0 + dt.timedelta(seconds=130)), ("acc", 0.1, T0 + dt.timedelta(seconds=10))]


def test_sagemaker_sdk_v2_training_job_analytics_reads_them(url, monkeypatch):
    sagemaker = pytest.importorskip("sagemaker", reason="SageMaker Python SDK v2 not installed")
    from sagemaker.analytics import TrainingJobAnalytics

    monkeypatch.setenv("AWS_ENDPOINT_URL", url)
    session = sagemaker.Session(boto_session=boto3.Session(**KEYS))
    frame = TrainingJobAnalytics(JOB, sagemaker_session=session).dataframe()
    rows = list(zip(frame["timestamp"], frame["metric_name"], frame["value"]))
    assert rows == [(0.0, "loss", pytest.approx(0.8)), (60.0, "loss", pytest.approx(0.55)),
                    (120.0, "loss", 0.3), (0.0, "acc", 0.1)]


def test_a_signing_endpoint_checks_cloudwatchs_signatures(tmp_path):
    from shoal.server.signing import Verifier

    make_job(tmp_path)
    with serving(tmp_path, Verifier("AKIDSHOALTEST0000001", "secret")) as served:
        good = boto3.client("cloudwatch", endpoint_url=served, region_name="us-east-1",
                            aws_access_key_id="AKIDSHOALTEST0000001", aws_secret_access_key="secret")
        assert len(stats(good)["Datapoints"]) == 3
        bad = boto3.client("cloudwatch", endpoint_url=served, **KEYS)
        with pytest.raises(ClientError) as caught:
            stats(bad)
        assert caught.value.response["ResponseMetadata"]["HTTPStatusCode"] == 403
