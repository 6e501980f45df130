"""``shoal advise`` and ``shoal plan``, through click's CliRunner on the mounted CLI."""

import json

import pytest
import yaml
from click.testing import CliRunner
from shoal import cli

ROLE = "arn:aws:iam::123456789012:role/SageMakerRole"
JOB = {
    "framework": "pytorch", "entry_point": "train.py", "source_dir": "code",
    "framework_version": "1.13.1", "py_version": "py39", "role": ROLE, "region": "us-west-2",
    "instance_type": "ml.p4d.24xlarge", "instance_count": 2,
    "hyperparameters": {"batch_size": 32, "lr": 0.1},
    "distribution": {"smdistributed": {"dataparallel": {"enabled": True}}},
    "inputs": {"train": "s3://data-us-west-2/train"},
}


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    monkeypatch.delenv("SHOAL_CONFIG", raising=False)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "train.py").write_text("loader = DataLoader(ds, num_workers=16)\n")
    return tmp_path


def job_file(path, name="job.yaml", **changes):
    file = path / name
    file.write_text(yaml.safe_dump({**JOB, **changes}))
    return str(file)


def invoke(*argv):
    return CliRunner().invoke(cli.cli, list(argv), catch_exceptions=False)


def test_advise_prints_findings_with_their_fixes(workdir):
    result = invoke("advise", job_file(workdir))
    assert result.exit_code == 0
    assert "SHOAL-DP005 info" in result.output
    assert "SHOAL-DP007 warning" in result.output  # read from the job's own train.py
    assert "SHOAL-DP008 info" in result.output
    assert "fix: " in result.output and "tip: Data Preprocessing" in result.output


def test_advise_json_and_a_script_given_on_the_command_line(workdir):
    other = workdir / "other.py"
    other.write_text("print('nothing heavy')\n")
    result = invoke("advise", job_file(workdir), "--script", str(other), "--output", "json")
    findings = json.loads(result.output)
    assert {f["code"] for f in findings} == {"SHOAL-DP005", "SHOAL-DP008"}
    assert set(findings[0]) == {"code", "severity", "message", "fix", "source"}


def test_advise_sizes_fsx_from_the_hints(workdir):
    result = invoke("advise", job_file(workdir, instance_count=4), "--dataset-gb", "100",
                    "--epoch-seconds", "30", "--output", "json")
    plan = [f for f in json.loads(result.output) if f["code"] == "SHOAL-DP006"][0]
    assert "SCRATCH_2 at its minimum 1.2 TiB gives 240 MB/s" in plan["message"]


def test_advise_strict_exits_2_on_errors_only(workdir):
    bad = job_file(workdir, "bad.yaml", inputs={"train": "s3://data-eu-west-1/train"})
    assert invoke("advise", bad).exit_code == 0
    strict = invoke("advise", bad, "--strict")
    assert strict.exit_code == 2
    assert "SHOAL-DP003 error" in strict.output
    assert invoke("advise", job_file(workdir), "--strict").exit_code == 0  # warnings only
    assert cli.main(["advise", bad, "--strict", "--output", "json"]) == 2


def test_advise_with_nothing_to_say(workdir):
    plain = job_file(workdir, distribution=None, instance_count=1, instance_type="ml.c5.xlarge",
                     hyperparameters=None)
    result = invoke("advise", plain)
    assert result.exit_code == 0
    assert result.output.strip() == "no findings"


def test_advise_reports_a_bad_job_file_as_a_configuration_error(workdir, capsys):
    (workdir / "bad.yaml").write_text("instance_cnt: 2\n")
    assert cli.main(["advise", str(workdir / "bad.yaml")]) == 2
    assert "did you mean 'instance_count'" in capsys.readouterr().err


def test_plan_fsx_table_and_json():
    result = invoke("plan", "fsx", "--dataset-gb", "100", "--epoch-seconds", "30",
                    "--instance-count", "4")
    assert result.exit_code == 0
    assert "required throughput: 3333 MB/s (833 MB/s per instance x 4)" in result.output
    row = [line for line in result.output.splitlines() if "SCRATCH_2" in line][0]
    assert [cell.strip() for cell in row.strip("│ ").split("│")] == [
        "SCRATCH_2", "200", "16.8", "3360", "1.2", "240"]
    data = json.loads(invoke("plan", "fsx", "--dataset-gb", "100", "--epoch-seconds", "30",
                             "--deployment-type", "SCRATCH_2", "--output", "json").output)
    assert data["required_mbps"] == pytest.approx(3333.33, abs=0.01)
    assert data["options"] == [{"deployment_type": "SCRATCH_2", "per_unit_throughput": 200,
                                "storage_gib": 16800, "throughput_mbps": 3360.0,
                                "minimum_storage_gib": 1200, "minimum_throughput_mbps": 240.0}]


def test_plan_fsx_rejects_bad_values(capsys):
    code = cli.main(["plan", "fsx", "--dataset-gb", "0", "--epoch-seconds", "30"])
    assert code == 2
    assert "'dataset_gb' must be > 0 (got 0.0)" in capsys.readouterr().err


def test_plan_lr():
    result = invoke("plan", "lr", "--base-lr", "0.1", "--base-batch", "32", "--processes", "16",
                    "--warmup-steps", "2")
    assert "global batch 512 = 16 x 32: learning rate 0.1 -> 1.6" in result.output
    data = json.loads(invoke("plan", "lr", "--base-lr", "0.1", "--base-batch", "32",
                             "--global-batch", "128", "--warmup-steps", "2", "--output",
                             "json").output)
    assert data["scaled_lr"] == pytest.approx(0.4)
    assert data["warmup_schedule"] == pytest.approx([0.1, 0.25, 0.4])
    missing = CliRunner().invoke(cli.cli, ["plan", "lr", "--base-lr", "0.1", "--base-batch", "32"])
    assert missing.exit_code == 2 and "give --global-batch or --processes" in missing.output


def test_plan_microbatches():
    result = invoke("plan", "microbatches", "--batch-size", "24", "--candidates", "2,4,5,8")
    assert "not dividing 24: 5" in result.output
    data = json.loads(invoke("plan", "microbatches", "--batch-size", "8", "--candidates", "2,4",
                             "--dataset-size", "1002", "--output", "json").output)
    assert data["last_batch"] == 2
    assert [(o["microbatches"], o["drop_last"]) for o in data["options"]] == [(2, False),
                                                                               (4, True)]
    bad = CliRunner().invoke(cli.cli, ["plan", "microbatches", "--batch-size", "8",
                                       "--candidates", "two"])
    assert bad.exit_code == 2 and "expected comma-separated ints" in bad.output


def test_plan_topology():
    result = invoke("plan", "topology", "--instance-type", "ml.p4d.24xlarge",
                    "--instance-count", "4", "--allreduce-mb", "100")
    assert "4 hosts x 8 ranks = 32 ranks (ml.p4d.24xlarge)" in result.output
    assert "175.0 in host + 18.8 between hosts" in result.output
    data = json.loads(invoke("plan", "topology", "--instance-type", "ml.g5.12xlarge",
                             "--instance-count", "2", "--output", "json").output)
    assert (data["local_size"], data["world_size"]) == (4, 8)
    assert data["allreduce"]["inter_host_bytes_per_rank"] == pytest.approx(2 * 1 / 2 * 10**8 / 4)
