"""The CloudWatch Logs API over the local jobs' stream files: DescribeLogStreams names each
host's stream ``<job>/algo-N-<epoch of its first line>`` and gives a nextToken only while
streams remain; GetLogEvents pages forward and backward, hands back the token it was given at
the end of a stream and picks up lines appended later; FilterLogEvents merges the hosts'
events by time, filters on terms and pages with a nextToken that is absent at the end. A line
still being written is not an event yet."""

from __future__ import annotations

import pytest
from shoal.local.log_streams import LOG_GROUP, StreamWriter, stream_file
from shoal.server.api_errors import InvalidParameterException, LogsResourceNotFound
from shoal.server.logs_api import LogsApi

T0 = 1_790_000_000  # whole seconds: the first line of algo-1
JOB = "job"
# (host, seconds after T0, line); algo-2 starts later, so its stream has another epoch
LINES = [
    ("algo-1", 0.0, "[algo-1] starting epoch 1"),
    ("algo-1", 2.0, "loss=0.9 step 1"),
    ("algo-2", 3.25, "worker ready"),
    ("algo-1", 4.0, "loss=0.5 step 2"),
    ("algo-2", 5.5, "loss=0.7 step 2 warning: slow"),
    ("algo-1", 6.0, "training complete"),
]
STREAM_1 = f"{JOB}/algo-1-{T0}"
STREAM_2 = f"{JOB}/algo-2-{T0 + 3}"


def ms(seconds: float) -> int:
    return int((T0 + seconds) * 1000)


@pytest.fixture
def root(tmp_path):
    writer = StreamWriter(tmp_path / JOB)
    for host, at, line in LINES:
        writer.write(host, line, at=T0 + at)
    writer.close()
    other = StreamWriter(tmp_path / "jobx")  # shares the prefix "job" but not "job/"
    other.write("algo-1", "another job", at=T0 + 100)
    other.close()
    return tmp_path


@pytest.fixture
def api(root):
    return LogsApi(root)


def group(**params) -> dict:
    return {"logGroupName": LOG_GROUP, **params}


def messages(events) -> list[str]:
    return [e["message"] for e in events]


def host_lines(host: str) -> list[tuple[int, str]]:
    return [(ms(at), line.removeprefix(f"[{host}] ")) for h, at, line in LINES if h == host]


# -- DescribeLogStreams ----------------------------------------------------------------------
def test_describe_log_streams_names_each_hosts_stream(api):
    out = api.DescribeLogStreams(group(logStreamNamePrefix=f"{JOB}/"))
    assert [s["logStreamName"] for s in out["logStreams"]] == [STREAM_1, STREAM_2]
    assert "nextToken" not in out  # the SDK loops for as long as one is present
    first = out["logStreams"][0]
    assert first["firstEventTimestamp"] == first["creationTime"] == ms(0)
    assert first["lastEventTimestamp"] == ms(6)
    assert first["arn"].endswith(f"log-stream:{STREAM_1}")


def test_describe_log_streams_without_a_slash_matches_job_name_prefixes(api):
    out = api.DescribeLogStreams(group(logStreamNamePrefix=JOB))
    assert [s["logStreamName"] for s in out["logStreams"]] == [
        STREAM_1, STREAM_2, f"jobx/algo-1-{T0 + 100}"]


def test_describe_log_streams_pages_with_a_next_token(api):
    first = api.DescribeLogStreams(group(logStreamNamePrefix=f"{JOB}/", limit=1))
    assert [s["logStreamName"] for s in first["logStreams"]] == [STREAM_1]
    assert "nextToken" in first
    second = api.DescribeLogStreams(group(logStreamNamePrefix=f"{JOB}/", limit=1,
                                          nextToken=first["nextToken"]))
    assert [s["logStreamName"] for s in second["logStreams"]] == [STREAM_2]
    assert "nextToken" not in second


def test_describe_log_streams_descending(api):
    out = api.DescribeLogStreams(group(logStreamNamePrefix=f"{JOB}/", descending=True))
    assert [s["logStreamName"] for s in out["logStreams"]] == [STREAM_2, STREAM_1]


def test_describe_log_streams_by_last_event_time(api):
    out = api.DescribeLogStreams(group(orderBy="LastEventTime", descending=True))
    names = [s["logStreamName"] for s in out["logStreams"]]
    assert names == [f"jobx/algo-1-{T0 + 100}", STREAM_1, STREAM_2]


def test_ordering_by_last_event_time_with_a_prefix_is_refused(api):
    with pytest.raises(InvalidParameterException):
        api.DescribeLogStreams(group(logStreamNamePrefix=f"{JOB}/", orderBy="LastEventTime"))


def test_an_unknown_log_group_is_not_found(api):
    with pytest.raises(LogsResourceNotFound) as caught:
        api.DescribeLogStreams({"logGroupName": "/aws/sagemaker/Endpoints"})
    assert caught.value.code == "ResourceNotFoundException"


def test_a_log_group_given_by_its_arn_is_found(api):
    out = api.DescribeLogStreams({"logGroupIdentifier": f"arn:aws:logs:us-east-1:000000000000:"
                                                        f"log-group:{LOG_GROUP}",
                                  "logStreamNamePrefix": f"{JOB}/"})
    assert len(out["logStreams"]) == 2


def test_a_job_without_streams_has_none(api, root):
    (root / "empty-job").mkdir()
    assert api.DescribeLogStreams(group(logStreamNamePrefix="empty-job/")) == {"logStreams": []}


@pytest.mark.parametrize("prefix", ["../", "./", "/"])
def test_describe_log_streams_never_lists_outside_the_jobs(tmp_path, prefix):
    root = tmp_path / "root"
    # a job's stream, and stream files in <root>/../streams and <root>/streams: no job's
    for job_dir, host in ((root / JOB, "algo-1"), (tmp_path, "algo-1"), (root, "algo-9")):
        writer = StreamWriter(job_dir)
        writer.write(host, f"a line in {job_dir}", at=T0)
        writer.close()
    api = LogsApi(root)
    assert api.DescribeLogStreams(group(logStreamNamePrefix=prefix)) == {"logStreams": []}
    assert [s["logStreamName"] for s in api.DescribeLogStreams(group())["logStreams"]] == [
        f"{JOB}/algo-1-{T0}"]


def test_a_bad_describe_token_is_refused(api):
    with pytest.raises(InvalidParameterException):
        api.DescribeLogStreams(group(nextToken="garbage"))


# -- GetLogEvents ----------------------------------------------------------------------------
def test_get_log_events_from_the_head(api):
    out = api.GetLogEvents(group(logStreamName=STREAM_1, startFromHead=True))
    assert [(e["timestamp"], e["message"]) for e in out["events"]] == host_lines("algo-1")
    assert messages(out["events"])[0] == "starting epoch 1"  # the host tag is the stream's


def test_the_forward_token_at_the_end_gives_an_empty_page_and_itself(api):
    out = api.GetLogEvents(group(logStreamName=STREAM_1, startFromHead=True))
    token = out["nextForwardToken"]
    end = api.GetLogEvents(group(logStreamName=STREAM_1, startFromHead=True, nextToken=token))
    assert end["events"] == [] and end["nextForwardToken"] == token
    again = api.GetLogEvents(group(logStreamName=STREAM_1, startFromHead=True, nextToken=token))
    assert again["events"] == [] and again["nextForwardToken"] == token


def test_lines_appended_later_come_with_the_same_token(api, root):
    token = api.GetLogEvents(group(logStreamName=STREAM_1, startFromHead=True))["nextForwardToken"]
    writer = StreamWriter(root / JOB)
    writer.write("algo-1", "late line 1", at=T0 + 7)
    writer.write("algo-1", "late line 2", at=T0 + 8)
    writer.close()
    out = api.GetLogEvents(group(logStreamName=STREAM_1, startFromHead=True, nextToken=token))
    assert [(e["timestamp"], e["message"]) for e in out["events"]] == [
        (ms(7), "late line 1"), (ms(8), "late line 2")]
    end = api.GetLogEvents(group(logStreamName=STREAM_1, nextToken=out["nextForwardToken"]))
    assert end["events"] == []


def test_paging_forward_walks_every_event_once(api):
    seen, token = [], None
    for _ in range(10):
        params = group(logStreamName=STREAM_1, startFromHead=True, limit=2)
        if token:
            params["nextToken"] = token
        out = api.GetLogEvents(params)
        if not out["events"]:
            break
        assert len(out["events"]) <= 2
        seen += messages(out["events"])
        token = out["nextForwardToken"]
    assert seen == [line for _, line in host_lines("algo-1")]


def test_from_the_tail_gives_the_last_events(api):
    out = api.GetLogEvents(group(logStreamName=STREAM_1, limit=2))
    assert messages(out["events"]) == ["loss=0.5 step 2", "training complete"]


def test_the_backward_token_pages_backwards(api):
    last = api.GetLogEvents(group(logStreamName=STREAM_1, limit=2))
    before = api.GetLogEvents(group(logStreamName=STREAM_1, limit=2,
                                    nextToken=last["nextBackwardToken"]))
    assert messages(before["events"]) == ["starting epoch 1", "loss=0.9 step 1"]
    start = api.GetLogEvents(group(logStreamName=STREAM_1, limit=2,
                                   nextToken=before["nextBackwardToken"]))
    assert start["events"] == []
    forward = api.GetLogEvents(group(logStreamName=STREAM_1, limit=2,
                                     nextToken=before["nextForwardToken"]))
    assert messages(forward["events"]) == ["loss=0.5 step 2", "training complete"]


def test_start_and_end_time_select_events_end_exclusive(api):
    out = api.GetLogEvents(group(logStreamName=STREAM_1, startFromHead=True,
                                 startTime=ms(2), endTime=ms(6)))
    assert messages(out["events"]) == ["loss=0.9 step 1", "loss=0.5 step 2"]


def test_a_time_range_without_events_is_an_empty_page(api):
    out = api.GetLogEvents(group(logStreamName=STREAM_1, startTime=ms(50), startFromHead=True))
    assert out["events"] == []


@pytest.mark.parametrize("name", [
    f"{JOB}/algo-3-{T0}",        # no such host
    f"{JOB}/algo-1-{T0 + 1}",    # the epoch of another first line
    f"{JOB}/algo-1",             # no epoch
    f"nojob/algo-1-{T0}",
    f"../{JOB}/algo-1-{T0}",
    "",
])
def test_an_unknown_stream_is_not_found(api, name):
    with pytest.raises(LogsResourceNotFound):
        api.GetLogEvents(group(logStreamName=name))


@pytest.mark.parametrize("token", ["garbage", "f/", "x/1", "f/-1"])
def test_a_garbage_token_is_refused(api, token):
    with pytest.raises(InvalidParameterException):
        api.GetLogEvents(group(logStreamName=STREAM_1, nextToken=token))


def test_an_unfinished_line_is_not_an_event_until_its_newline(api, root):
    path = stream_file(root / JOB, "algo-2")
    with open(path, "ab") as handle:
        handle.write(f"{ms(9)}\thalf a li".encode())
    out = api.GetLogEvents(group(logStreamName=STREAM_2, startFromHead=True))
    assert messages(out["events"]) == [line for _, line in host_lines("algo-2")]
    token = out["nextForwardToken"]
    with open(path, "ab") as handle:
        handle.write(b"ne\n")
    later = api.GetLogEvents(group(logStreamName=STREAM_2, nextToken=token))
    assert [(e["timestamp"], e["message"]) for e in later["events"]] == [(ms(9), "half a line")]


def test_a_character_split_across_writes_is_read_whole(api, root):
    path = stream_file(root / JOB, "algo-1")
    raw = f"{ms(9)}\tcaf\u00e9 \u2713\n".encode()
    cut = raw.index("\u00e9".encode()) + 1  # inside the two bytes of the accented letter
    with open(path, "ab") as handle:
        handle.write(raw[:cut])
    token = api.GetLogEvents(group(logStreamName=STREAM_1, startFromHead=True))["nextForwardToken"]
    with open(path, "ab") as handle:
        handle.write(raw[cut:])
    out = api.GetLogEvents(group(logStreamName=STREAM_1, nextToken=token))
    assert messages(out["events"]) == ["caf\u00e9 \u2713"]


# -- FilterLogEvents -------------------------------------------------------------------------
def test_filter_merges_the_hosts_by_time(api):
    out = api.FilterLogEvents(group(logStreamNamePrefix=f"{JOB}/"))
    expected = sorted((ms(at), line.removeprefix(f"[{h}] "), h) for h, at, line in LINES)
    assert [(e["timestamp"], e["message"]) for e in out["events"]] == [(t, m) for t, m, _ in expected]
    assert [e["logStreamName"] for e in out["events"]] == [
        STREAM_1 if h == "algo-1" else STREAM_2 for _, _, h in expected]
    ids = [e["eventId"] for e in out["events"]]
    assert all(ids) and len(set(ids)) == len(ids)
    assert "nextToken" not in out
    assert {s["logStreamName"] for s in out["searchedLogStreams"]} == {STREAM_1, STREAM_2}


def test_filter_by_stream_names(api):
    out = api.FilterLogEvents(group(logStreamNames=[STREAM_2]))
    assert messages(out["events"]) == ["worker ready", "loss=0.7 step 2 warning: slow"]


def test_names_and_a_prefix_together_are_refused(api):
    with pytest.raises(InvalidParameterException):
        api.FilterLogEvents(group(logStreamNames=[STREAM_1], logStreamNamePrefix=f"{JOB}/"))


def test_filter_pattern_with_a_term(api):
    out = api.FilterLogEvents(group(logStreamNamePrefix=f"{JOB}/", filterPattern="loss"))
    assert messages(out["events"]) == ["loss=0.9 step 1", "loss=0.5 step 2",
                                       "loss=0.7 step 2 warning: slow"]


def test_filter_pattern_with_every_term(api):
    out = api.FilterLogEvents(group(logStreamNamePrefix=f"{JOB}/", filterPattern="loss 2"))
    assert messages(out["events"]) == ["loss=0.5 step 2", "loss=0.7 step 2 warning: slow"]


def test_filter_pattern_with_a_quoted_phrase(api):
    out = api.FilterLogEvents(group(logStreamNamePrefix=f"{JOB}/", filterPattern='"step 2 warning"'))
    assert messages(out["events"]) == ["loss=0.7 step 2 warning: slow"]


def test_filter_pattern_with_an_exclusion(api):
    out = api.FilterLogEvents(group(logStreamNamePrefix=f"{JOB}/", filterPattern="loss -warning"))
    assert messages(out["events"]) == ["loss=0.9 step 1", "loss=0.5 step 2"]


def test_filter_with_a_time_range(api):
    out = api.FilterLogEvents(group(logStreamNamePrefix=f"{JOB}/", startTime=ms(3), endTime=ms(5.5)))
    assert messages(out["events"]) == ["worker ready", "loss=0.5 step 2"]


def test_filter_pages_with_a_next_token(api):
    seen, token = [], None
    for _ in range(10):
        params = group(logStreamNamePrefix=f"{JOB}/", limit=4)
        if token:
            params["nextToken"] = token
        out = api.FilterLogEvents(params)
        assert len(out["events"]) <= 4
        seen += [e["eventId"] for e in out["events"]]
        token = out.get("nextToken")
        if token is None:
            break
    everything = api.FilterLogEvents(group(logStreamNamePrefix=f"{JOB}/"))
    assert seen == [e["eventId"] for e in everything["events"]] and len(seen) == len(LINES)


def test_a_json_filter_pattern_is_refused(api):
    with pytest.raises(InvalidParameterException):
        api.FilterLogEvents(group(logStreamNamePrefix=f"{JOB}/", filterPattern="{ $.x = 1 }"))


def test_a_bad_filter_token_is_refused(api):
    with pytest.raises(InvalidParameterException):
        api.FilterLogEvents(group(nextToken="s/1"))
