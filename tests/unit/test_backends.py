"""The backend protocol and the choice of backend by instance type."""

import sys
import types

import pytest
from shoal.backends import Backend, TrainingJob, backend_for, backend_name


def test_backend_name_by_instance_type():
    assert backend_name("local") == backend_name("local_gpu") == "local"
    assert backend_name("ml.p4d.24xlarge") == backend_name(None) == "sagemaker"


@pytest.mark.parametrize("attribute", ["backend", "SageMakerBackend"])
def test_backend_for_builds_the_modules_backend_with_the_session(monkeypatch, attribute):
    module = types.ModuleType("shoal.backends.sagemaker")
    setattr(module, attribute, lambda session: ("backend", session))
    monkeypatch.setitem(sys.modules, "shoal.backends.sagemaker", module)
    assert backend_for("ml.c5.xlarge", "the-session") == ("backend", "the-session")


def test_local_instance_types_get_the_local_backend():
    backend = backend_for("local", None)
    assert type(backend).__module__ == "shoal.backends.local"
    assert isinstance(backend, Backend)


def test_protocols_describe_backends_and_jobs():
    class Job:
        name = "j"
        model_data = None

        def describe(self):
            return {}

        def wait(self, logs="All"):
            return {}

        def logs(self):
            pass

        def stop(self):
            pass

    assert isinstance(Job(), TrainingJob)
    assert not isinstance(object(), Backend)


def test_slurm_is_chosen_by_the_session_or_the_environment_but_never_for_local_types(
        monkeypatch, tmp_path):
    import shoal
    from shoal.errors import ConfigError

    monkeypatch.delenv("SHOAL_BACKEND", raising=False)
    session = shoal.Session(backend="slurm", slurm={"shared_dir": str(tmp_path)})
    assert backend_name("ml.p4d.24xlarge", session) == "slurm"
    assert backend_name("local", session) == "local"
    backend = backend_for("ml.c5.xlarge", session)
    assert type(backend).__name__ == "SlurmBackend" and backend.settings.shared_dir == tmp_path
    monkeypatch.setenv("SHOAL_BACKEND", "slurm")
    assert backend_name("ml.c5.xlarge") == "slurm"
    monkeypatch.setenv("SHOAL_BACKEND", "slurn")
    with pytest.raises(ConfigError, match=r"'backend' must be one of local, sagemaker, slurm "
                                          r"\(got 'slurn'\)"):
        backend_name("ml.c5.xlarge")


def test_an_estimator_on_slurm_uses_files_in_place_and_needs_no_aws(monkeypatch, tmp_path):
    import shoal

    monkeypatch.delenv("SHOAL_BACKEND", raising=False)
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", "/dev/null")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/dev/null")
    (tmp_path / "train.py").write_text("print('hi')\n")
    est = shoal.PyTorch(entry_point=str(tmp_path / "train.py"), role="R",
                        framework_version="2.0.1", py_version="py310",
                        instance_type="ml.m5.xlarge", instance_count=2,
                        sagemaker_session=shoal.Session(backend="slurm",
                                                        slurm={"shared_dir": str(tmp_path)}))
    request = est.build_request({"train": tmp_path.as_uri()}, job_name="j-1")
    assert request["OutputDataConfig"]["S3OutputPath"] == (tmp_path / "output").as_uri() + "/"
    assert request["RoleArn"] == "R"  # not expanded through IAM
    assert request["HyperParameters"]["sagemaker_submit_directory"] == f'"{tmp_path.as_uri()}"'
    assert request["AlgorithmSpecification"]["TrainingImage"].startswith(
        "shoal-pytorch-training:2.0.1-cpu")
    assert request["InputDataConfig"][0]["DataSource"]["FileDataSource"]["FileUri"] == \
        tmp_path.as_uri()
    assert request["ResourceConfig"]["InstanceType"] == "ml.m5.xlarge"


def test_checkpoints_may_go_to_the_clusters_filesystem_on_slurm_only(monkeypatch, tmp_path):
    import shoal
    from shoal.errors import ValidationError

    monkeypatch.delenv("SHOAL_BACKEND", raising=False)
    args = {"entry_point": "train.py", "role": "R", "framework_version": "2.0.1",
            "py_version": "py310", "instance_type": "ml.m5.xlarge", "instance_count": 2,
            "checkpoint_s3_uri": (tmp_path / "ckpt").as_uri()}
    slurm = shoal.Session(backend="slurm", slurm={"shared_dir": str(tmp_path)})
    assert shoal.PyTorch(**args, sagemaker_session=slurm).config.checkpoint_s3_uri.startswith(
        "file://")
    with pytest.raises(ValidationError, match="'checkpoint_s3_uri' must match regex"):
        shoal.PyTorch(**args, sagemaker_session=shoal.Session(
            boto_session=__import__("boto3").Session(region_name="us-west-2")))
