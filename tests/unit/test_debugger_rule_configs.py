"""Shoal's rule configurations against the ones SageMaker Python SDK v2 uses
(``smdebug_rulesconfig`` 1.0.1): same rules, parameters, defaults, accepted and refused values,
and the same configuration dicts for the built-in debug rules."""

from __future__ import annotations

import inspect

import pytest
from shoal.debugger import rule_configs as ours
from shoal.errors import DebuggerError

theirs = pytest.importorskip("smdebug_rulesconfig")
from smdebug_rulesconfig.profiler_rules import rules as their_rules  # noqa: E402

PROFILER_RULES = ["BatchSize", "CPUBottleneck", "Dataloader", "GPUMemoryIncrease", "IOBottleneck",
                  "LoadBalancing", "LowGPUUtilization", "MaxInitializationTime",
                  "OverallSystemUsage", "StepOutlier"]


@pytest.mark.parametrize("name", PROFILER_RULES)
def test_profiler_rule_has_the_same_parameters_and_defaults(name):
    mine, reference = getattr(ours, name), getattr(their_rules, name)
    assert list(inspect.signature(mine).parameters) == list(inspect.signature(reference).parameters)
    assert mine().rule_parameters == reference().rule_parameters
    assert mine().rule_name == reference().rule_name == name


def _values_to_try(default):
    if default is None:
        return [None, "TRAIN", 3]
    return [-1, 0, 0.5, 1, 50, 100, 100.5, 1e9, "50", True]


@pytest.mark.parametrize("name", PROFILER_RULES)
def test_profiler_rule_accepts_and_refuses_what_rulesconfig_does(name):
    mine, reference = getattr(ours, name), getattr(their_rules, name)
    for param, spec in inspect.signature(reference).parameters.items():
        for value in _values_to_try(spec.default):
            try:
                expected = reference(**{param: value}).rule_parameters
            except (AssertionError, TypeError):
                expected = None
            if expected is None:
                with pytest.raises(DebuggerError, match=f"{name}: '{param}' must"):
                    mine(**{param: value})
            elif isinstance(value, (str, bool)) and spec.default is not None:
                # rulesconfig compares "50" > 0 with a TypeError and True as 1; Shoal wants a number
                with pytest.raises(DebuggerError, match="must be a number"):
                    mine(**{param: value})
            else:
                assert mine(**{param: value}).rule_parameters == expected, (param, value)


def test_positional_arguments_and_unknown_names():
    assert ours.CPUBottleneck(30, 5).rule_parameters["gpu_threshold"] == 5
    with pytest.raises(TypeError, match="CPUBottleneck: .*unexpected keyword argument 'treshold'"):
        ours.CPUBottleneck(treshold=3)


REPORT_KEYS = [
    {"CPUBottleneck_threshold": 30, "lowgpuutilization_window": 100},
    {"stepoutlier_mode": "TRAIN", "LoadBalancing_threshold": 0.1},
    {"BatchSize_cpu_threshold_p95": 10, "dataloader_min_threshold": 1},
]
BAD_REPORT_KEYS = [
    ({"threshold": 3}, "does not follow the naming scheme <rule_name>_<parameter_name>"),
    ({"CPU_threshold": 3}, "'CPU' is not a rule ProfilerReport runs"),
    ({"CPUBottleneck_treshold": 3}, "'treshold' is not a parameter of CPUBottleneck"),
    ({"CPUBottleneck_threshold": 300}, "CPUBottleneck: 'threshold' must be a percentile"),
    ({"StepOutlier_n_outliers": 0}, "StepOutlier: 'n_outliers' must be > 0"),
]


@pytest.mark.parametrize("keys", REPORT_KEYS)
def test_profiler_report_keeps_the_keys_as_written(keys):
    assert ours.ProfilerReport(**keys).rule_parameters == theirs.ProfilerReport(**keys).rule_parameters


@pytest.mark.parametrize("keys, message", BAD_REPORT_KEYS)
def test_profiler_report_refuses_what_rulesconfig_refuses(keys, message):
    with pytest.raises((AssertionError, TypeError)):
        theirs.ProfilerReport(**keys)
    with pytest.raises(DebuggerError, match=message):
        ours.ProfilerReport(**keys)


def test_every_debug_rule_gives_rulesconfigs_configuration():
    names = [n for n in dir(theirs) if callable(getattr(theirs, n)) and n.islower()
             and n not in ("get_collection", "is_valid_action_object")]
    assert sorted(names) == sorted(ours.DEBUG_RULE_FUNCTIONS)
    for name in names:
        assert getattr(ours, name)() == getattr(theirs, name)(), name


@pytest.mark.parametrize("collection", ["weights", "gradients", "losses", "input_image",
                                        "relu_output", "relu_input", "input_sequence", "nothing"])
def test_collections(collection):
    expected = theirs.get_collection(collection)
    if expected is not None and "CollectionName" not in expected:  # rulesconfig's bare entries
        expected = {"CollectionName": collection, "CollectionParameters": expected}
    assert ours.get_collection(collection) == expected


ACTIONS = [
    lambda m: m.StopTraining(),
    lambda m: m.StopTraining("my-job-1"),
    lambda m: m.Email("alerts@example.com"),
    lambda m: m.SMS("+15555550100"),
    lambda m: m.ActionList(m.StopTraining(), m.Email("abc@def.org"), m.SMS("+1234")),
]


@pytest.mark.parametrize("make", ACTIONS)
def test_actions_serialize_as_rulesconfig_does(make):
    mine, reference = make(ours), make(theirs)
    if hasattr(reference, "update_training_job_prefix_if_not_specified"):
        reference.update_training_job_prefix_if_not_specified("job-1")
    assert mine.with_job_prefix("job-1").serialize() == reference.serialize()


@pytest.mark.parametrize("make, message", [
    (lambda m: m.StopTraining("bad_prefix!"), "'training_job_prefix' must be letters"),
    (lambda m: m.Email("not an address"), "'email_address' must be an address"),
    (lambda m: m.SMS("5555"), "'phone_number' must be"),
    (lambda m: m.ActionList("stop"), "'actions' must be Action objects"),
])
def test_bad_actions_are_refused(make, message):
    with pytest.raises(DebuggerError, match=message):
        make(ours)
