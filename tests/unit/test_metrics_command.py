"""``shoal metrics`` (table, JSON, PNG) and the final metrics in ``shoal status``."""

import datetime as dt
import json

import pytest
from shoal import cli, metrics_command
from shoal.local import layout, metrics, state

T0 = 1_767_225_600  # 2026-01-01T00:00:00Z
REQUEST = {
    "TrainingJobName": "m-job",
    "AlgorithmSpecification": {"TrainingImage": "img", "TrainingInputMode": "File",
                               "MetricDefinitions": [{"Name": "loss", "Regex": r"loss=(\S+)"},
                                                     {"Name": "acc", "Regex": r"acc=(\S+)"}]},
    "OutputDataConfig": {"S3OutputPath": "file:///tmp/o"},
    "ResourceConfig": {"InstanceType": "local", "InstanceCount": 2},
}


@pytest.fixture
def root(tmp_path, monkeypatch):
    monkeypatch.setenv("SHOAL_LOCAL_ROOT", str(tmp_path / "jobs"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    monkeypatch.delenv("SHOAL_CONFIG", raising=False)
    monkeypatch.chdir(tmp_path)
    return tmp_path / "jobs"


def make_job(root, name="m-job", lines=(("algo-1", 0, "loss=0.9"), ("algo-2", 30, "acc=0.5"),
                                         ("algo-1", 60, "loss=0.4"))):
    paths = layout.JobPaths(root / name)
    paths.job_dir.mkdir(parents=True)
    request = {**REQUEST, "TrainingJobName": name}
    record = state.initial(request)
    for step in ("Downloading", "Training", "Completed"):
        record = state.transition(record, step)
    state.write(paths.state_file, record)
    recorder = metrics.Recorder(paths.job_dir, metrics.definitions(request))
    for host, seconds, line in lines:
        recorder.feed(host, line, (T0 + seconds) * 1000)
    recorder.close()


def run(capsys, *argv):
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_status_shows_the_final_metrics(root, capsys):
    make_job(root)
    code, out, _ = run(capsys, "status", "m-job")
    assert code == 0
    assert "Metric loss: 0.4 (at 2026-01-01 00:01:00+00:00)" in out
    assert "Metric acc: 0.5" in out
    code, out, _ = run(capsys, "status", "m-job", "--output", "json")
    assert [m["MetricName"] for m in json.loads(out)["FinalMetricDataList"]] == ["loss", "acc"]


def test_metrics_prints_every_value_over_time(root, capsys):
    make_job(root)
    code, out, _ = run(capsys, "metrics", "local://m-job")
    assert code == 0
    rows = [line for line in out.splitlines() if "loss" in line or "acc" in line]
    assert len(rows) == 3
    assert "0.9" in rows[0] and "algo-1" in rows[0] and "60.0" in rows[1] and "0.4" in rows[1]
    assert "algo-2" in rows[2]


def test_metrics_as_json(root, capsys):
    make_job(root)
    code, out, _ = run(capsys, "metrics", "m-job", "--output", "json")
    data = json.loads(out)
    assert code == 0 and data["TrainingJobName"] == "m-job"
    assert [(p["Value"], p["Host"]) for p in data["Metrics"]["loss"]] == [(0.9, "algo-1"),
                                                                          (0.4, "algo-1")]
    assert data["Metrics"]["acc"][0]["Timestamp"].startswith("2026-01-01 00:00:30")


def test_metrics_plot_writes_a_png(root, capsys, tmp_path):
    make_job(root)
    code, out, _ = run(capsys, "metrics", "m-job", "--plot", str(tmp_path / "m.png"))
    assert code == 0 and out.strip() == str(tmp_path / "m.png")
    assert (tmp_path / "m.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_job_without_datapoints(root, capsys, tmp_path):
    make_job(root, "quiet-job", lines=())
    code, out, err = run(capsys, "metrics", "quiet-job")
    assert (code, out) == (0, "") and "no metric datapoints for quiet-job" in err
    code, _, err = run(capsys, "metrics", "quiet-job", "--plot", str(tmp_path / "q.png"))
    assert code == 2 and "no metric datapoints to plot" in err
    assert not (tmp_path / "q.png").exists()


def test_an_unknown_local_job_is_a_usage_error(root, capsys):
    code, _, err = run(capsys, "metrics", "nope")
    assert code == 2 and "no local job named 'nope'" in err


class FakeCloudWatch:
    def __init__(self):
        self.calls = []

    def get_metric_statistics(self, **params):
        self.calls.append(params)
        at = dt.datetime.fromtimestamp(T0, dt.timezone.utc)
        points = {"loss": [{"Timestamp": at + dt.timedelta(minutes=1), "Average": 0.2},
                           {"Timestamp": at, "Average": 0.8}]}
        return {"Datapoints": points.get(params["MetricName"], [])}


def test_a_sagemaker_jobs_series_are_cloudwatchs_one_minute_averages():
    start = dt.datetime.fromtimestamp(T0, dt.timezone.utc)
    fake = FakeCloudWatch()
    series = metrics_command.cloudwatch_series(fake, {
        "TrainingJobName": "sm-job", "TrainingStartTime": start,
        "TrainingEndTime": start + dt.timedelta(minutes=5),
        "AlgorithmSpecification": REQUEST["AlgorithmSpecification"]})
    assert [p["Value"] for p in series["loss"]] == [0.8, 0.2] and "acc" not in series
    assert fake.calls[0]["Dimensions"] == [{"Name": "TrainingJobName", "Value": "sm-job"}]
    assert (fake.calls[0]["Period"], fake.calls[0]["Statistics"]) == (60, ["Average"])
    assert fake.calls[0]["EndTime"] == start + dt.timedelta(minutes=6)
    assert metrics_command.cloudwatch_series(fake, {"TrainingJobName": "x"}) == {}
