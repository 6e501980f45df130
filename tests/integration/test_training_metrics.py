"""Training metrics end to end: a real local job on two hosts prints metric lines, and
``shoal serve`` answers DescribeTrainingJob's FinalMetricDataList and CloudWatch's
GetMetricStatistics from them with boto3, unchanged; the datapoints outlive the server."""

from __future__ import annotations

import datetime as dt

import pytest
from botocore.exceptions import ClientError

from tests.integration.test_server_clients import Server, request

pytestmark = [pytest.mark.slow]

TRAIN = """
import os
host = os.environ["SM_CURRENT_HOST"]
rank = int(host.split("-")[1])
for step in range(3):
    print(f"step={step} loss={1.0 / (step + rank):.4f} acc: {0.25 * step}", flush=True)
print("loss=not-a-number", flush=True)
"""
DEFS = [{"Name": "train:loss", "Regex": r"loss=([0-9.eE+-]+)"},
        {"Name": "acc", "Regex": r"acc: (\S+)"}]


def test_a_jobs_printed_metrics_reach_describe_and_cloudwatch(tmp_path):
    code = tmp_path / "code"
    code.mkdir()
    (code / "train.py").write_text(TRAIN)
    params = request("metrics-job", code, tmp_path / "out")
    params["AlgorithmSpecification"]["MetricDefinitions"] = DEFS
    server = Server(tmp_path / "jobs")
    try:
        sm = server.client("sagemaker")
        bad = request("metrics-bad", code, tmp_path / "out")
        bad["AlgorithmSpecification"]["MetricDefinitions"] = [{"Name": "l", "Regex": "loss=\\S+"}]
        with pytest.raises(ClientError, match="must have a capture group") as refused:
            sm.create_training_job(**bad)
        assert refused.value.response["Error"]["Code"] == "ValidationException"
        sm.create_training_job(**params)
        sm.get_waiter("training_job_completed_or_stopped").wait(
            TrainingJobName="metrics-job", WaiterConfig={"Delay": 1, "MaxAttempts": 120})
    finally:
        server.stop()
    server = Server(tmp_path / "jobs")  # a fresh process: the datapoints are on disk
    try:
        job = server.client("sagemaker").describe_training_job(TrainingJobName="metrics-job")
        assert job["TrainingJobStatus"] == "Completed", job.get("FailureReason")
        assert job["AlgorithmSpecification"]["MetricDefinitions"] == DEFS
        final = {m["MetricName"]: m for m in job["FinalMetricDataList"]}
        assert list(final) == ["train:loss", "acc"]
        assert final["train:loss"]["Value"] in (0.3333, 0.25)  # the host that printed last
        assert final["acc"]["Value"] == 0.5
        assert job["TrainingStartTime"] <= final["acc"]["Timestamp"] <= job["TrainingEndTime"]
        points = server.client("cloudwatch").get_metric_statistics(
            Namespace="/aws/sagemaker/TrainingJobs", MetricName="train:loss",
            Dimensions=[{"Name": "TrainingJobName", "Value": "metrics-job"}],
            StartTime=job["TrainingStartTime"],
            EndTime=job["TrainingEndTime"] + dt.timedelta(minutes=1), Period=60,
            Statistics=["SampleCount", "Minimum", "Maximum"])["Datapoints"]
        assert sum(p["SampleCount"] for p in points) == 6  # 3 per host; "not-a-number" dropped
        assert min(p["Minimum"] for p in points) == 0.25
        assert max(p["Maximum"] for p in points) == 1.0
    finally:
        server.stop()
