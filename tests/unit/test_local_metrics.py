"""Training metrics from host output: MetricDefinitions parsing, extraction, the job's metrics
file and describe()'s FinalMetricDataList."""

import datetime as dt

import pytest
from shoal.errors import InputError
from shoal.local import layout, metrics, state

REQUEST = {
    "TrainingJobName": "metrics-job",
    "AlgorithmSpecification": {"TrainingImage": "img", "TrainingInputMode": "File",
                               "MetricDefinitions": [{"Name": "loss", "Regex": r"loss=(\S+)"},
                                                     {"Name": "acc", "Regex": r"acc: ([0-9.]+)"}]},
    "RoleArn": "arn:aws:iam::111122223333:role/R",
    "OutputDataConfig": {"S3OutputPath": "s3://b/out"},
    "ResourceConfig": {"InstanceType": "local", "InstanceCount": 1, "VolumeSizeInGB": 30},
    "StoppingCondition": {"MaxRuntimeInSeconds": 86400},
}


def with_definitions(*defs) -> dict:
    spec = {**REQUEST["AlgorithmSpecification"], "MetricDefinitions": list(defs)}
    return {**REQUEST, "AlgorithmSpecification": spec}


def test_definitions_compile_once_and_keep_their_order():
    defs = metrics.definitions(REQUEST)
    assert [d.name for d in defs] == ["loss", "acc"]
    assert defs[0].regex.pattern == r"loss=(\S+)"
    assert metrics.definitions({"AlgorithmSpecification": {}}) == ()


@pytest.mark.parametrize("regex, message", [
    ("loss=(", r"'metric_definitions\[0\].Regex' must be a valid regular expression"),
    (r"loss=\S+", r"'metric_definitions\[0\].Regex' must have a capture group.*got 'loss="),
])
def test_a_bad_regex_is_an_input_error(regex, message):
    with pytest.raises(InputError, match=message):
        metrics.definitions(with_definitions({"Name": "loss", "Regex": regex}))


def test_submit_refuses_a_bad_regex_before_anything_runs(tmp_path):
    from shoal.backends.local import LocalBackend

    request = {**with_definitions({"Name": "loss", "Regex": "(unclosed"}),
               "OutputDataConfig": {"S3OutputPath": (tmp_path / "out").as_uri()}}
    with pytest.raises(InputError, match="valid regular expression"):
        LocalBackend(root=tmp_path / "jobs").submit(request)
    assert not (tmp_path / "jobs").exists()


def test_extract_takes_the_first_group_of_the_first_match_and_finite_floats_only():
    defs = metrics.definitions(REQUEST)
    points = metrics.extract(defs, "algo-1", "epoch 1 loss=0.5 acc: 0.75 loss=0.1", 1000)
    assert points == [metrics.Datapoint("loss", 0.5, 1000, "algo-1"),
                      metrics.Datapoint("acc", 0.75, 1000, "algo-1")]
    for line in ("loss=abc", "loss=nan", "loss=inf", "nothing here"):
        assert metrics.extract(defs, "algo-1", line, 0) == []
    assert metrics.extract(defs, "algo-1", "loss=1e-3", 0)[0].value == 0.001


def test_recorded_points_survive_the_recorder_and_give_the_last_value_per_metric(tmp_path):
    recorder = metrics.Recorder(tmp_path, metrics.definitions(REQUEST))
    recorder.feed("algo-1", "loss=0.9", 1_000)
    recorder.feed("algo-2", "acc: 0.5", 2_000)
    recorder.feed("algo-1", "no metric", 2_500)
    recorder.feed("algo-2", "loss=0.3", 3_000)
    recorder.close()
    (tmp_path / metrics.METRICS_FILE).open("a").write('{"metric": "loss", "val')  # half a line
    points = metrics.read(tmp_path)  # as another process, later, reads them
    assert [(p.metric, p.value, p.host) for p in points] == [
        ("loss", 0.9, "algo-1"), ("acc", 0.5, "algo-2"), ("loss", 0.3, "algo-2")]
    final = metrics.final_metrics(["acc", "loss", "unseen", "acc"], points)
    assert final == [
        {"MetricName": "acc", "Value": 0.5,
         "Timestamp": dt.datetime(1970, 1, 1, 0, 0, 2, tzinfo=dt.timezone.utc)},
        {"MetricName": "loss", "Value": 0.3,
         "Timestamp": dt.datetime(1970, 1, 1, 0, 0, 3, tzinfo=dt.timezone.utc)}]


def test_a_recorder_without_definitions_writes_nothing(tmp_path):
    recorder = metrics.Recorder(tmp_path, ())
    recorder.feed("algo-1", "loss=0.9", 1)
    recorder.close()
    assert not (tmp_path / metrics.METRICS_FILE).exists()
    assert metrics.read(tmp_path) == []


def test_final_metrics_stop_at_forty():
    points = [metrics.Datapoint(f"m{n}", float(n), n, "algo-1") for n in range(45)]
    final = metrics.final_metrics([f"m{n}" for n in range(45)], points)
    assert len(final) == 40 and final[-1]["MetricName"] == "m39"


def job(tmp_path, request=REQUEST):
    from shoal.backends.local import LocalTrainingJob

    paths = layout.JobPaths(tmp_path / request["TrainingJobName"])
    paths.job_dir.mkdir()
    state.write(paths.state_file, state.transition(state.initial(request), "Completed"))
    return LocalTrainingJob(request["TrainingJobName"], paths)


def test_describe_gives_final_metrics_and_keeps_the_definitions(tmp_path):
    local = job(tmp_path)
    assert "FinalMetricDataList" not in local.describe()
    recorder = metrics.Recorder(local.paths.job_dir, metrics.definitions(REQUEST))
    recorder.feed("algo-1", "loss=0.9 acc: 0.1", 1_000)
    recorder.feed("algo-1", "loss=0.2", 61_000)
    recorder.close()
    record = local.describe()
    assert record["AlgorithmSpecification"]["MetricDefinitions"] == \
        REQUEST["AlgorithmSpecification"]["MetricDefinitions"]
    assert [(m["MetricName"], m["Value"]) for m in record["FinalMetricDataList"]] == [
        ("loss", 0.2), ("acc", 0.1)]
    assert record["FinalMetricDataList"][0]["Timestamp"].timestamp() == 61.0


def test_describe_always_carries_metric_definitions(tmp_path):
    request = {**REQUEST, "AlgorithmSpecification": {"TrainingImage": "img",
                                                     "TrainingInputMode": "File"}}
    assert job(tmp_path, request).describe()["AlgorithmSpecification"]["MetricDefinitions"] == []


def test_read_picks_up_what_is_appended_and_a_line_once_it_is_complete(tmp_path):
    path = tmp_path / metrics.METRICS_FILE
    path.write_text('{"metric": "loss", "value": 1.0, "timestamp": 1, "host": "algo-1"}\n'
                    '{"metric": "loss", "value": 0.5, ')
    assert [p.value for p in metrics.read(tmp_path)] == [1.0]
    with path.open("a") as handle:
        handle.write('"timestamp": 2, "host": "algo-1"}\n')
    assert [p.value for p in metrics.read(tmp_path)] == [1.0, 0.5]
    path.unlink()
    path.write_text('{"metric": "acc", "value": 0.1, "timestamp": 3, "host": "algo-2"}\n' * 3)
    assert [p.metric for p in metrics.read(tmp_path)] == ["acc"] * 3  # replaced: read anew
    path.unlink()
    assert metrics.read(tmp_path) == []
