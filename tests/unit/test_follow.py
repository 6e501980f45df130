"""Following a job with stubbed SageMaker responses: transitions, outcome, backoff, idling."""

import random
import time
from datetime import datetime, timezone

import boto3
import pytest
from botocore.stub import Stubber
from moto import mock_aws
from shoal.errors import CapacityError, JobFailedError, ValidationError
from shoal.follow import (
    Backoff,
    Follower,
    billing_lines,
    closing_lines,
    detach_message,
    normalize_log_type,
    transition_line,
)
from shoal.logs import LOG_GROUP

REGION = "us-west-2"
JOB = "pt-2024-01-01-00-00-00-000"
NOW_MS = int(time.time() * 1000)

T = [
    ("Starting", "Preparing the instances for training"),
    ("Downloading", "Downloading the training image"),
    ("Training", "Training image download completed. Training in progress."),
    ("Uploading", "Uploading generated training model"),
    ("Completed", "Training job completed"),
]


def transitions(n):
    return [
        {
            "Status": s,
            "StatusMessage": m,
            "StartTime": datetime(2024, 1, 1, 12, 0, i, tzinfo=timezone.utc),
        }
        for i, (s, m) in enumerate(T[:n])
    ]


def describe(status, secondary, n_transitions, **extra):
    response = {
        "TrainingJobName": JOB,
        "TrainingJobArn": f"arn:aws:sagemaker:{REGION}:123456789012:training-job/{JOB}",
        "ModelArtifacts": {"S3ModelArtifacts": f"s3://b/{JOB}/output/model.tar.gz"},
        "TrainingJobStatus": status,
        "SecondaryStatus": secondary,
        "AlgorithmSpecification": {"TrainingInputMode": "File", "TrainingImage": "img"},
        "ResourceConfig": {"InstanceType": "ml.p4d.24xlarge", "InstanceCount": 2, "VolumeSizeInGB": 30},
        "StoppingCondition": {"MaxRuntimeInSeconds": 86400},
        "CreationTime": datetime(2024, 1, 1, tzinfo=timezone.utc),
        "SecondaryStatusTransitions": transitions(n_transitions),
    }
    response.update(extra)
    return response


class FakeClock:
    def __init__(self, on_sleep=None):
        self.now = 0.0
        self.sleeps = []
        self.on_sleep = on_sleep

    def __call__(self):
        return self.now

    def sleep(self, seconds):
        self.sleeps.append(seconds)
        self.now += seconds
        if self.on_sleep:
            self.on_sleep(len(self.sleeps))


def follower(sm, logs_client, clock, lines, **kw):
    return Follower(
        sm,
        logs_client,
        JOB,
        out=lines.append,
        clock=clock,
        sleep=clock.sleep,
        rng=random.Random(0),
        **kw,
    )


@pytest.fixture
def aws():
    with mock_aws():
        sm = boto3.client("sagemaker", region_name=REGION)
        logs_client = boto3.client("logs", region_name=REGION)
        with Stubber(sm) as stub:
            yield sm, stub, logs_client


def expect(stub, *responses):
    for r in responses:
        if isinstance(r, str):
            stub.add_client_error("describe_training_job", r, "slow down", http_status_code=400)
        else:
            stub.add_response("describe_training_job", r, {"TrainingJobName": JOB})


def test_in_progress_to_completed_prints_transitions_once_and_billing(aws):
    sm, stub, logs_client = aws
    expect(
        stub,
        describe("InProgress", "Starting", 1),
        describe("InProgress", "Training", 3),
        describe("InProgress", "Training", 3),
        describe(
            "Completed", "Completed", 5, TrainingTimeInSeconds=100, BillableTimeInSeconds=40,
            EnableManagedSpotTraining=True,
        ),
    )
    clock, lines = FakeClock(), []
    final = follower(sm, logs_client, clock, lines).run()
    stub.assert_no_pending_responses()
    assert final["TrainingJobStatus"] == "Completed"
    status_lines = [line for line in lines if line.startswith("2024-")]
    assert status_lines == [
        "2024-01-01 12:00:00 Starting - Preparing the instances for training",
        "2024-01-01 12:00:01 Downloading - Downloading the training image",
        "2024-01-01 12:00:02 Training - Training image download completed. Training in progress.",
        "2024-01-01 12:00:03 Uploading - Uploading generated training model",
        "2024-01-01 12:00:04 Completed - Training job completed",
    ]
    assert lines[-3:] == [
        "Training seconds: 200",
        "Billable seconds: 80",
        "Managed Spot Training savings: 60.0%",
    ]


def test_failed_raises_with_reason(aws):
    sm, stub, logs_client = aws
    reason = "AlgorithmError: ExecuteUserScriptError: exit code 1"
    expect(
        stub,
        describe("InProgress", "Training", 3),
        describe("Failed", "Failed", 3, FailureReason=reason),
    )
    with pytest.raises(JobFailedError) as info:
        follower(sm, logs_client, FakeClock(), []).run()
    assert not isinstance(info.value, CapacityError)
    assert (info.value.job_name, info.value.status, info.value.reason) == (JOB, "Failed", reason)
    assert reason in str(info.value)


def test_capacity_failure_raises_capacity_error(aws):
    sm, stub, logs_client = aws
    reason = "CapacityError: Unable to provision requested ML compute capacity. Please retry."
    expect(stub, describe("Failed", "Failed", 1, FailureReason=reason))
    with pytest.raises(CapacityError) as info:
        follower(sm, logs_client, FakeClock(), []).run()
    assert info.value.reason == reason


def test_stopped_warns_and_returns(aws):
    sm, stub, logs_client = aws
    expect(stub, describe("InProgress", "Training", 3), describe("Stopped", "Stopped", 3))
    with pytest.warns(UserWarning, match="Stopped"):
        final = follower(sm, logs_client, FakeClock(), []).run()
    assert final["TrainingJobStatus"] == "Stopped"


def test_throttled_describe_in_the_middle_is_survived(aws):
    sm, stub, logs_client = aws
    expect(
        stub,
        describe("InProgress", "Starting", 1),
        "ThrottlingException",
        "ThrottledException",
        describe("Completed", "Completed", 5),
    )
    clock, lines = FakeClock(), []
    final = follower(sm, logs_client, clock, lines).run()
    stub.assert_no_pending_responses()
    assert final["TrainingJobStatus"] == "Completed"
    notes = [line for line in lines if "retrying" in line]
    assert len(notes) == 2 and "DescribeTrainingJob" in notes[0]
    # Backing off: the delays after the throttles grow, and stay capped with jitter.
    assert clock.sleeps[1] > clock.sleeps[0]
    assert max(clock.sleeps) <= 30 * 1.2


def test_server_error_on_first_describe_is_retried(aws):
    sm, stub, logs_client = aws
    stub.add_client_error(
        "describe_training_job", "InternalFailure", "oops", http_status_code=500
    )
    expect(stub, describe("Completed", "Completed", 5))
    final = follower(sm, logs_client, FakeClock(), []).run()
    assert final["TrainingJobStatus"] == "Completed"


def test_idle_notice_after_30_seconds_without_events(aws):
    sm, stub, logs_client = aws
    expect(stub, *[describe("InProgress", "Starting", 1)] * 12, describe("Completed", "Completed", 5))
    clock, lines = FakeClock(), []
    follower(sm, logs_client, clock, lines).run()
    idle = [line for line in lines if line.startswith("no log events")]
    assert idle and idle[0].startswith("no log events for 3")
    assert idle[0].endswith("; job status InProgress/Starting")
    # Repeats stay sparse: each notice waits at least twice as long as the previous one.
    seconds = [float(line.split()[4]) for line in idle]
    assert all(b >= 2 * a for a, b in zip(seconds, seconds[1:]))


def test_logs_and_status_are_followed_together(aws):
    sm, stub, logs_client = aws
    logs_client.create_log_group(logGroupName=LOG_GROUP)
    for host in (1, 2):
        logs_client.create_log_stream(logGroupName=LOG_GROUP, logStreamName=f"{JOB}/algo-{host}-9")

    def write(n_sleep):  # the job writes while we sleep
        host = 1 + n_sleep % 2
        logs_client.put_log_events(
            logGroupName=LOG_GROUP,
            logStreamName=f"{JOB}/algo-{host}-9",
            logEvents=[{"timestamp": NOW_MS + n_sleep, "message": f"step {n_sleep}"}],
        )

    expect(stub, *[describe("InProgress", "Training", 3)] * 3, describe("Completed", "Completed", 5))
    clock, lines = FakeClock(on_sleep=write), []
    follower(sm, logs_client, clock, lines).run()
    logged = [line for line in lines if line.startswith("[algo-")]
    assert logged == [f"[algo-{1 + n % 2}] step {n}" for n in range(1, len(clock.sleeps) + 1)]
    assert not any(line.startswith("no log events") for line in lines)


def test_logs_none_does_not_read_cloudwatch(aws):
    sm, stub, logs_client = aws
    expect(stub, describe("InProgress", "Training", 3), describe("Completed", "Completed", 5))
    calls = []
    logs_client.meta.events.register("provide-client-params.logs.*", lambda **kw: calls.append(kw))
    follower(sm, logs_client, FakeClock(), [], logs="None").run()
    assert calls == []


def test_no_wait_reads_once_and_does_not_judge(aws):
    sm, stub, logs_client = aws
    expect(stub, describe("Failed", "Failed", 3, FailureReason="boom"))
    clock = FakeClock()
    final = follower(sm, logs_client, clock, []).run(wait=False)
    assert final["TrainingJobStatus"] == "Failed" and clock.sleeps == []


def test_rule_statuses_printed_when_they_change(aws):
    sm, stub, logs_client = aws
    rule = {"RuleConfigurationName": "LossNotDecreasing", "RuleEvaluationStatus": "InProgress"}
    done = dict(rule, RuleEvaluationStatus="NoIssuesFound")
    expect(
        stub,
        describe("InProgress", "Training", 3, DebugRuleEvaluationStatuses=[rule]),
        describe("InProgress", "Training", 3, DebugRuleEvaluationStatuses=[rule]),
        describe("Completed", "Completed", 5, DebugRuleEvaluationStatuses=[done]),
    )
    lines = []
    follower(sm, logs_client, FakeClock(), lines).run()
    assert [line for line in lines if line.startswith("LossNotDecreasing")] == [
        "LossNotDecreasing: InProgress",
        "LossNotDecreasing: NoIssuesFound",
    ]


def test_backoff_grows_to_cap_with_jitter():
    rng = random.Random(1)
    b = Backoff()
    delays = [b.delay(i, rng) for i in range(10)]
    assert 4.0 <= delays[0] <= 6.0
    assert all(24.0 <= d <= 36.0 for d in delays[6:])
    assert len({round(d, 6) for d in delays[6:]}) > 1  # jittered, not lock-step


def test_helpers():
    assert normalize_log_type(True) == "All"
    assert normalize_log_type(False) == "None"
    with pytest.raises(ValidationError, match="'logs' must be in"):
        normalize_log_type("Everything")
    assert transition_line(transitions(1)[0]) == (
        "2024-01-01 12:00:00 Starting - Preparing the instances for training"
    )
    assert billing_lines({"ResourceConfig": {"InstanceCount": 1}}) == []
    message = detach_message(JOB, REGION)
    assert f"shoal.attach('{JOB}').logs()" in message
    assert f"shoal logs sagemaker://{REGION}/{JOB}" in message
    assert "keeps running" in message


def test_console_output_colours_host_prefixes_and_ignores_markup():
    import io

    from rich.console import Console
    from shoal.follow import ConsoleOutput

    buffer = io.StringIO()
    out = ConsoleOutput(Console(file=buffer, force_terminal=True, color_system="standard",
                                highlight=False, markup=False))
    out("[algo-2] loss [bold]0.5[/bold]")
    text = buffer.getvalue()
    assert "\x1b[" in text  # coloured
    assert "[bold]0.5[/bold]" in text  # the user's line is not markup
    plain = io.StringIO()
    ConsoleOutput(Console(file=plain, force_terminal=False))("[algo-1] step 1")
    assert plain.getvalue() == "[algo-1] step 1\n"


def test_default_output_is_stdout(aws, capsys):
    sm, stub, logs_client = aws
    expect(stub, describe("Completed", "Completed", 1))
    Follower(sm, logs_client, JOB, sleep=lambda s: None).run()
    assert "Starting - Preparing the instances for training" in capsys.readouterr().out


def test_connection_error_and_throttled_logs_do_not_stop_following(aws):
    from botocore.exceptions import ClientError, EndpointConnectionError

    sm, stub, logs_client = aws
    logs_client.create_log_group(logGroupName=LOG_GROUP)
    logs_client.create_log_stream(logGroupName=LOG_GROUP, logStreamName=f"{JOB}/algo-1-9")
    logs_client.put_log_events(
        logGroupName=LOG_GROUP,
        logStreamName=f"{JOB}/algo-1-9",
        logEvents=[{"timestamp": NOW_MS, "message": "hello"}],
    )
    calls = {"n": 0}

    def flaky(**_):
        calls["n"] += 1
        if calls["n"] == 1:
            raise ClientError({"Error": {"Code": "ThrottlingException", "Message": "Rate"}}, "GetLogEvents")
        if calls["n"] == 2:
            raise EndpointConnectionError(endpoint_url="https://logs.us-west-2.amazonaws.com")

    logs_client.meta.events.register("before-call.logs.GetLogEvents", flaky)
    expect(stub, *[describe("InProgress", "Training", 3)] * 3, describe("Completed", "Completed", 5))
    lines = []
    follower(sm, logs_client, FakeClock(), lines).run()
    notes = [line for line in lines if line.startswith("(CloudWatch Logs")]
    assert len(notes) == 2
    assert "ThrottlingException" in notes[0] or "Rate" in notes[0]
    assert [line for line in lines if line.startswith("[algo-")] == ["[algo-1] hello"]


def test_quiet_job_polls_slower_and_a_new_status_resets_the_pace(aws):
    sm, stub, logs_client = aws
    quiet = [describe("InProgress", "Starting", 1)] * 6
    expect(stub, *quiet, describe("InProgress", "Training", 3), describe("Completed", "Completed", 5))
    clock = FakeClock()
    follower(sm, logs_client, clock, [], logs="None").run()
    polls = clock.sleeps[:-1]  # the last sleep is the pause after the end
    assert polls[5] > 2 * polls[0]
    assert polls[6] < polls[5] / 2  # after the Training transition: back to ~5 s


FINAL_METRICS = [
    {"MetricName": "loss", "Value": 0.0312, "Timestamp": datetime(2024, 1, 1, 12, 1, 33, tzinfo=timezone.utc)},
    {"MetricName": "accuracy", "Value": 0.97, "Timestamp": datetime(2024, 1, 1, 12, 1, 40, tzinfo=timezone.utc)},
]
PROFILER_RULES = [
    {"RuleConfigurationName": "LowGPUUtilization", "RuleEvaluationStatus": "NoIssuesFound",
     "StatusDetails": ""},
    {"RuleConfigurationName": "ShoalRules", "RuleEvaluationStatus": "IssuesFound",
     "StatusDetails": (
         "CollectiveCPUContention: 840 of 2000 collectives ran while the CPU was busy (triggered "
         "3 time(s)). Fix: move preprocessing before training.\n"
         "CommunicationBound: 12 of 40 steps spent over 20 % of their time waiting for "
         "collectives (median 31 %) (triggered 1 time(s)).")},
]


def test_closing_summary_shows_final_metrics_and_each_finding_with_its_fix(aws):
    sm, stub, logs_client = aws
    expect(stub, describe("Completed", "Completed", 5, TrainingTimeInSeconds=100,
                          FinalMetricDataList=FINAL_METRICS,
                          ProfilerRuleEvaluationStatuses=PROFILER_RULES))
    lines = []
    follower(sm, logs_client, FakeClock(), lines).run()
    assert lines[-5:] == [
        "Training seconds: 200",
        "Final metrics: loss=0.0312 (at 12:01:33), accuracy=0.97 (at 12:01:40)",
        "Rule findings:",
        "  ShoalRules/CollectiveCPUContention: 840 of 2000 collectives ran while the CPU was "
        "busy (triggered 3 time(s)) -- fix: move preprocessing before training.",
        # no fix in the text: the built-in rule's own recommendation
        "  ShoalRules/CommunicationBound: 12 of 40 steps spent over 20 % of their time waiting "
        "for collectives (median 31 %) (triggered 1 time(s)) -- fix: Steps wait for "
        "communication: overlap it with compute (DDP buckets, async collectives), communicate "
        "less often (gradient accumulation), larger batches per step, or compress gradients.",
    ]
    assert sum(line == "Rule findings:" for line in lines) == 1  # once, at the end


def test_closing_summary_of_sagemakers_own_details_and_a_failed_evaluation():
    description = {"DebugRuleEvaluationStatuses": [
        {"RuleConfigurationName": "LossNotDecreasing", "RuleEvaluationStatus": "IssuesFound",
         "StatusDetails": "RuleEvaluationConditionMet: Evaluation of the rule LossNotDecreasing "
                          "at step 500 resulted in the condition being met"},
        {"RuleConfigurationName": "Overfit", "RuleEvaluationStatus": "Error",
         "StatusDetails": "ClientError: no tensors"}],
        "ProfilerRuleEvaluationStatuses": [
            {"RuleConfigurationName": "StepOutlier", "RuleEvaluationStatus": "IssuesFound"}],
        "FinalMetricDataList": [{"MetricName": "loss", "Value": 2, "Timestamp": 1704110400.0}]}
    lines = closing_lines(description)
    assert lines[0] == "Final metrics: loss=2 (at 12:00:00)"
    assert lines[1:4] == [
        "Rule findings:",
        "  LossNotDecreasing: RuleEvaluationConditionMet: Evaluation of the rule "
        "LossNotDecreasing at step 500 resulted in the condition being met",
        "  Overfit: evaluation failed: ClientError: no tensors",
    ]
    assert lines[4].startswith("  StepOutlier: issues found -- fix: Check if there are any bottlenecks")


def test_no_metrics_and_no_findings_print_no_empty_headers(aws):
    quiet = [{"RuleConfigurationName": "ProfilerReport", "RuleEvaluationStatus": "NoIssuesFound",
              "StatusDetails": "insufficient data for BatchSize"}]
    assert closing_lines({"FinalMetricDataList": [], "ProfilerRuleEvaluationStatuses": quiet}) == []
    sm, stub, logs_client = aws
    expect(stub, describe("Completed", "Completed", 5, TrainingTimeInSeconds=10,
                          ProfilerRuleEvaluationStatuses=quiet))
    lines = []
    follower(sm, logs_client, FakeClock(), lines).run()
    assert lines[-1] == "Training seconds: 20"
    assert not any(line.startswith(("Final metrics", "Rule findings")) for line in lines)


def test_a_local_jobs_wait_prints_the_same_closing_summary(tmp_path):
    import io

    from shoal.backends.local import LocalTrainingJob
    from shoal.local import layout, state

    paths = layout.JobPaths.for_job("local-job", tmp_path)
    paths.job_dir.mkdir(parents=True)
    paths.log_file.write_text("[algo-1] epoch 1 loss=0.0312\n")
    state.write(paths.state_file, {
        "TrainingJobName": "local-job", "TrainingJobStatus": "Completed",
        "FinalMetricDataList": FINAL_METRICS, "ProfilerRuleEvaluationStatuses": PROFILER_RULES})
    out = io.StringIO()
    LocalTrainingJob("local-job", paths).wait(out=out)
    lines = out.getvalue().splitlines()
    assert lines[0] == "[algo-1] epoch 1 loss=0.0312"
    assert lines[1] == "Final metrics: loss=0.0312 (at 12:01:33), accuracy=0.97 (at 12:01:40)"
    assert lines[2] == "Rule findings:" and len(lines) == 5
    assert lines[3].startswith("  ShoalRules/CollectiveCPUContention: 840 of 2000 collectives")
