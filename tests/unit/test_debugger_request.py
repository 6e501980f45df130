"""The request's Debugger keys against SageMaker Python SDK v2: the same estimator with
rules, profiler, hook and TensorBoard settings is built with ``sagemaker`` 2.x and with Shoal
(only the import lines differ), and the requests must be equal. Collections are compared as
sets (v2 gathers them in a Python set, so its order changes from run to run) and SageMaker
Profiler's rule name without its timestamp. Also Shoal's own checks, made before any call.
"""

from __future__ import annotations

import re
import types

import botocore.session
import botocore.validate
import pytest

from tests.unit.test_parity import (
    PT_CPU,
    PT_GPU,
    ROLE,
    shoal_request,
    v2_request,
    validate_with_botocore,
    without_deliberate_differences,
)
from tests.unit.test_parity import aws as aws_fixture  # noqa: F401 - a fixture (moto, files)

sagemaker = pytest.importorskip("sagemaker")
# every test under moto, in a directory with code/train.py (the parity tests' fixture)
pytestmark = [pytest.mark.filterwarnings("ignore:Framework profiling:FutureWarning"),
              pytest.mark.usefixtures("aws_fixture")]

import shoal  # noqa: E402
import shoal.debugger  # noqa: E402
from shoal.errors import DebuggerError  # noqa: E402


def v2_names():
    import sagemaker.debugger as d
    from sagemaker.debugger import rule_configs
    from smdebug_rulesconfig.profiler_rules.rules import Dataloader

    # rulesconfig 1.0.1 leaves Dataloader out of its top level; Shoal's rule_configs has it
    rc = types.SimpleNamespace(**{k: getattr(rule_configs, k) for k in dir(rule_configs)},
                               Dataloader=Dataloader)
    return types.SimpleNamespace(d=d, rc=rc)


def shoal_names():
    return types.SimpleNamespace(d=shoal.debugger, rc=shoal.debugger.rule_configs)


def normalised(request: dict) -> dict:
    out = without_deliberate_differences(request)
    hook = out.get("DebugHookConfig")
    if hook and "CollectionConfigurations" in hook:
        hook["CollectionConfigurations"] = sorted(hook["CollectionConfigurations"],
                                                  key=lambda c: repr(sorted(c.items())))
    for rule in out.get("ProfilerRuleConfigurations", []):
        rule["RuleConfigurationName"] = re.sub(r"-\d{4}(-\d{2}){5}-\d{3}$", "-<timestamp>",
                                               rule["RuleConfigurationName"])
    return out


TRN = {"image_uri": "111122223333.dkr.ecr.us-west-2.amazonaws.com/algo:1", "role": ROLE,
       "instance_count": 1, "instance_type": "ml.trn1.32xlarge"}
OUT = {"output_path": "s3://out-bucket/runs"}


def _profile(n):
    d = n.d
    return d.FrameworkProfile(
        local_path="/opt/ml/output/prof", file_max_size=1 << 20, file_close_interval=30.5,
        file_open_fail_threshold=5,
        detailed_profiling_config=d.DetailedProfilingConfig(start_step=2, num_steps=3),
        dataloader_profiling_config=d.DataloaderProfilingConfig(
            start_unix_time=1700000000, duration=12.5, metrics_regex="Data.*"),
        python_profiling_config=d.PythonProfilingConfig(
            start_step=4, python_profiler=d.PythonProfiler.PYINSTRUMENT),
        smdataparallel_profiling_config=d.SMDataParallelProfilingConfig(num_steps=2))


# id -> (kind, kwargs(ns) -> dict, options)
CASES = {
    "defaults": ("PyTorch", lambda n: {**PT_CPU, **OUT}, {}),
    "profiler-rule": ("PyTorch", lambda n: {
        **PT_CPU, "rules": [n.d.ProfilerRule.sagemaker(n.rc.CPUBottleneck())]}, {}),
    "every-profiler-rule-custom-values": ("PyTorch", lambda n: {**PT_GPU, "rules": [
        n.d.ProfilerRule.sagemaker(n.rc.BatchSize(cpu_threshold_p95=60, window=100)),
        n.d.ProfilerRule.sagemaker(n.rc.CPUBottleneck(threshold=20.5, cpu_threshold=80)),
        n.d.ProfilerRule.sagemaker(n.rc.Dataloader(min_threshold=50)),
        n.d.ProfilerRule.sagemaker(n.rc.GPUMemoryIncrease(increase=10, window=20)),
        n.d.ProfilerRule.sagemaker(n.rc.IOBottleneck(io_threshold=40)),
        n.d.ProfilerRule.sagemaker(n.rc.LoadBalancing(threshold=0.3)),
        n.d.ProfilerRule.sagemaker(n.rc.LowGPUUtilization(threshold_p5=5, patience=50)),
        n.d.ProfilerRule.sagemaker(n.rc.MaxInitializationTime(threshold=5)),
        n.d.ProfilerRule.sagemaker(n.rc.OverallSystemUsage(scan_interval_us=1000000)),
        n.d.ProfilerRule.sagemaker(n.rc.StepOutlier(stddev=2, mode="TRAIN"),
                                   name="Outliers", s3_output_path="s3://out-bucket/rules",
                                   container_local_output_path="/opt/ml/rules")]}, {}),
    "report-outliers-and-a-debug-rule": ("PyTorch", lambda n: {**PT_GPU, **OUT, "rules": [
        n.d.ProfilerRule.sagemaker(n.rc.ProfilerReport(CPUBottleneck_threshold=30,
                                                       lowgpuutilization_window=100)),
        n.d.ProfilerRule.sagemaker(n.rc.StepOutlier()),
        n.d.Rule.sagemaker(n.rc.loss_not_decreasing(),
                           rule_parameters={"tensor_regex": ".*loss.*", "num_steps": "10"})]},
        {}),
    "debug-rules-collections-and-hook": ("PyTorch", lambda n: {**PT_CPU, "rules": [
        n.d.Rule.sagemaker(n.rc.vanishing_gradient()),
        n.d.Rule.sagemaker(n.rc.weight_update_ratio(), name="Weights",
                           other_trials_s3_input_paths=["s3://a/b", "s3://c/d"]),
        n.d.Rule.sagemaker(n.rc.dead_relu(), collections_to_save=[
            n.d.CollectionConfig("relu_activations", {"include_regex": "relu", "save_steps": "1,2"})]),
        n.d.Rule.sagemaker(n.rc.exploding_tensor())],
        "debugger_hook_config": n.d.DebuggerHookConfig(
            container_local_output_path="/opt/ml/tensors", hook_parameters={"save_all": "true"},
            collection_configs=[n.d.CollectionConfig("gradients", {"save_interval": "500"}),
                                n.d.CollectionConfig("biases")])}, {}),
    "debug-rule-actions": ("PyTorch", lambda n: {**PT_CPU, "rules": [
        n.d.Rule.sagemaker(n.rc.loss_not_decreasing(), actions=n.rc.ActionList(
            n.rc.StopTraining(), n.rc.Email("alerts@example.com"), n.rc.SMS("+15555550100"))),
        n.d.Rule.sagemaker(n.rc.overfit(), actions=n.rc.StopTraining("other-job"))]}, {}),
    "custom-rules": ("PyTorch", lambda n: {**PT_CPU, "rules": [
        n.d.ProfilerRule.custom("MyProfilerRule", "111122223333.dkr.ecr.us-west-2.amazonaws.com/r:1",
                                "ml.m5.xlarge", 30, source="s3://rules/mine.py",
                                rule_to_invoke="Mine", rule_parameters={"threshold": 3}),
        n.d.Rule.custom("MyRule", "111122223333.dkr.ecr.us-west-2.amazonaws.com/r:1", "ml.m5.xlarge",
                        30, rule_parameters={"a": "b"},
                        collections_to_save=[n.d.CollectionConfig("custom", {"save_interval": "7"})])]},
        {}),
    "system-monitor-interval": ("PyTorch", lambda n: {
        **PT_CPU, "profiler_config": n.d.ProfilerConfig(system_monitor_interval_millis=100)}, {}),
    "framework-profile-defaults": ("PyTorch", lambda n: {**PT_CPU, **OUT, "profiler_config":
        n.d.ProfilerConfig(system_monitor_interval_millis=100,
                           framework_profile_params=n.d.FrameworkProfile())}, {}),
    "framework-profile-one-range": ("PyTorch", lambda n: {**PT_CPU, "profiler_config":
        n.d.ProfilerConfig(s3_output_path="s3://out-bucket/prof",
                           framework_profile_params=n.d.FrameworkProfile(start_step=3, num_steps=2))},
        {}),
    "framework-profile-time-range": ("PyTorch", lambda n: {**PT_CPU, "profiler_config":
        n.d.ProfilerConfig(framework_profile_params=n.d.FrameworkProfile(
            start_unix_time=1700000000, duration=60))}, {}),
    "framework-profile-per-metric": ("PyTorch", lambda n: {
        **PT_CPU, "profiler_config": n.d.ProfilerConfig(framework_profile_params=_profile(n))}, {}),
    "sagemaker-profiler": ("PyTorch", lambda n: {**PT_GPU, "profiler_config": n.d.ProfilerConfig(
        profile_params=n.d.Profiler(cpu_profiling_duration=600))}, {}),
    "sagemaker-profiler-with-a-profiler-rule": ("PyTorch", lambda n: {
        **PT_GPU, "profiler_config": n.d.ProfilerConfig(profile_params=n.d.Profiler()),
        "rules": [n.d.ProfilerRule.sagemaker(n.rc.LowGPUUtilization())]}, {}),
    "profiler-off-hook-off": ("PyTorch", lambda n: {
        **PT_CPU, "disable_profiler": True, "debugger_hook_config": False}, {}),
    "profiler-off-by-its-config": ("PyTorch", lambda n: {
        **PT_CPU, "profiler_config": n.d.ProfilerConfig(disable_profiler=True)}, {}),
    "trainium-turns-the-profiler-off": ("Estimator", lambda n: TRN, {}),
    "tensorboard": ("PyTorch", lambda n: {**PT_CPU, "tensorboard_output_config":
        n.d.TensorBoardOutputConfig("s3://out-bucket/tb", "/opt/ml/output/tensorboard")}, {}),
    "checkpoints-on-two-hosts-leave-the-hook-off": ("PyTorch", lambda n: {
        **PT_GPU, "checkpoint_s3_uri": "s3://ckpt/run", "checkpoint_local_path": "/opt/ml/checkpoints",
        "rules": [n.d.Rule.sagemaker(n.rc.loss_not_decreasing())]}, {}),
    "region-without-debugger": ("PyTorch", lambda n: {
        **PT_CPU, "debugger_hook_config": False}, {"region": "eu-central-2"}),
    "other-region-and-china": ("PyTorch", lambda n: {
        **PT_CPU, "rules": [n.d.ProfilerRule.sagemaker(n.rc.CPUBottleneck())]},
        {"region": "eu-west-3"}),
    "tensorflow-report": ("TensorFlow", lambda n: {
        "entry_point": "train.py", "source_dir": "code", "role": ROLE, "framework_version": "2.11.0",
        "py_version": "py39", "instance_count": 1, "instance_type": "ml.g5.xlarge",
        "rules": [n.d.ProfilerRule.sagemaker(n.rc.ProfilerReport())]}, {}),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_debugger_request_matches_sagemaker_v2(case):
    kind, kwargs_of, options = CASES[case]
    region = options.get("region", "us-west-2")
    ours = shoal_request(kind, kwargs_of(shoal_names()), "s3://data/train", region)
    theirs = v2_request(kind, kwargs_of(v2_names()), "s3://data/train", region)
    validate_with_botocore(ours)
    validate_with_botocore(theirs)
    assert normalised(ours) == normalised(theirs)


def test_the_cases_cover_every_key_and_rule():
    keys, rules = set(), set()
    for _kind, kwargs_of, _ in CASES.values():
        kwargs = kwargs_of(shoal_names())
        keys |= set(kwargs) & {"rules", "profiler_config", "debugger_hook_config",
                               "disable_profiler", "tensorboard_output_config"}
        rules |= {r.rule_parameters.get("rule_to_invoke") for r in kwargs.get("rules", ())}
    assert keys == {"rules", "profiler_config", "debugger_hook_config", "disable_profiler",
                    "tensorboard_output_config"}
    assert set(shoal.debugger.rule_configs.PROFILER_RULE_CLASSES) <= rules


def test_profiler_report_keys_are_sent_as_written():
    rc, d = shoal.debugger.rule_configs, shoal.debugger
    request = shoal_request("PyTorch", {**PT_CPU, "rules": [d.ProfilerRule.sagemaker(
        rc.ProfilerReport(cpubottleneck_threshold=30, StepOutlier_mode=None))]},
        "s3://data/train")
    params = request["ProfilerRuleConfigurations"][0]["RuleParameters"]
    assert params == {"cpubottleneck_threshold": "30", "StepOutlier_mode": "None",
                      "rule_to_invoke": "ProfilerReport"}
    image = request["ProfilerRuleConfigurations"][0]["RuleEvaluatorImage"]
    assert image == "895741380848.dkr.ecr.us-west-2.amazonaws.com/sagemaker-debugger-rules:latest"


def test_debug_rule_values_are_sent_as_strings_where_v2_sends_a_request_botocore_refuses():
    def kwargs(n):
        return {**PT_CPU, "rules": [n.d.Rule.sagemaker(
            n.rc.loss_not_decreasing(), rule_parameters={"num_steps": 10, "use_losses": True})]}

    ours = shoal_request("PyTorch", kwargs(shoal_names()), "s3://data/train")
    assert ours["DebugRuleConfigurations"][0]["RuleParameters"] == {
        "rule_to_invoke": "LossNotDecreasing", "num_steps": "10", "use_losses": "True"}
    validate_with_botocore(ours)
    model = botocore.session.get_session().get_service_model("sagemaker")
    with pytest.raises(botocore.exceptions.ParamValidationError, match="num_steps"):
        botocore.validate.validate_parameters(
            v2_request("PyTorch", kwargs(v2_names()), "s3://data/train"),
            model.operation_model("CreateTrainingJob").input_shape)


def test_the_users_rule_objects_are_left_as_they_were():
    rc, d = shoal.debugger.rule_configs, shoal.debugger
    rule = d.Rule.sagemaker(rc.loss_not_decreasing(), actions=rc.StopTraining())
    profiler_rule = d.ProfilerRule.sagemaker(rc.CPUBottleneck())
    before = (dict(rule.rule_parameters), rule.image_uri, dict(profiler_rule.rule_parameters))
    first = shoal_request("PyTorch", {**PT_CPU, "rules": [rule, profiler_rule]}, None)
    assert (dict(rule.rule_parameters), rule.image_uri, dict(profiler_rule.rule_parameters)) == before
    action = first["DebugRuleConfigurations"][0]["RuleParameters"]["action_json"]
    # one action is one object, its job prefix this job's name
    assert action == ('{\\"name\\": \\"stoptraining\\", '
                      '\\"training_job_prefix\\": \\"parity-job-2026-01-01-00-00-00-000\\"}')


REFUSALS = [
    ({"rules": "CPUBottleneck"}, r"'rules' must be a list of Rule and ProfilerRule objects"),
    ({"rules": [object()]}, r"'rules' must hold only sagemaker.debugger Rule and ProfilerRule"),
    ({"rules": [{"DebugRuleConfiguration": {}}]}, r"'rules' must hold only"),
    ({"rules": lambda d, rc: [d.ProfilerRule.sagemaker(rc.CPUBottleneck())] * 2},
     r"'rules' must have unique names .*\['CPUBottleneck'\]"),
    ({"rules": lambda d, rc: [d.ProfilerRule.sagemaker(rc.CPUBottleneck(), name=f"r{i}")
                              for i in range(21)]},
     r"'rules' must hold at most 20 ProfilerRule objects \(got 21\)"),
    ({"rules": lambda d, rc: [d.Rule.sagemaker(rc.all_zero(), rule_parameters={"x": "y" * 257})]},
     r"rules\['AllZero'\].rule_parameters\['x'\]' must be at most 256 characters"),
    ({"profiler_config": {"DisableProfiler": False}}, r"'profiler_config' must be a ProfilerConfig"),
    ({"tensorboard_output_config": {"S3OutputPath": "s3://x"}},
     r"'tensorboard_output_config' must be a TensorBoardOutputConfig"),
    ({"debugger_hook_config": "yes"}, r"'debugger_hook_config' must be a bool, a DebuggerHookConfig"),
]


@pytest.mark.parametrize("changes, message", REFUSALS)
def test_bad_arguments_are_refused_when_the_estimator_is_built(changes, message):
    d, rc = shoal.debugger, shoal.debugger.rule_configs
    kwargs = {k: v(d, rc) if callable(v) else v for k, v in changes.items()}
    with pytest.raises(DebuggerError if "rules" in changes or "profiler" in message else
                       shoal.errors.ValidationError, match=message):
        shoal.PyTorch(**PT_CPU, **kwargs)


CONFLICTS = [
    ({"disable_profiler": True, "profiler_config": lambda d, rc: d.ProfilerConfig()},
     r"'profiler_config' cannot enable the profiler: disable_profiler is True"),
    ({"disable_profiler": True, "rules": lambda d, rc: [d.ProfilerRule.sagemaker(rc.StepOutlier())]},
     r"'rules' cannot hold a ProfilerRule when the profiler is disabled \(got \['StepOutlier'\]\)"),
    ({"debugger_hook_config": lambda d, rc: d.DebuggerHookConfig("s3://x/y")},
     r"'debugger_hook_config' cannot be set: SageMaker Debugger is not offered in eu-central-2"),
    ({"rules": lambda d, rc: [d.ProfilerRule.sagemaker(rc.CPUBottleneck())]},
     r"'rules' cannot hold a ProfilerRule when the profiler is disabled"),
]


@pytest.mark.parametrize("changes, message", CONFLICTS)
def test_conflicts_are_refused_before_any_call(changes, message):
    d, rc = shoal.debugger, shoal.debugger.rule_configs
    kwargs = {k: v(d, rc) if callable(v) else v for k, v in changes.items()}
    region = "eu-central-2" if "eu-central-2" in message or "disable_profiler" not in kwargs else "us-west-2"
    with pytest.raises(DebuggerError, match=message):
        shoal_request("PyTorch", {**PT_CPU, **kwargs}, "s3://data/train", region)


def test_china_regions_use_their_own_domain():
    uri = shoal.debugger.get_rule_container_image_uri("CPUBottleneck", "cn-north-1")
    assert uri == "618459771430.dkr.ecr.cn-north-1.amazonaws.com.cn/sagemaker-debugger-rules:latest"
    with pytest.raises(DebuggerError, match="'region' must be one where"):
        shoal.debugger.get_rule_container_image_uri("CPUBottleneck", "xx-nowhere-1")


def test_a_custom_rules_local_source_is_uploaded_where_the_request_says(tmp_path):
    import boto3

    d = shoal.debugger
    (tmp_path / "my_rule.py").write_text("class MyRule: pass\n")
    rule = d.ProfilerRule.custom("MyRule", "111122223333.dkr.ecr.us-west-2.amazonaws.com/r:1",
                                 "ml.m5.xlarge", 30, source=str(tmp_path / "my_rule.py"),
                                 rule_to_invoke="MyRule")
    session = shoal.Session(boto_session=boto3.Session(region_name="us-west-2"))
    est = shoal.PyTorch(sagemaker_session=session, rules=[rule], **PT_CPU)
    est.fit("s3://data/train", wait=False, job_name="custom-rule-job")
    request = est.build_request("s3://data/train", job_name="custom-rule-job")
    uri = request["ProfilerRuleConfigurations"][0]["RuleParameters"]["source_s3_uri"]
    match = re.fullmatch(r"s3://sagemaker-us-west-2-123456789012/MyRule/[0-9a-f-]{36}/my_rule.py", uri)
    assert match, uri
    bucket, key = uri[len("s3://"):].split("/", 1)
    body = session.s3_client.get_object(Bucket=bucket, Key=key)["Body"].read()
    assert body == b"class MyRule: pass\n"
    assert rule.rule_parameters["source_s3_uri"] == str(tmp_path / "my_rule.py")  # untouched


def test_a_custom_rule_needs_source_and_rule_to_invoke_together():
    with pytest.raises(DebuggerError, match="takes 'source' and 'rule_to_invoke' together"):
        shoal.debugger.Rule.custom("R", "img", "ml.m5.xlarge", 30, source="s3://x/y.py")
