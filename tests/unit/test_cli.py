"""The shoal CLI: exit codes, stdout vs stderr, read verbs on local handles, config, env."""

import datetime as dt
import json
from pathlib import Path

import botocore.exceptions
import pytest
import yaml
from shoal import cli
from shoal.local import layout, state

REQUEST = {
    "TrainingJobName": "cli-job",
    "AlgorithmSpecification": {"TrainingImage": "img", "TrainingInputMode": "File"},
    "OutputDataConfig": {"S3OutputPath": "file:///tmp/o"},
    "ResourceConfig": {"InstanceType": "local", "InstanceCount": 1},
}


@pytest.fixture
def root(tmp_path, monkeypatch):
    monkeypatch.setenv("SHOAL_LOCAL_ROOT", str(tmp_path / "jobs"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    monkeypatch.delenv("SHOAL_CONFIG", raising=False)
    monkeypatch.chdir(tmp_path)
    return tmp_path / "jobs"


def finished_job(root, name, status, **fields):
    """A local job directory as the supervisor leaves it (no process involved)."""
    paths = layout.JobPaths(root / name)
    paths.job_dir.mkdir(parents=True)
    record = state.initial({**REQUEST, "TrainingJobName": name})
    for step in ("Downloading", "Training", status):
        record = state.transition(record, step)
    record.update(fields)
    state.write(paths.state_file, record)
    paths.log_file.write_text("[algo-1] hello\n[algo-1] bye\n")
    return paths


def run(capsys, *argv):
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_status_of_a_completed_job(root, capsys):
    finished_job(root, "done-job", "Completed",
                 ModelArtifacts={"S3ModelArtifacts": "file:///tmp/o/model.tar.gz"})
    code, out, _ = run(capsys, "status", "local://done-job")
    assert code == 0
    assert "TrainingJobStatus: Completed" in out and "file:///tmp/o/model.tar.gz" in out
    code, out, _ = run(capsys, "status", "local://done-job", "--output", "json")
    assert json.loads(out)["SecondaryStatus"] == "Completed"


def test_status_shows_debugger_rule_statuses(root, capsys):
    finished_job(root, "ruled-job", "Completed", ProfilingStatus="Enabled",
                 ProfilerRuleEvaluationStatuses=[
                     {"RuleConfigurationName": "StepOutlier", "RuleEvaluationStatus": "IssuesFound",
                      "StatusDetails": "12 outliers"},
                     {"RuleConfigurationName": "CPUBottleneck",
                      "RuleEvaluationStatus": "NoIssuesFound"}],
                 DebugRuleEvaluationStatuses=[{"RuleConfigurationName": "LossNotDecreasing",
                                               "RuleEvaluationStatus": "InProgress"}])
    code, out, _ = run(capsys, "status", "local://ruled-job")
    assert code == 0
    lines = out.splitlines()
    assert "ProfilingStatus: Enabled" in lines
    assert "Rule StepOutlier: IssuesFound (12 outliers)" in lines
    assert "Rule CPUBottleneck: NoIssuesFound" in lines
    assert "Rule LossNotDecreasing: InProgress" in lines


def test_status_of_a_failed_job_exits_1_with_its_reason(root, capsys):
    finished_job(root, "bad-job", "Failed", FailureReason="AlgorithmError: ZeroDivisionError")
    code, out, _ = run(capsys, "status", "local://bad-job")
    assert code == 1
    assert "FailureReason: AlgorithmError: ZeroDivisionError" in out


def test_logs_and_list(root, capsys):
    finished_job(root, "job-a", "Completed")
    finished_job(root, "job-b", "Stopped")
    code, out, _ = run(capsys, "logs", "local://job-a")
    assert code == 0 and out == "[algo-1] hello\n[algo-1] bye\n"
    code, out, _ = run(capsys, "list", "--output", "json")
    rows = json.loads(out)
    assert [r["Handle"] for r in rows] == ["local://job-b", "local://job-a"]
    assert [r["TrainingJobStatus"] for r in rows] == ["Stopped", "Completed"]


def test_list_prints_a_header_and_aligned_columns(root, capsys):
    ended = state.now()
    finished_job(root, "short", "Completed", CreationTime=ended - dt.timedelta(seconds=65),
                 TrainingEndTime=ended)
    finished_job(root, "a-longer-name", "Failed", CreationTime=ended - dt.timedelta(hours=2),
                 TrainingEndTime=ended - dt.timedelta(minutes=1))
    code, out, _ = run(capsys, "list")
    assert code == 0
    lines = out.splitlines()
    assert lines[0].split() == ["HANDLE", "STATUS", "CREATED", "DURATION"]
    assert [ln.split()[:2] for ln in lines[1:]] == [["local://short", "Completed"],
                                                     ["local://a-longer-name", "Failed"]]
    assert [ln.split()[-1] for ln in lines[1:]] == ["1m05s", "1h59m"]
    assert len({ln.index(ln.split()[1]) for ln in lines}) == 1  # STATUS starts in one column


def test_list_since_and_limit(root, capsys):
    at = state.now()
    for name, age in (("day-old", dt.timedelta(days=1)), ("hour-old", dt.timedelta(hours=1)),
                      ("fresh", dt.timedelta(minutes=5))):
        finished_job(root, name, "Completed", CreationTime=at - age)

    def handles(*argv):
        code, out, _ = run(capsys, "list", "--output", "json", *argv)
        assert code == 0
        return [row["Handle"].removeprefix("local://") for row in json.loads(out)]

    assert handles("--since", "30m") == ["fresh"]
    assert handles("--since", "2h") == ["fresh", "hour-old"]
    assert handles("--since", (at - dt.timedelta(days=2)).date().isoformat()) == [
        "fresh", "hour-old", "day-old"]
    assert handles("--limit", "2") == ["fresh", "hour-old"]
    assert handles("-n", "1", "--since", "1w") == ["fresh"]
    code, out, err = run(capsys, "list", "--since", "yesterday")
    assert code == 2 and out == "" and "expected a duration such as 30m" in err
    code, out, err = run(capsys, "list", "--limit", "0")
    assert code == 2 and "--limit" in err


def test_since_reads_durations_and_dates():
    at = dt.datetime(2026, 11, 2, 12, 0, tzinfo=dt.timezone.utc)
    assert cli.since_cutoff("90m", at) == at - dt.timedelta(minutes=90)
    assert cli.since_cutoff("2d", at) == at - dt.timedelta(days=2)
    assert cli.since_cutoff("1W", at) == at - dt.timedelta(weeks=1)
    assert cli.since_cutoff("2026-11-01T08:00+00:00", at) == dt.datetime(
        2026, 11, 1, 8, tzinfo=dt.timezone.utc)
    assert cli.since_cutoff("2026-11-01", at) == dt.datetime(2026, 11, 1).astimezone()


def test_durations_show_their_two_largest_units():
    assert [cli.duration(s) for s in (0, 45, 185, 7260, 273600)] == [
        "0s", "45s", "3m05s", "2h01m", "3d04h"]


def test_read_verbs_take_a_local_jobs_bare_name(root, capsys):
    finished_job(root, "named-job", "Failed", FailureReason="AlgorithmError: boom")
    code, out, _ = run(capsys, "status", "named-job")
    assert code == 1 and "FailureReason: AlgorithmError: boom" in out
    code, out, _ = run(capsys, "logs", "named-job")
    assert code == 0 and out == "[algo-1] hello\n[algo-1] bye\n"
    code, _, err = run(capsys, "stop", "named-job")
    assert code == 0 and "stop requested for local://named-job" in err


def test_a_job_whose_supervisor_died_reads_as_failed(root, capsys):
    paths = layout.JobPaths(root / "orphan")
    paths.job_dir.mkdir(parents=True)
    state.write(paths.state_file, state.initial({**REQUEST, "TrainingJobName": "orphan"}))
    state.write(paths.runner_file, {"Pid": 999999999, "CreateTime": 0.0})
    code, out, _ = run(capsys, "status", "local://orphan")
    assert code == 1 and "supervisor" in out


@pytest.mark.parametrize("argv, fragment", [
    (["status", "no-scheme"], "no local job named 'no-scheme', and a SageMaker job needs"),
    (["status", "local://missing"], "no local job named 'missing'"),
    (["stop", "ftp://x"], "unknown handle scheme"),
    (["run", "--no-such-flag"], "No such option"),
    (["run", "missing.yaml"], "no such file"),
])
def test_usage_and_config_errors_exit_2_on_stderr(root, capsys, argv, fragment):
    code, out, err = run(capsys, *argv)
    assert code == 2 and out == "" and fragment in err


def test_job_file_errors_exit_2(root, capsys):
    (root.parent / "job.yaml").write_text(yaml.safe_dump({"entry_pont": "t.py"}))
    code, out, err = run(capsys, "run", "job.yaml", "--local")
    assert code == 2 and "did you mean 'entry_point'" in err


def test_aws_credential_errors_exit_3(root, capsys, monkeypatch):
    def no_credentials(handle):
        raise botocore.exceptions.NoCredentialsError()

    monkeypatch.setattr(cli, "sagemaker_job", no_credentials)
    code, _, err = run(capsys, "status", "sagemaker://us-west-2/some-job")
    assert code == 3 and "credentials" in err.lower()


def test_interrupt_exits_130(root, capsys, monkeypatch):
    def interrupted(handle):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "sagemaker_job", interrupted)
    code, _, _ = run(capsys, "status", "sagemaker://us-west-2/some-job")
    assert code == 130


def test_config_init_and_show(root, capsys, tmp_path):
    code, out, _ = run(capsys, "config", "init")
    assert code == 0 and out.strip() == str(tmp_path / "xdg/shoal/config.yaml")
    code, _, err = run(capsys, "config", "init")
    assert code == 2 and "--force" in err
    (tmp_path / "xdg/shoal/config.yaml").write_text("region: eu-west-1\nrole: user-role\n")
    (tmp_path / "shoal.yaml").write_text("region: us-east-1\nvolume_size: 50\n")
    code, out, _ = run(capsys, "config", "show", "--output", "json")
    shown = json.loads(out)
    assert shown["region"] == {"value": "eu-west-1", "from": "user"}
    assert shown["volume_size"] == {"value": 50, "from": "project"}


def test_env_lists_versions_and_no_secrets(root, capsys, monkeypatch):
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "verysecretvalue123")
    code, out, _ = run(capsys, "env", "--output", "json")
    report = json.loads(out)
    assert code == 0
    assert {"shoal", "python", "torch", "tensorflow", "open_mpi", "boto3", "platform"} <= set(report)
    assert report["open_mpi"].startswith("mpirun (Open MPI)")
    assert "verysecretvalue123" not in out and "testing" not in out


def test_dry_run_request_is_redacted(root, tmp_path):
    import shoal
    from shoal.config import JobSpec

    (tmp_path / "train.py").write_text("print(1)\n")
    estimator = shoal.PyTorch(
        entry_point=str(tmp_path / "train.py"), role="arn:aws:iam::111122223333:role/R",
        instance_type="local", instance_count=1, framework_version="1.13.1", py_version="py39",
        environment={"DB_PASSWORD": "hunter2hunter2"}, allow_secrets=True)
    request = cli.dry_run_request(estimator, JobSpec(job_name="redacted-job"))
    assert request["TrainingJobName"] == "redacted-job"
    assert "hunter2hunter2" not in json.dumps(request)
    assert request["Environment"]["DB_PASSWORD"] == "***"


def test_status_and_list_of_sagemaker_jobs(root, capsys):
    import boto3
    from moto import mock_aws

    with mock_aws():
        client = boto3.client("sagemaker", region_name="us-west-2")
        client.create_training_job(
            TrainingJobName="sm-job",
            AlgorithmSpecification={"TrainingImage": "img", "TrainingInputMode": "File"},
            RoleArn="arn:aws:iam::123456789012:role/R",
            OutputDataConfig={"S3OutputPath": "s3://b/o"},
            ResourceConfig={"InstanceType": "ml.m5.xlarge", "InstanceCount": 1,
                            "VolumeSizeInGB": 30},
            StoppingCondition={"MaxRuntimeInSeconds": 60})
        code, out, _ = run(capsys, "status", "sagemaker://us-west-2/sm-job", "--output", "json")
        assert code == 0 and json.loads(out)["TrainingJobName"] == "sm-job"
        code, out, _ = run(capsys, "list", "--sagemaker", "us-west-2", "--output", "json")
        assert [r["Handle"] for r in json.loads(out)] == ["sagemaker://us-west-2/sm-job"]
        code, out, _ = run(capsys, "list", "--sagemaker", "us-west-2", "--since", "1h")
        assert out.splitlines()[1].split()[0] == "sagemaker://us-west-2/sm-job"
        code, out, _ = run(capsys, "list", "--sagemaker", "us-west-2", "--since", "2999-01-01")
        assert code == 0 and out.splitlines()[1:] == []


def test_run_on_sagemaker_detached_prints_the_sagemaker_handle(root, capsys, tmp_path):
    import boto3
    from moto import mock_aws

    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "train.py").write_text("print('hi')\n")
    with mock_aws():
        code, out, err = run(
            capsys, "run", "--entry-point", "train.py", "--source-dir", str(tmp_path / "code"),
            "--framework", "pytorch", "--framework-version", "1.13.1", "--py-version", "py39",
            "--role", "arn:aws:iam::123456789012:role/R", "--region", "us-west-2",
            "--instance-type", "ml.m5.xlarge", "--instance-count", "1",
            "--job-name", "remote-job", "-H", "epochs=3", "--detach")
        assert code == 0, err
        assert out == "sagemaker://us-west-2/remote-job\n"
        described = boto3.client("sagemaker", region_name="us-west-2").describe_training_job(
            TrainingJobName="remote-job")
        assert described["HyperParameters"]["epochs"] == "3"
        assert "shoal logs sagemaker://us-west-2/remote-job" in err


def test_sagemaker_dry_run_makes_no_call_and_equals_what_fit_submits(root, capsys, tmp_path,
                                                                   monkeypatch):
    from moto import mock_aws
    from shoal import config as config_mod
    from shoal.backends import sagemaker as sagemaker_backend

    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "train.py").write_text("print('hi')\n")
    argv = ["run", "--entry-point", "train.py", "--source-dir", str(tmp_path / "code"),
            "--framework-version", "1.13.1", "--py-version", "py39",
            "--role", "arn:aws:iam::123456789012:role/R", "--region", "us-west-2",
            "--instance-type", "ml.p4d.24xlarge", "--instance-count", "2", "-H", "lr=0.1",
            "-i", "train=s3://data/train", "--job-name", "planned-job"]
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")  # any call would fail loudly
    code, out, err = run(capsys, *argv, "--dry-run")
    assert code == 0, err
    printed = json.loads(out)
    monkeypatch.delenv("AWS_ENDPOINT_URL")

    submitted = []

    class Recorder:
        def __init__(self, session, **options):
            pass

        def submit(self, request):
            submitted.append(request)
            raise KeyboardInterrupt  # stop before following

    monkeypatch.setattr(sagemaker_backend, "backend", Recorder)
    with mock_aws():
        spec = config_mod.resolve(None, {
            "entry_point": "train.py", "source_dir": str(tmp_path / "code"),
            "framework_version": "1.13.1", "py_version": "py39",
            "role": "arn:aws:iam::123456789012:role/R", "region": "us-west-2",
            "instance_type": "ml.p4d.24xlarge", "instance_count": 2,
            "hyperparameters": {"lr": 0.1}, "inputs": {"train": "s3://data/train"}})
        with pytest.raises(KeyboardInterrupt):
            config_mod.build_estimator(spec).fit(spec.inputs, job_name="planned-job")
    assert json.loads(json.dumps(submitted[0], default=str)) == printed


def test_dry_run_on_sagemaker_needs_a_role_arn(root, capsys):
    code, _, err = run(capsys, "run", "--entry-point", "t.py", "--region", "us-west-2",
                       "--instance-type", "ml.m5.xlarge", "--role", "MyRole", "--dry-run")
    assert code == 2 and "role ARN" in err


def test_a_job_being_started_is_not_mistaken_for_a_dead_one(root, capsys):
    paths = layout.JobPaths(root / "starting")
    paths.job_dir.mkdir(parents=True)
    state.write(paths.state_file, state.initial({**REQUEST, "TrainingJobName": "starting"}))
    code, out, _ = run(capsys, "status", "local://starting")
    assert code == 0 and "TrainingJobStatus: InProgress" in out


@pytest.mark.parametrize("extra", [[], ["--dry-run"]])
def test_run_refuses_missing_code_with_exit_2_and_starts_nothing(root, capsys, tmp_path, extra):
    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "train.py").write_text("print('hi')\n")
    code, out, err = run(capsys, "run", "--local", "--entry-point", "trian.py", "--source-dir",
                         "code", "--framework-version", "1.13.1", "--instance-count", "1",
                         "--job-name", "typo", *extra)
    assert code == 2 and out == ""
    assert ("error: 'entry_point' names no file: 'trian.py' not found in source_dir 'code' "
            "(did you mean 'train.py'?)") in err
    code, _, err = run(capsys, "run", "--local", "--entry-point", "train.py", "--source-dir",
                       "nocode", "--framework-version", "1.13.1", "--instance-count", "1",
                       *extra)
    assert code == 2 and "'source_dir' is not a directory: 'nocode'" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["code"]


@pytest.mark.parametrize("name", ["taken-job", "Taken-Job"])
def test_run_refuses_a_taken_job_name_with_exit_2_and_starts_nothing(root, capsys, tmp_path,
                                                                     monkeypatch, name):
    from shoal.local import process

    monkeypatch.setattr(process, "spawn_runner", lambda *a: pytest.fail("a job was started"))
    paths = finished_job(root, "taken-job", "Completed")
    record = paths.state_file.read_bytes()
    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "train.py").write_text("print('hi')\n")
    code, out, err = run(capsys, "run", "--local", "--entry-point", "train.py", "--source-dir",
                         "code", "--framework-version", "1.13.1", "--instance-count", "1",
                         "--job-name", name)
    assert code == 2 and out == ""
    assert "a local job named 'taken-job' already exists" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["code", "jobs"]
    assert [p.name for p in root.iterdir()] == ["taken-job"]
    assert paths.state_file.read_bytes() == record


def secret_job(tmp_path, **keys):
    (tmp_path / "train.py").write_text("print('hi')\n")
    (tmp_path / "job.yaml").write_text(yaml.safe_dump({
        "entry_point": "train.py", "instance_type": "local", "instance_count": 1,
        "framework_version": "1.13.1", "job_name": "secret-job",
        "hyperparameters": {"api_key": "sk-live-12345"},
        "environment": {"GITHUB_TOKEN": "ghp_" + "x1" * 18}, **keys}))


def test_run_names_every_secret_and_the_three_ways_to_allow_them(root, capsys, tmp_path):
    secret_job(tmp_path)
    code, out, err = run(capsys, "run", "job.yaml", "--dry-run")
    assert code == 2 and out == ""
    assert "hyperparameters['api_key'] (secret-looking key name)" in err
    assert "environment['GITHUB_TOKEN'] (GitHub token)" in err
    assert "allow_secrets=True" in err and "allow_secrets: true" in err
    assert "shoal run --allow-secrets" in err
    assert "sk-live-12345" not in err and "ghp_" not in err


@pytest.mark.parametrize("keys, flags", [({}, ["--allow-secrets"]),
                                         ({"allow_secrets": True}, [])])
def test_run_sends_secrets_when_allowed_by_flag_or_job_file(root, capsys, tmp_path, keys, flags):
    secret_job(tmp_path, **keys)
    code, out, err = run(capsys, "run", "job.yaml", "--dry-run", *flags)
    assert code == 0, err
    request = json.loads(out)
    assert request["HyperParameters"]["api_key"] == "***"  # redacted, but sent
    assert request["Environment"] == {"GITHUB_TOKEN": "***"}


EXAMPLE_JOBS = sorted((Path(__file__).resolve().parents[2] / "examples").glob("*/job*.yaml"))


@pytest.mark.parametrize("job_file", EXAMPLE_JOBS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_example_job_file_dry_runs_to_its_distribution(root, capsys, job_file):
    """The job files the README and the examples print (their runs are the integration
    tests' and the notebooks'): each resolves to a request whose hyperparameters carry the
    file's distribution, as SageMaker's SDK sends it."""
    spec = yaml.safe_load(job_file.read_text())
    code, out, err = run(capsys, "run", str(job_file), "--dry-run", "--job-name", "example")
    assert code == 0, err
    request = json.loads(out)
    assert request["ResourceConfig"]["InstanceCount"] == spec["instance_count"]
    hps = {k: json.loads(v) for k, v in request["HyperParameters"].items()}
    assert hps["sagemaker_program"] == spec["entry_point"]
    mpi = spec["distribution"].get("mpi", {})
    if mpi:
        assert hps["sagemaker_mpi_enabled"] is True
        assert hps["sagemaker_mpi_num_of_processes_per_host"] == mpi["processes_per_host"]
    parallel = spec["distribution"].get("smdistributed", {}).get("modelparallel")
    if parallel:
        assert hps["mp_parameters"] == parallel["parameters"]
