"""Job files and configuration layers: strict keys, types, and precedence."""

import pytest
import yaml
from shoal.config import JobSpec, config_layers, load_spec, parse_spec, resolve
from shoal.errors import ConfigError


@pytest.fixture
def homes(tmp_path, monkeypatch):
    """An isolated user config dir and project dir."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    monkeypatch.delenv("SHOAL_CONFIG", raising=False)
    project = tmp_path / "project"
    project.mkdir()
    return tmp_path / "xdg" / "shoal" / "config.yaml", project


def write(path, data):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(data))
    return path


def test_job_file_is_parsed_into_a_spec(tmp_path):
    path = write(tmp_path / "job.yaml", {
        "framework": "pytorch", "entry_point": "train.py", "instance_count": 2,
        "inputs": {"train": "file:///data"}, "hyperparameters": {"epochs": 3},
    })
    spec = load_spec(path)
    assert spec.entry_point == str(tmp_path / "train.py") and spec.instance_count == 2
    assert spec.inputs == {"train": "file:///data"} and spec.hyperparameters == {"epochs": 3}


def test_unknown_key_is_rejected_with_a_suggestion():
    with pytest.raises(ConfigError, match="unknown key 'instance_cont' \\(did you mean 'instance_count'\\?\\)"):
        parse_spec({"instance_cont": 2})
    with pytest.raises(ConfigError, match="unknown key 'zzz'$"):
        parse_spec({"zzz": 1})


@pytest.mark.parametrize(
    "data, message",
    [
        ({"instance_count": "2"}, "'instance_count' must be int \\(got '2'\\)"),
        ({"instance_count": 0}, "'instance_count' must be >= 1 \\(got 0\\)"),
        ({"framework": "jax"}, "'framework' must be in"),
        ({"hyperparameters": ["a"]}, "'hyperparameters' must be a mapping"),
        ({"inputs": {"train": 3}}, "'inputs.train' must be a URI string"),
        ({"allow_secrets": "yes"}, "'allow_secrets' must be bool \\(got 'yes'\\)"),
    ],
)
def test_wrong_types_say_what_was_wrong(data, message):
    with pytest.raises(ConfigError, match=message):
        parse_spec(data, source="job.yaml")


def test_non_mapping_and_bad_yaml(tmp_path):
    with pytest.raises(ConfigError, match="expected a mapping"):
        parse_spec(["a"])
    bad = tmp_path / "bad.yaml"
    bad.write_text("a: [1,\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_spec(bad)
    with pytest.raises(ConfigError, match="no such file"):
        load_spec(tmp_path / "missing.yaml")


def test_precedence_flags_then_job_file_then_env_then_user_then_project(homes, tmp_path, monkeypatch):
    user, project = homes
    write(project / "shoal.yaml", {"role": "project-role", "region": "eu-west-1",
                                   "instance_type": "ml.m5.xlarge", "output_path": "s3://p/o",
                                   "volume_size": 50})
    write(user, {"role": "user-role", "region": "us-east-1", "instance_type": "ml.c5.xlarge",
                 "output_path": "s3://u/o"})
    env = write(tmp_path / "env.yaml", {"region": "us-west-2", "instance_type": "ml.g5.xlarge",
                                         "output_path": "s3://e/o"})
    monkeypatch.setenv("SHOAL_CONFIG", str(env))
    job = write(tmp_path / "job.yaml", {"entry_point": "t.py", "instance_type": "local",
                                         "output_path": "s3://j/o"})
    spec = resolve(job, flags={"output_path": "file:///flag", "instance_count": None}, cwd=project)
    assert spec.output_path == "file:///flag"
    assert spec.instance_type == "local"
    assert spec.region == "us-west-2"
    assert spec.role == "user-role"
    assert spec.volume_size == 50
    assert spec.instance_count is None
    assert [name for name, _ in config_layers(project)] == ["project", "user", "SHOAL_CONFIG"]


def test_a_missing_shoal_config_file_is_an_error(homes, monkeypatch, tmp_path):
    monkeypatch.setenv("SHOAL_CONFIG", str(tmp_path / "nope.yaml"))
    with pytest.raises(ConfigError, match="SHOAL_CONFIG"):
        resolve(None, {}, cwd=homes[1])


def test_an_error_names_the_layer(homes):
    user, project = homes
    write(user, {"regoin": "us-east-1"})
    with pytest.raises(ConfigError, match=str(user) + ": unknown key 'regoin' \\(did you mean 'region'"):
        resolve(None, {}, cwd=project)


def test_is_local():
    assert JobSpec(instance_type="local").is_local
    assert JobSpec(instance_type="local_gpu").is_local
    assert not JobSpec(instance_type="ml.p4d.24xlarge").is_local


def test_code_paths_in_a_file_are_relative_to_the_file(tmp_path):
    write(tmp_path / "jobs" / "a.yaml", {"entry_point": "train.py", "source_dir": "../code",
                                        "dependencies": ["lib", "/abs/lib"]})
    spec = load_spec(tmp_path / "jobs" / "a.yaml")
    assert spec.source_dir == str(tmp_path / "jobs" / "../code")
    assert spec.entry_point == "train.py"  # relative to source_dir, as the estimator takes it
    assert spec.dependencies == [str(tmp_path / "jobs" / "lib"), "/abs/lib"]
    write(tmp_path / "b.yaml", {"entry_point": "train.py"})
    assert load_spec(tmp_path / "b.yaml").entry_point == str(tmp_path / "train.py")
    write(tmp_path / "c.yaml", {"source_dir": "s3://bkt/code/sourcedir.tar.gz"})
    assert load_spec(tmp_path / "c.yaml").source_dir == "s3://bkt/code/sourcedir.tar.gz"


def test_local_network_and_link_reach_the_local_supervisor_through_its_environment():
    from shoal.config import estimator_kwargs, local_environment

    spec = parse_spec({"instance_type": "local", "local_network": "namespaces",
                       "local_link": "rate=10gbit,delay=50us"})
    assert local_environment(spec) == {"SHOAL_LOCAL_NETWORK": "namespaces",
                                       "SHOAL_LOCAL_LINK": "rate=10gbit,delay=50us"}
    assert "local_network" not in estimator_kwargs(spec)
    assert local_environment(parse_spec({"instance_type": "local"})) == {}


def test_a_bad_local_network_or_link_is_refused_before_anything_runs():
    from shoal.config import local_environment
    from shoal.local.network.links import LinkError

    with pytest.raises(ConfigError, match="local_network"):
        parse_spec({"local_network": "bridged"})
    with pytest.raises(LinkError, match="unknown link setting 'jitter'"):
        local_environment(parse_spec({"local_link": "jitter=1ms"}))


def test_allow_secrets_in_a_job_file_reaches_the_estimator(homes, tmp_path):
    from shoal.config import build_estimator, estimator_kwargs

    job = write(tmp_path / "job.yaml", {
        "entry_point": "train.py", "instance_type": "local", "instance_count": 1,
        "framework_version": "1.13.1", "environment": {"DB_PASSWORD": "hunter2"},
        "allow_secrets": True})
    spec = resolve(job, {"allow_secrets": None}, cwd=homes[1])  # the flag not given
    assert spec.allow_secrets is True and estimator_kwargs(spec)["allow_secrets"] is True
    assert build_estimator(spec).config.allow_secrets is True
    assert resolve(job, {"allow_secrets": False}, cwd=homes[1]).allow_secrets is False


def test_a_job_file_can_send_the_job_to_slurm_with_the_clusters_settings(tmp_path, monkeypatch):
    from shoal.config import build_estimator, parse_spec

    monkeypatch.delenv("SHOAL_BACKEND", raising=False)
    (tmp_path / "train.py").write_text("print(1)\n")
    spec = parse_spec({"entry_point": str(tmp_path / "train.py"), "framework_version": "2.0.1",
                       "py_version": "py310", "instance_type": "ml.m5.xlarge",
                       "instance_count": 2, "backend": "slurm",
                       "slurm": {"shared_dir": str(tmp_path / "shared"),
                                 "default_partition": "batch"}})
    assert spec.on_slurm and not spec.is_local
    est = build_estimator(spec)
    assert est.config.backend == "slurm"
    assert est.sagemaker_session.slurm_settings().default_partition == "batch"
    request = est.build_request(None, job_name="j-2")
    assert request["OutputDataConfig"]["S3OutputPath"].startswith((tmp_path / "shared").as_uri())
    with pytest.raises(ConfigError, match="'backend' must be in"):
        parse_spec({"backend": "slrum"})
