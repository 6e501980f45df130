"""``shoal report``: a local job's page, a SageMaker job's (rule output and profiler data
downloaded from S3 with the owner check), a job folder; a job without data is an error."""

from __future__ import annotations

import json
import types

import boto3
from moto import mock_aws
from shoal import cli
from shoal.profiler import engine, report

from tests.unit.test_profiler_rules import write_steps, write_system


def job_tree(job_dir):
    """``<job_dir>`` laid out as <output>/<job>/: profiler data and one rule's reports."""
    data = job_dir / "profiler-output"
    write_system(data, "algo-1", 20, gpus=0)
    write_steps(data, "algo-1", [0.05] * 150 + [2.0] * 12)
    out = job_dir / "rule-output" / "StepOutlier" / "profiler-output"
    engine.Evaluation(data, engine.rules_for("StepOutlier", {}), out).advance(final=True)


def run(capsys, *argv):
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_report_of_a_local_job(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SHOAL_LOCAL_ROOT", str(tmp_path / "jobs"))
    job_dir = tmp_path / "jobs" / "my-job"
    job_tree(job_dir)
    (job_dir / "job.json").write_text(json.dumps({"TrainingJobName": "my-job"}))
    code, out, _ = run(capsys, "report", "local://my-job", "--out", str(tmp_path / "r.html"))
    assert code == 0 and out.strip() == str(tmp_path / "r.html")
    html = (tmp_path / "r.html").read_text()
    assert "Profiler report: my-job" in html and "StepOutlier" in html and "IssuesFound" in html


def test_report_of_a_job_folder_and_of_nothing(tmp_path, capsys, monkeypatch):
    job_tree(tmp_path / "folder-job")
    monkeypatch.chdir(tmp_path)
    code, out, _ = run(capsys, "report", str(tmp_path / "folder-job"))
    assert code == 0 and (tmp_path / "folder-job-profiler-report.html").exists()
    (tmp_path / "empty").mkdir()
    code, _, err = run(capsys, "report", str(tmp_path / "empty"))
    assert code == 2 and "no profiler data or rule reports" in err


def test_report_of_a_sagemaker_job_downloads_from_s3(tmp_path, capsys, monkeypatch,
                                                      fake_aws_credentials):
    job_tree(tmp_path / "src" / "sm-job")
    with mock_aws():
        s3 = boto3.client("s3", region_name="us-west-2")
        s3.create_bucket(Bucket="bkt", CreateBucketConfiguration={"LocationConstraint": "us-west-2"})
        for path in (tmp_path / "src").rglob("*"):
            if path.is_file():
                key = "out/" + path.relative_to(tmp_path / "src").as_posix()
                s3.upload_file(str(path), "bkt", key)
        s3.put_object(Bucket="bkt", Key="out/sm-job/rule-output/../../escape.json", Body=b"{}")
        description = {"TrainingJobName": "sm-job", "OutputDataConfig": {"S3OutputPath": "s3://bkt/out"},
                       "ProfilerConfig": {"S3OutputPath": "s3://bkt/out"}}
        monkeypatch.setattr(cli, "sagemaker_job",
                            lambda handle: types.SimpleNamespace(describe=lambda: description))
        code, out, err = run(capsys, "report", "sagemaker://us-west-2/sm-job",
                             "--out", str(tmp_path / "sm.html"))
    assert code == 0, err
    html = (tmp_path / "sm.html").read_text()
    assert "Profiler report: sm-job" in html and "StepOutlier" in html
    assert not (tmp_path / "escape.json").exists()


def test_status_without_given_statuses_comes_from_the_reports():
    assert report.status_of({"RuleTriggered": 2})["RuleEvaluationStatus"] == "IssuesFound"
    found = report.status_of({"RuleTriggered": 2, "Finding": "12 of 160 steps were slow",
                              "Recommendation": "Check the bottlenecks."})
    assert found["StatusDetails"] == ("12 of 160 steps were slow (triggered 2 time(s)). "
                                      "Fix: Check the bottlenecks.")
    lacking = report.status_of({"RuleTriggered": 0, "Details": {"InsufficientData": "3 steps"}})
    assert lacking == {"RuleEvaluationStatus": "NoIssuesFound",
                       "StatusDetails": "Insufficient data: 3 steps"}
