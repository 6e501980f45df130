"""The advisor's public surface: findings, advise() on each kind of job, and ``fit()``
running it (logged once, strict mode, off). The checks are tested beside their modules
(test_planning_job_checks, test_planning_region_checks, test_planning_script_checks), which
share this file's jobs and scripts."""

import logging

import boto3
import pytest
import shoal
from moto import mock_aws
from shoal import estimator as estimator_module
from shoal.errors import ValidationError
from shoal.planning import advisor

ROLE = "arn:aws:iam::123456789012:role/SageMakerRole"
REGION = "us-west-2"
SMDDP = {"smdistributed": {"dataparallel": {"enabled": True}}}


def session():
    return shoal.Session(boto_session=boto3.Session(region_name=REGION))


def pytorch(**changes):
    args = {"entry_point": "train.py", "role": ROLE, "instance_count": 2,
            "instance_type": "ml.p4d.24xlarge", "framework_version": "1.13.1",
            "py_version": "py39", "distribution": SMDDP, "sagemaker_session": session()}
    return shoal.PyTorch(**{**args, **changes})


def smp(parameters, **changes):
    distribution = {"smdistributed": {"modelparallel": {"enabled": True,
                                                        "parameters": parameters}},
                    "mpi": {"enabled": True, "processes_per_host": 8}}
    return pytorch(distribution=distribution, **changes)


def codes(findings):
    return [f.code for f in findings]


def only(findings, code):
    found = [f for f in findings if f.code == code]
    assert len(found) == 1, codes(findings)
    return found[0]


# ---------------------------------------------------------------- findings


def test_finding_is_frozen_and_validated():
    finding = advisor.Finding("SHOAL-DP001", "info", "m", "f", "s")
    with pytest.raises(AttributeError):
        finding.code = "x"
    with pytest.raises(ValueError, match="'severity' must be in"):
        advisor.Finding("SHOAL-DP001", "fatal", "m", "f", "s")
    assert finding.to_dict() == {"code": "SHOAL-DP001", "severity": "info", "message": "m",
                                 "fix": "f", "source": "s"}


def test_a_plain_job_has_no_findings():
    est = pytorch(distribution=None, instance_count=1, instance_type="ml.c5.xlarge")
    assert advisor.advise(est, "s3://sagemaker-us-west-2-123456789012/data") == []


def test_findings_are_sorted_errors_first():
    est = pytorch(instance_count=1, image_uri="r/x:1-cu102",
                  hyperparameters={"batch_size": 32, "lr": 0.1})
    severities = [f.severity for f in advisor.advise(est)]
    assert severities == sorted(severities, key=["error", "warning", "info"].index)
    assert severities[0] == "error"


def test_advise_refuses_what_is_not_an_estimator():
    with pytest.raises(TypeError, match="needs a Shoal estimator"):
        advisor.advise({"instance_count": 2})


# ---------------------------------------------------------------- scripts the checks read


TORCH_SCRIPT = """
from torchvision import transforms
loader = DataLoader(dataset, batch_size=64, num_workers=8, shuffle=True)
"""
TF_SCRIPT = """
ds = tf.data.TFRecordDataset(files).map(parse_image).batch(64)
"""


# ---------------------------------------------------------------- fit() and the modes


class FakeJob:
    name = "job"

    def wait(self, logs="All"):
        pass


class FakeBackend:
    def __init__(self):
        self.submitted = []

    def submit(self, request):
        self.submitted.append(request)
        return FakeJob()


@pytest.fixture
def backend(monkeypatch, tmp_path):
    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "train.py").write_text(TORCH_SCRIPT)
    monkeypatch.chdir(tmp_path)
    fake = FakeBackend()
    monkeypatch.setattr(estimator_module, "backend_for", lambda instance_type, session: fake)
    monkeypatch.setattr(estimator_module.EstimatorBase, "_stage_code", lambda self, name: None)
    monkeypatch.delenv(advisor.ENV_MODE, raising=False)
    with mock_aws():
        yield fake


def advisor_records(caplog):
    return [r for r in caplog.records if r.name == "shoal.advisor"]


def test_fit_logs_each_finding_once(backend, caplog):
    caplog.set_level(logging.INFO, logger="shoal.advisor")
    est = pytorch(source_dir="code", instance_count=1)
    est.fit("s3://data-eu-west-1/train", job_name="job-1")
    est.fit("s3://data-eu-west-1/train", job_name="job-2")
    messages = [r.getMessage() for r in advisor_records(caplog)]
    assert len(backend.submitted) == 2  # errors do not stop a job by default
    for code in ("SHOAL-DP001", "SHOAL-DP003", "SHOAL-DP007"):  # DP007 read from train.py
        assert len([m for m in messages if m.startswith(code)]) == 1, messages
    levels = {r.getMessage()[:11]: r.levelno for r in advisor_records(caplog)}
    assert levels["SHOAL-DP003"] == logging.ERROR
    assert levels["SHOAL-DP007"] == logging.WARNING


def test_strict_mode_from_the_environment_rejects_errors(backend, monkeypatch):
    monkeypatch.setenv(advisor.ENV_MODE, "strict")
    est = pytorch(source_dir="code")
    with pytest.raises(ValidationError, match="SHOAL-DP003: channel 'train' reads S3 bucket"):
        est.fit({"train": "s3://data-eu-west-1/train"}, job_name="job-1")
    assert backend.submitted == []
    est.fit({"train": "s3://data-us-west-2/train"}, job_name="job-2")  # warnings pass
    assert len(backend.submitted) == 1


def test_strict_estimator_option(backend):
    est = pytorch(source_dir="code", advice="strict",
                  image_uri="1.dkr.ecr.us-west-2.amazonaws.com/pt:1.8.1-gpu-py36-cu102")
    with pytest.raises(ValidationError, match="SHOAL-DP002"):
        est.fit(job_name="job-1")
    assert backend.submitted == []


def test_off_silences_the_advisor(backend, monkeypatch, caplog):
    caplog.set_level(logging.INFO, logger="shoal.advisor")
    monkeypatch.setenv(advisor.ENV_MODE, "off")
    pytorch(source_dir="code", instance_count=1).fit("s3://data-eu-west-1/x", job_name="job-1")
    assert advisor_records(caplog) == []
    assert len(backend.submitted) == 1


def test_the_estimator_option_wins_over_the_environment(backend, monkeypatch, caplog):
    caplog.set_level(logging.INFO, logger="shoal.advisor")
    monkeypatch.setenv(advisor.ENV_MODE, "strict")
    pytorch(source_dir="code", advice="warn").fit("s3://data-eu-west-1/x", job_name="job-1")
    assert len(backend.submitted) == 1
    assert any(r.getMessage().startswith("SHOAL-DP003") for r in advisor_records(caplog))


def test_invalid_modes_are_refused(monkeypatch):
    with pytest.raises(ValidationError, match=r"'advice' must be in \('warn', 'strict', 'off'\)"):
        pytorch(advice="loud")
    monkeypatch.setenv(advisor.ENV_MODE, "loud")
    with pytest.raises(ValidationError, match="'SHOAL_ADVICE' must be in"):
        advisor.mode()


def test_read_script_only_reads_local_files(tmp_path):
    (tmp_path / "train.py").write_text("print(1)\n")
    est = pytorch(entry_point="train.py", source_dir=str(tmp_path))
    assert advisor.read_script(est.config) == "print(1)\n"
    assert advisor.read_script(pytorch(source_dir="s3://bucket/code.tar.gz").config) is None
    assert advisor.read_script(pytorch(entry_point="missing.py").config) is None


def test_a_job_spec_brings_its_inputs_and_region():
    from shoal.config import parse_spec

    spec = parse_spec({"framework": "pytorch", "entry_point": "train.py", "role": ROLE,
                       "framework_version": "1.13.1", "py_version": "py39",
                       "region": "eu-west-1", "instance_type": "ml.p4d.24xlarge",
                       "instance_count": 1, "distribution": SMDDP,
                       "inputs": {"train": "s3://data-us-east-1/train"}})
    findings = advisor.advise(spec)
    assert codes(findings) == ["SHOAL-DP003", "SHOAL-DP001"]
    assert "job runs in eu-west-1" in findings[0].message


def test_a_training_config_alone_gets_the_checks_it_can_answer():
    config = pytorch(disable_profiler=True, instance_count=3).config
    findings = advisor.advise(config, "s3://data-eu-west-1/x", region=REGION)
    assert codes(findings) == ["SHOAL-DP003", "SHOAL-DP010"]


def test_tensorflow_data_parallel_job():
    est = shoal.TensorFlow(entry_point="train.py", role=ROLE, instance_count=2,
                           instance_type="ml.p3.16xlarge", framework_version="2.11.0",
                           py_version="py39", distribution=SMDDP, sagemaker_session=session(),
                           hyperparameters={"batch_size": 64, "learning_rate": 0.001})
    findings = advisor.advise(est, script_text=TF_SCRIPT)
    assert codes(findings) == ["SHOAL-DP007", "SHOAL-DP008"]
    assert "tf.data map without num_parallel_calls" in findings[0].message
    assert "x 16 processes" in findings[1].message
