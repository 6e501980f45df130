"""CloudWatch Logs tailing: discovery, incremental reads, interleaving, trouble."""

import time

import boto3
import pytest
from botocore.exceptions import ClientError
from botocore.stub import Stubber
from moto import mock_aws
from shoal.errors import PermissionError_
from shoal.logs import LOG_GROUP, LogEvent, LogTailer, format_event, host_of, interleave

REGION = "us-west-2"
JOB = "pt-job-1"
NOW = int(time.time() * 1000)  # CloudWatch refuses events older than 14 days


def put(client, stream, events):
    client.put_log_events(
        logGroupName=LOG_GROUP,
        logStreamName=stream,
        logEvents=[{"timestamp": NOW + t, "message": m} for t, m in events],
    )


@pytest.fixture
def cw():
    with mock_aws():
        client = boto3.client("logs", region_name=REGION)
        client.create_log_group(logGroupName=LOG_GROUP)
        for host in (1, 2):
            client.create_log_stream(logGroupName=LOG_GROUP, logStreamName=f"{JOB}/algo-{host}-17")
        yield client


def test_host_of():
    assert host_of(f"{JOB}/algo-1-1700000000", JOB) == "algo-1"
    assert host_of(f"{JOB}/algo-12-1700000000", JOB) == "algo-12"
    assert host_of(f"{JOB}/algo-3", JOB) == "algo-3"
    assert host_of(f"{JOB}/custom", JOB) == "custom"


def test_format_event_prefixes_host_and_drops_newline():
    assert format_event(LogEvent(1, "algo-2", "loss=0.5\n")) == "[algo-2] loss=0.5"


def test_interleave_is_stable_on_ties():
    a = [LogEvent(1, "algo-1", "a1"), LogEvent(3, "algo-1", "a3")]
    b = [LogEvent(1, "algo-2", "b1"), LogEvent(2, "algo-2", "b2")]
    assert [e.message for e in interleave([a, b])] == ["a1", "b1", "b2", "a3"]


def test_two_hosts_interleaved_and_incremental(cw):
    put(cw, f"{JOB}/algo-1-17", [(1000, "h1 start"), (3000, "h1 epoch 1")])
    put(cw, f"{JOB}/algo-2-17", [(2000, "h2 start"), (4000, "h2 epoch 1")])
    tailer = LogTailer(cw, JOB, instance_count=2)
    lines = [format_event(e) for e in tailer.poll()]
    assert lines == [
        "[algo-1] h1 start",
        "[algo-2] h2 start",
        "[algo-1] h1 epoch 1",
        "[algo-2] h2 epoch 1",
    ]
    assert tailer.poll() == []
    put(cw, f"{JOB}/algo-2-17", [(5000, "h2 done")])
    assert [format_event(e) for e in tailer.poll()] == ["[algo-2] h2 done"]


def test_streams_appearing_later_are_found(cw):
    tailer = LogTailer(cw, JOB, instance_count=3)
    assert tailer.poll() == []
    cw.create_log_stream(logGroupName=LOG_GROUP, logStreamName=f"{JOB}/algo-3-17")
    put(cw, f"{JOB}/algo-3-17", [(10, "late host")])
    assert [format_event(e) for e in tailer.poll()] == ["[algo-3] late host"]


def test_other_jobs_streams_are_not_read(cw):
    cw.create_log_stream(logGroupName=LOG_GROUP, logStreamName=f"{JOB}-2/algo-1-17")
    put(cw, f"{JOB}-2/algo-1-17", [(1, "someone else")])
    assert LogTailer(cw, JOB, instance_count=2).poll() == []


def test_missing_log_group_means_no_output_yet():
    with mock_aws():
        client = boto3.client("logs", region_name=REGION)
        tailer = LogTailer(client, JOB)
        assert tailer.poll() == []
        assert tailer.last_error is None


def test_throttling_is_reported_not_raised_and_nothing_is_lost(cw):
    put(cw, f"{JOB}/algo-1-17", [(1000, "one")])
    put(cw, f"{JOB}/algo-2-17", [(2000, "two")])
    calls = {"n": 0}

    def throttle_second(params, **_):
        calls["n"] += 1
        if calls["n"] == 2:
            raise ClientError(
                {"Error": {"Code": "ThrottlingException", "Message": "Rate exceeded"}},
                "GetLogEvents",
            )

    cw.meta.events.register("provide-client-params.logs.GetLogEvents", throttle_second)
    tailer = LogTailer(cw, JOB, instance_count=2)
    first = tailer.poll()
    assert tailer.last_error is not None
    assert [e.message for e in first] == ["one"]
    second = tailer.poll()
    assert tailer.last_error is None
    assert [e.message for e in second] == ["two"]


def test_access_denied_is_raised_as_permission_error():
    client = boto3.client("logs", region_name=REGION)
    with Stubber(client) as stub:
        stub.add_client_error("describe_log_streams", "AccessDeniedException", "no")
        with pytest.raises(PermissionError_):
            LogTailer(client, JOB).poll()


def test_stream_pages_are_followed():
    client = boto3.client("logs", region_name=REGION)
    prefix = {"logGroupName": LOG_GROUP, "logStreamNamePrefix": JOB + "/", "orderBy": "LogStreamName"}
    with Stubber(client) as stub:
        stub.add_response(
            "describe_log_streams",
            {"logStreams": [{"logStreamName": f"{JOB}/algo-1-1"}], "nextToken": "p2"},
            prefix,
        )
        stub.add_response(
            "describe_log_streams",
            {"logStreams": [{"logStreamName": f"{JOB}/algo-2-1"}]},
            {**prefix, "nextToken": "p2"},
        )
        for host in (1, 2):
            stub.add_response(
                "get_log_events",
                {"events": [{"timestamp": host, "message": f"m{host}"}], "nextForwardToken": "f1"},
                {"logGroupName": LOG_GROUP, "logStreamName": f"{JOB}/algo-{host}-1", "startFromHead": True},
            )
            stub.add_response(
                "get_log_events",
                {"events": [], "nextForwardToken": "f1"},
                {
                    "logGroupName": LOG_GROUP,
                    "logStreamName": f"{JOB}/algo-{host}-1",
                    "startFromHead": True,
                    "nextToken": "f1",
                },
            )
        events = LogTailer(client, JOB, instance_count=2).poll()
        stub.assert_no_pending_responses()
    assert [format_event(e) for e in events] == ["[algo-1] m1", "[algo-2] m2"]
