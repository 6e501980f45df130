"""SM_* names and encodings match the training toolkit's documented examples."""

import json

import pytest
from shoal.errors import LaunchError
from shoal.launcher.environment import (
    TrainingEnvironment,
    encode_value,
    load_environment,
    process_env_vars,
    sm_env_vars,
)
from shoal.launcher.paths import JobPaths

DATA_CONFIG = {
    "testing": {"RecordWrapperType": "None", "S3DistributionType": "FullyReplicated",
                "TrainingInputMode": "File"},
    "training": {"RecordWrapperType": "None", "S3DistributionType": "FullyReplicated",
                 "TrainingInputMode": "File"},
}  # fmt: skip


def documented_env(**overrides):
    fields = dict(
        paths=JobPaths("/opt/ml"),
        hosts=["algo-1", "algo-2"],
        current_host="algo-1",
        resource_config={"current_host": "algo-1", "hosts": ["algo-1", "algo-2"],
                         "network_interface_name": "ethwe"},
        input_data_config=DATA_CONFIG,
        framework={"sagemaker_program": "user_script.py",
                   "sagemaker_submit_directory": "s3://bucket/job/source/sourcedir.tar.gz",
                   "sagemaker_container_log_level": 20,
                   "sagemaker_mpi_enabled": True},
        hyperparameters={"batch-size": "256", "learning-rate": "0.0001",
                         "communicator": "pure_nccl"},
        num_gpus=1,
        num_cpus=32,
        job_name="preprod-chainer-2018-05-31-06-27-15-511",
    )  # fmt: skip
    fields.update(overrides)
    return TrainingEnvironment(**fields)


def test_documented_examples():
    env = sm_env_vars(documented_env())
    assert env["SM_MODEL_DIR"] == "/opt/ml/model"
    assert env["SM_CHANNELS"] == '["testing","training"]'
    assert env["SM_CHANNEL_TRAINING"] == "/opt/ml/input/data/training"
    assert env["SM_CHANNEL_TESTING"] == "/opt/ml/input/data/testing"
    assert env["SM_HPS"] == (
        '{"batch-size":"256","communicator":"pure_nccl","learning-rate":"0.0001"}'
    )
    assert env["SM_HP_LEARNING-RATE"] == "0.0001"
    assert env["SM_HP_BATCH-SIZE"] == "256"
    assert env["SM_HP_COMMUNICATOR"] == "pure_nccl"
    assert env["SM_CURRENT_HOST"] == "algo-1"
    assert env["SM_HOSTS"] == '["algo-1","algo-2"]'
    assert env["SM_NUM_GPUS"] == "1"
    assert env["SM_NUM_CPUS"] == "32"
    assert env["SM_LOG_LEVEL"] == "20"
    assert env["SM_NETWORK_INTERFACE_NAME"] == "ethwe"
    assert env["SM_USER_ARGS"] == (
        '["--batch-size","256","--communicator","pure_nccl","--learning-rate","0.0001"]'
    )
    assert env["SM_INPUT_DIR"] == "/opt/ml/input"
    assert env["SM_INPUT_CONFIG_DIR"] == "/opt/ml/input/config"
    assert env["SM_OUTPUT_DIR"] == "/opt/ml/output"
    assert env["SM_OUTPUT_DATA_DIR"] == "/opt/ml/output/data"
    assert env["SM_OUTPUT_INTERMEDIATE_DIR"] == "/opt/ml/output/intermediate"
    assert env["SM_RESOURCE_CONFIG"] == (
        '{"current_host":"algo-1","hosts":["algo-1","algo-2"],"network_interface_name":"ethwe"}'
    )
    assert json.loads(env["SM_INPUT_DATA_CONFIG"]) == DATA_CONFIG
    assert env["SM_MODULE_NAME"] == "user_script"
    assert env["SM_USER_ENTRY_POINT"] == "user_script.py"
    assert env["SM_MODULE_DIR"] == "s3://bucket/job/source/sourcedir.tar.gz"
    assert env["SM_FRAMEWORK_PARAMS"] == '{"sagemaker_mpi_enabled":true}'
    assert env["SM_FRAMEWORK_MODULE"] == ""
    assert env["SM_IS_MASTER"] == "true"
    assert env["SM_MASTER_ADDR"] == "algo-1"


def test_training_env_holds_every_property():
    training = json.loads(sm_env_vars(documented_env(current_host="algo-2"))["SM_TRAINING_ENV"])
    assert training["channel_input_dirs"] == {"testing": "/opt/ml/input/data/testing",
                                              "training": "/opt/ml/input/data/training"}
    assert training["current_host"] == "algo-2"
    assert training["hosts"] == ["algo-1", "algo-2"]
    assert training["hyperparameters"]["batch-size"] == "256"
    assert training["job_name"] == "preprod-chainer-2018-05-31-06-27-15-511"
    assert training["log_level"] == 20
    assert training["module_name"] == "user_script"
    assert training["is_master"] is False
    assert training["master_hostname"] == "algo-1"
    assert training["additional_framework_parameters"] == {"sagemaker_mpi_enabled": True}
    assert training["distribution_hosts"] == ["algo-1", "algo-2"]
    assert training["num_cpus"] == 32 and training["num_gpus"] == 1


@pytest.mark.parametrize("value, encoded", [
    ("text", "text"), (None, ""), (3, "3"), (0.5, "0.5"), (True, "true"),
    ({"b": 1, "a": [1, 2]}, '{"a":[1,2],"b":1}'), (b"raw", "raw"), ("é", "é"), (["é"], '["\\u00e9"]'),
])  # fmt: skip
def test_encoding(value, encoded):
    assert encode_value(value) == encoded


def write_job(root, host="algo-1", hosts=("algo-1", "algo-2"), hps=None, data=None):
    config = root / "input" / "config"
    config.mkdir(parents=True)
    (config / "resourceconfig.json").write_text(json.dumps(
        {"current_host": host, "hosts": list(hosts), "network_interface_name": "eth0"}))
    (config / "hyperparameters.json").write_text(json.dumps(hps or {}))
    (config / "inputdataconfig.json").write_text(json.dumps(data or {}))
    return JobPaths(str(root))


def test_load_decodes_hyperparameters_with_raw_fallback(tmp_path):
    paths = write_job(tmp_path, hps={
        "sagemaker_program": '"train.py"', "sagemaker_mpi_enabled": "true",
        "epochs": "3", "lr": "0.1", "name": '"resnet"', "raw": "not json {",
        "nested": '{"a": 1}', "_tuning_objective_metric": '"loss"',
    })  # fmt: skip
    env = load_environment(paths, {}, num_gpus=0, num_cpus=2)
    assert env.hyperparameters == {"epochs": 3, "lr": 0.1, "name": "resnet",
                                   "raw": "not json {", "nested": {"a": 1}}  # fmt: skip
    assert env.additional_framework_parameters == {"sagemaker_mpi_enabled": True}
    assert env.user_entry_point == "train.py"
    assert env.to_cmd_args() == ["--epochs", "3", "--lr", "0.1", "--name", "resnet",
                                 "--nested", "a=1", "--raw", "not json {"]  # fmt: skip
    assert env.module_dir == paths.code_dir


def test_environment_program_overrides_hyperparameter(tmp_path):
    paths = write_job(tmp_path, hps={"sagemaker_program": '"train.py"'})
    env = load_environment(paths, {"SAGEMAKER_PROGRAM": "other.py"}, num_gpus=0, num_cpus=1)
    assert env.user_entry_point == "other.py" and env.module_name == "other"


def test_base_dir_comes_from_sagemaker_base_dir():
    assert JobPaths.from_environ({"SAGEMAKER_BASE_DIR": "/tmp/x/opt/ml"}).model_dir == (
        "/tmp/x/opt/ml/model"
    )
    assert JobPaths.from_environ({}).code_dir == "/opt/ml/code"


def test_current_host_must_be_in_hosts(tmp_path):
    paths = write_job(tmp_path, host="algo-9")
    with pytest.raises(LaunchError, match=r"'current_host' must be one of \['algo-1', 'algo-2'\]"):
        load_environment(paths, {}, num_gpus=0, num_cpus=1)


def test_missing_config_is_a_launch_error(tmp_path):
    with pytest.raises(LaunchError, match="resourceconfig.json"):
        load_environment(JobPaths(str(tmp_path)), {}, num_gpus=0, num_cpus=1)


def test_heterogeneous_cluster_master_is_first_distribution_host():
    resource = {
        "current_host": "algo-1", "hosts": ["algo-1", "algo-2", "algo-3"],
        "current_group_name": "data", "instance_groups": [
            {"instance_group_name": "data", "instance_type": "ml.c5.xlarge", "hosts": ["algo-1"]},
            {"instance_group_name": "train", "instance_type": "ml.p4d.24xlarge",
             "hosts": ["algo-2", "algo-3"]}],
    }  # fmt: skip
    env = documented_env(hosts=resource["hosts"], resource_config=resource, framework={
        "sagemaker_distribution_instance_groups": ["train"], "sagemaker_mpi_enabled": True})
    assert env.distribution_hosts == ["algo-2", "algo-3"]
    assert env.master_hostname == "algo-2"
    assert env.is_hetero and not env.is_master
    assert env.current_instance_group_hosts == ["algo-1"]


def test_process_env_vars_put_code_first_on_pythonpath():
    env = process_env_vars(documented_env(), {"PYTHONPATH": "/lib"})
    assert env["PYTHONPATH"] == "/opt/ml/code:/lib"
    assert env["CURRENT_HOST"] == "algo-1"


def test_master_is_the_first_sorted_host():
    env = documented_env(hosts=["algo-2", "algo-1"], current_host="algo-1")
    assert env.master_hostname == "algo-1" and env.is_master
    assert sm_env_vars(env)["SM_HOSTS"] == '["algo-2","algo-1"]'  # as configured


def test_opt_ml_hyperparameters_follow_the_base_dir_into_args_and_sm_hp(tmp_path):
    paths = write_job(tmp_path, hps={"sagemaker_program": '"train.py"',
                                     "model_dir": '"/opt/ml/shared/model"', "epochs": "3"})
    env = load_environment(paths, {}, num_gpus=0, num_cpus=2)
    moved = str(tmp_path / "shared" / "model")
    assert env.rebased_keys == ("model_dir",)
    assert env.to_cmd_args() == ["--epochs", "3", "--model_dir", moved]
    sm = sm_env_vars(env)
    assert sm["SM_HP_MODEL_DIR"] == moved
    assert json.loads(sm["SM_HPS"])["model_dir"] == moved
    assert "/opt/ml" not in sm["SM_USER_ARGS"]
