"""TrainingConfig's validation (every rule and its message) and the pure request builder."""

import botocore.session
import botocore.validate
import pytest
from shoal.errors import InputError, SecretValueError, ValidationError
from shoal.inputs import FileSystemInput, TrainingInput
from shoal.request import InstanceGroup, Resolved, TrainingConfig, build_request

ROLE = "arn:aws:iam::123456789012:role/SageMakerRole"
BASE = {"role": ROLE, "instance_count": 1, "instance_type": "ml.c5.xlarge"}
VPC = {"subnets": ["subnet-0123abcd"], "security_group_ids": ["sg-0123abcd"]}


def config(**changes):
    return TrainingConfig(**{**BASE, **changes})


def resolved(**changes):
    values = {"job_name": "job-1", "role_arn": ROLE, "output_path": "s3://bucket/",
              "image_uri": "123456789012.dkr.ecr.us-west-2.amazonaws.com/img:1",
              "region": "us-west-2", **changes}
    return Resolved(**values)


def botocore_valid(request):
    model = botocore.session.get_session().get_service_model("sagemaker")
    botocore.validate.validate_parameters(
        request, model.operation_model("CreateTrainingJob").input_shape)


@pytest.mark.parametrize("changes, message", [
    ({"role": None}, "'role' is required"),
    ({"role": "arn:aws:iam::1234:role/x"}, "'role' must match regex"),
    ({"instance_count": 0}, "'instance_count' must be >= 1 (got 0)"),
    ({"instance_count": "2"}, "'instance_count' must be an int (got '2')"),
    ({"instance_type": "ml.p9.huge"}, "'instance_type' must be in"),
    ({"volume_size": -1}, "'volume_size' must be >= 0 (got -1)"),
    ({"volume_kms_key": "bad key!"}, "'volume_kms_key' must match regex"),
    ({"output_kms_key": "k" * 2049}, "'output_kms_key' must be at most 2048 characters"),
    ({"max_run": 0}, "'max_run' must be >= 1 (got 0)"),
    ({"input_mode": "Stream"}, "'input_mode' must be in ('Pipe', 'File', 'FastFile')"),
    ({"output_path": "/local/dir"}, "'output_path' must match regex"),
    ({"output_path": "https://bucket.s3.amazonaws.com/x"}, "'output_path' must be an S3 URI"),
    ({"tags": [{"Key": f"k{i}", "Value": "v"} for i in range(51)]},
     "'tags' must have at most 50 entries (got 51 entries)"),
    ({"tags": [{"Key": "a#b", "Value": "v"}]}, "'tags[0].Key' must match regex"),
    ({"tags": [{"Name": "x"}]}, "'tags[0]' must be a dict with \"Key\" and \"Value\""),
    ({"tags": {"k": "v" * 257}}, "'tags[0].Value' must be at most 256 characters"),
    ({"subnets": [f"subnet-{i}" for i in range(17)], "security_group_ids": ["sg-1"]},
     "'subnets' must have at most 16 entries"),
    ({"subnets": ["subnet-1"], "security_group_ids": [f"sg-{i}" for i in range(6)]},
     "'security_group_ids' must have at most 5 entries"),
    ({"subnets": ["subnet 1"], "security_group_ids": ["sg-1"]}, "'subnets[0]' must match regex"),
    ({"subnets": [], "security_group_ids": ["sg-1"]}, "'subnets' must have at least 1 entries"),
    ({"model_channel_name": "my model"}, "'model_channel_name' must match regex"),
    ({"metric_definitions": [{"Name": "loss"}]},
     "'metric_definitions[0]' must be a dict with \"Name\" and \"Regex\""),
    ({"metric_definitions": [{"Name": "m", "Regex": "x"}] * 41},
     "'metric_definitions' must have at most 40 entries"),
    ({"metric_definitions": [{"Name": "m", "Regex": "r" * 501}]},
     "'metric_definitions[0].Regex' must be at most 500 characters"),
    ({"use_spot_instances": "yes"}, "'use_spot_instances' must be a bool (got 'yes')"),
    ({"checkpoint_s3_uri": "/opt/ckpt"}, "'checkpoint_s3_uri' must match regex"),
    ({"checkpoint_s3_uri": "s3://b/c", "checkpoint_local_path": "/" * 4097},
     "'checkpoint_local_path' must be at most 4096 characters"),
    ({"environment": {f"K{i}": "v" for i in range(101)}},
     "'environment' must have at most 100 entries (got 101 entries)"),
    ({"environment": {"1BAD": "v"}}, "'environment key' must match regex"),
    ({"environment": {"GOOD": "v" * 513}}, "'environment['GOOD']' must be at most 512"),
    ({"environment": {"N": 4}}, "'environment['N']' must be a str (got 4)"),
    ({"max_retry_attempts": 99}, "'max_retry_attempts' must be <= 30 (got 99)"),
    ({"max_retry_attempts": 0}, "'max_retry_attempts' must be >= 1 (got 0)"),
    ({"keep_alive_period_in_seconds": 21601},
     "'keep_alive_period_in_seconds' must be <= 21600 (got 21601)"),
    ({"code_location": "code/"}, "'code_location' must match regex"),
    ({"debugger_hook_config": "on"}, "'debugger_hook_config' must be a bool, a DebuggerHookConfig"),
    ({"base_job_name": "b" * 64}, "'base_job_name' must be at most 63 characters"),
])
def test_argument_limits(changes, message):
    with pytest.raises(ValidationError) as caught:
        config(**changes)
    assert message in str(caught.value)


@pytest.mark.parametrize("changes, message", [
    ({"instance_groups": [InstanceGroup("a", "ml.c5.xlarge", 1)]},
     "'instance_groups' cannot be combined with instance_count/instance_type"),
    ({"instance_count": None, "instance_type": None, "instance_groups": [
        InstanceGroup("a", "ml.c5.xlarge", 1), InstanceGroup("a", "ml.c5.xlarge", 1)]},
     "'instance_groups' must have unique names"),
    ({"instance_count": None, "instance_type": None, "instance_groups": [
        InstanceGroup(f"g{i}", "ml.c5.xlarge", 1) for i in range(6)]},
     "'instance_groups' must have at most 5 entries"),
    ({"instance_type": None}, "'instance_count' and 'instance_type' are required"),
    ({"subnets": ["subnet-1"]}, "'subnets' and 'security_group_ids' must be set together"),
    ({"use_spot_instances": True}, "'max_wait' is required with use_spot_instances=True"),
    ({"use_spot_instances": True, "max_run": 7200, "max_wait": 3600},
     "'max_wait' must be >= max_run (7200) with spot instances (got 3600)"),
    ({"use_spot_instances": True, "max_wait": 86400, "keep_alive_period_in_seconds": 60},
     "'keep_alive_period_in_seconds' cannot be used with spot instances"),
    ({"max_wait": 90000}, "'max_wait' is only valid with use_spot_instances=True (got 90000)"),
    ({"checkpoint_local_path": "/opt/ml/checkpoints"},
     "'checkpoint_local_path' needs checkpoint_s3_uri"),
    ({"output_path": "file:///tmp/out"}, "'output_path' may be a file:// path only in local mode"),
    ({"instance_type": "local_gpu", "instance_count": 2}, "'instance_count' must be 1 with local_gpu"),
    ({"instance_type": "local", "use_spot_instances": True, "max_wait": 86400},
     "'use_spot_instances' is not supported in local mode"),
    ({"instance_type": "local", "checkpoint_s3_uri": "s3://b/c"},
     "'checkpoint_s3_uri' is not supported in local mode"),
])
def test_rules_across_arguments(changes, message):
    with pytest.raises(ValidationError) as caught:
        config(**changes)
    assert message in str(caught.value)


def test_instance_group_limits():
    with pytest.raises(ValidationError, match="'instance_count' must be >= 1 \\(got 0\\)"):
        InstanceGroup("g", "ml.c5.xlarge", 0)
    with pytest.raises(ValidationError, match="'instance_group_name' must be at most 64"):
        InstanceGroup("g" * 65, "ml.c5.xlarge", 1)


@pytest.mark.parametrize("changes, message", [
    ({"job_name": "bad_name"}, "'job_name' must match regex"),
    ({"job_name": "j" * 64}, "'job_name' must be at most 63 characters"),
    ({"role_arn": ""}, "'role_arn' must be at least 1 characters"),
    ({"hyperparameters": {f"h{i}": "1" for i in range(101)}},
     "'hyperparameters' must have at most 100 entries"),
    ({"hyperparameters": {"k" * 257: "1"}}, "'hyperparameter name' must be at most 256"),
    ({"hyperparameters": {"k": "v" * 2501}}, "'hyperparameters['k']' must be at most 2500"),
])
def test_resolved_limits(changes, message):
    with pytest.raises(ValidationError) as caught:
        resolved(**changes)
    assert message in str(caught.value)


def test_minimal_request_omits_unset_keys():
    request = build_request(config(), resolved(hyperparameters={"a": "1"}), "s3://data/train")
    assert request == {
        "AlgorithmSpecification": {
            "TrainingInputMode": "File",
            "TrainingImage": "123456789012.dkr.ecr.us-west-2.amazonaws.com/img:1"},
        "OutputDataConfig": {"S3OutputPath": "s3://bucket/"},
        "TrainingJobName": "job-1",
        "StoppingCondition": {"MaxRuntimeInSeconds": 86400},
        "ResourceConfig": {"VolumeSizeInGB": 30, "InstanceCount": 1,
                           "InstanceType": "ml.c5.xlarge"},
        "RoleArn": ROLE,
        "InputDataConfig": [{"DataSource": {"S3DataSource": {
            "S3DataType": "S3Prefix", "S3Uri": "s3://data/train",
            "S3DataDistributionType": "FullyReplicated"}}, "ChannelName": "training"}],
        "HyperParameters": {"a": "1"},
        "DebugHookConfig": {"S3OutputPath": "s3://bucket/", "CollectionConfigurations": []},
        "ProfilerConfig": {"S3OutputPath": "s3://bucket/", "DisableProfiler": False},
    }
    botocore_valid(request)


def test_full_request_is_valid_for_botocore():
    c = config(**VPC, volume_kms_key="alias/vol", output_kms_key="alias/out",
               use_spot_instances=True, max_run=3600, max_wait=7200,
               checkpoint_s3_uri="s3://ck/run", checkpoint_local_path="/opt/ml/checkpoints",
               enable_network_isolation=True, encrypt_inter_container_traffic=True,
               environment={"A": "1"}, max_retry_attempts=3, tags={"team": "ml"},
               metric_definitions=[{"Name": "loss", "Regex": "loss=(.*)"}],
               disable_profiler=True, debugger_hook_config=False,
               disable_output_compression=True)
    request = build_request(c, resolved(enable_sagemaker_metrics=True), {
        "train": TrainingInput("s3://d/t", distribution="ShardedByS3Key"),
        "fsx": FileSystemInput("fs-0123abcd", "FSxLustre", "/fsx/x")})
    botocore_valid(request)
    assert request["StoppingCondition"] == {"MaxRuntimeInSeconds": 3600,
                                            "MaxWaitTimeInSeconds": 7200}
    assert request["CheckpointConfig"] == {"S3Uri": "s3://ck/run",
                                           "LocalPath": "/opt/ml/checkpoints"}
    assert request["RetryStrategy"] == {"MaximumRetryAttempts": 3}
    assert request["OutputDataConfig"] == {"S3OutputPath": "s3://bucket/", "KmsKeyId": "alias/out",
                                           "CompressionType": "NONE"}
    assert request["ProfilerConfig"] == {"DisableProfiler": True}
    assert "DebugHookConfig" not in request
    assert request["Tags"] == [{"Key": "team", "Value": "ml"}]
    assert request["EnableManagedSpotTraining"] is True
    assert request["AlgorithmSpecification"]["EnableSageMakerMetricsTimeSeries"] is True


def test_instance_groups_replace_count_and_type():
    c = config(instance_count=None, instance_type=None, keep_alive_period_in_seconds=600,
               instance_groups=[InstanceGroup("a", "ml.p4d.24xlarge", 2)])
    request = build_request(c, resolved(), None)
    assert request["ResourceConfig"] == {
        "VolumeSizeInGB": 30, "KeepAlivePeriodInSeconds": 600,
        "InstanceGroups": [{"InstanceGroupName": "a", "InstanceType": "ml.p4d.24xlarge",
                            "InstanceCount": 2}]}
    assert "InputDataConfig" not in request


@pytest.mark.parametrize("inputs, changes, message", [
    (FileSystemInput("fs-0123abcd", "FSxLustre", "/fsx"), {},
     "'inputs['training']' is an FSxLustre file system, which the job reaches only inside its VPC"),
    ({"train": FileSystemInput("fs-0123abcd", "EFS", "/efs")}, {**VPC, "input_mode": "Pipe"},
     "'inputs['train']' is an EFS file system, which cannot be read in Pipe mode"),
    ("file:///data", {}, "'inputs['training']' may be a file:// URI only in local mode"),
    (TrainingInput("s3://d/t", instance_groups=["nope"]), {
        "instance_count": None, "instance_type": None,
        "instance_groups": [InstanceGroup("a", "ml.c5.xlarge", 1)]},
     "'inputs['training'].instance_groups' must name the estimator's instance groups ['a']"),
])
def test_input_rules(inputs, changes, message):
    with pytest.raises(InputError) as caught:
        build_request(config(**changes), resolved(), inputs)
    assert message in str(caught.value)


def test_code_channel_name_is_reserved_with_network_isolation():
    with pytest.raises(InputError, match="must not have a 'code' channel"):
        build_request(config(enable_network_isolation=True),
                      resolved(code_uri="s3://b/j/source/sourcedir.tar.gz"), {"code": "s3://x/y"})


def test_lone_training_input_sets_the_job_input_mode():
    request = build_request(config(), resolved(), TrainingInput("s3://d/t", input_mode="Pipe"))
    assert request["AlgorithmSpecification"]["TrainingInputMode"] == "Pipe"


def test_debugger_hook_dict_keeps_user_values_and_unsupported_region_refuses_it():
    hook = {"S3OutputPath": "s3://dbg/", "HookParameters": {"save_interval": "100"}}
    request = build_request(config(debugger_hook_config=hook), resolved(), None)
    assert request["DebugHookConfig"] == {**hook, "CollectionConfigurations": []}
    with pytest.raises(ValidationError, match="SageMaker Debugger is not offered in eu-central-2"):
        build_request(config(debugger_hook_config=hook), resolved(region="eu-central-2"), None)


def test_debugger_true_is_the_default_hook_and_fine_where_debugger_is_absent():
    assert build_request(config(debugger_hook_config=True), resolved(), None)[
        "DebugHookConfig"] == {"S3OutputPath": "s3://bucket/", "CollectionConfigurations": []}
    request = build_request(config(debugger_hook_config=True), resolved(region="eu-south-2"), None)
    assert "DebugHookConfig" not in request
    assert request["ProfilerConfig"] == {"DisableProfiler": True}


def test_trainium_disables_the_profiler():
    request = build_request(config(instance_type="ml.trn1.32xlarge"), resolved(), None)
    assert request["ProfilerConfig"] == {"DisableProfiler": True}


def test_secret_values_are_refused_without_printing_them():
    key = "AKIAIOSFODNN7EXAMPLE"
    with pytest.raises(SecretValueError) as caught:
        build_request(config(environment={"AWS_ACCESS_KEY_ID": key}), resolved(), None)
    assert "environment['AWS_ACCESS_KEY_ID'] (AWS access key id)" in str(caught.value)
    assert key not in str(caught.value)
    with pytest.raises(SecretValueError, match="hyperparameters\\['hf_token'\\]"):
        build_request(config(), resolved(hyperparameters={"hf_token": '"hf_abc123"'}), None)


def test_allow_secrets_lets_them_through():
    c = config(environment={"DB_PASSWORD": "hunter2"}, allow_secrets=True)
    assert build_request(c, resolved(), None)["Environment"] == {"DB_PASSWORD": "hunter2"}


def test_config_evolve_revalidates():
    with pytest.raises(ValidationError, match="'max_run' must be >= 1"):
        config().evolve(max_run=0)
    assert config().evolve(max_run=60).max_run == 60
