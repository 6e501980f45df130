"""Debugger's built-in rule configurations, as ``smdebug_rulesconfig`` offers them to
SageMaker Python SDK v2 users (``from sagemaker.debugger import rule_configs``):

- profiler rules, one class each (``rule_configs.CPUBottleneck(threshold=30)``), with the
  parameters, defaults and limits of :mod:`shoal.profiler.rule_table`, and
  ``ProfilerReport(**{"<Rule>_<parameter>": value})`` for the report of them all;
- debug rules, one function each (``rule_configs.loss_not_decreasing()``), returning the
  configuration dict ``Rule.sagemaker`` takes: the rule's name and the tensor collections its
  hook must save.

Values are kept as given; the request turns profiler-rule values into strings, as v2 does.
"""

from __future__ import annotations

import copy
import inspect
import re
from typing import Any

from shoal.errors import DebuggerError
from shoal.profiler import rule_table


class ProfilerRuleConfig:
    """A built-in profiler rule and its parameters (``rule_name``, ``rule_parameters``)."""

    rule_name: str = ""

    def __init__(self, **rule_parameters):
        self.rule_parameters = {**rule_parameters, "rule_to_invoke": self.rule_name}

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.rule_parameters.items()
                         if k != "rule_to_invoke")
        return f"{self.rule_name}({args})"

    def __eq__(self, other) -> bool:
        return type(other) is type(self) and other.rule_parameters == self.rule_parameters

    __hash__ = None


def _checked(rule: str, name: str, value):
    param = {p.name: p for p in rule_table.params_of(rule)}[name]
    why = param.problem(value)
    if why:
        raise DebuggerError(f"{rule}: '{name}' {why} (got {value!r})")
    return value


def _profiler_rule_class(rule: str) -> type:
    params = rule_table.PROFILER_RULES[rule]
    signature = inspect.Signature([
        inspect.Parameter(p.name, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=p.default)
        for p in params
    ])

    def __init__(self, *args, **kwargs):
        try:
            bound = signature.bind(*args, **kwargs)
        except TypeError as error:
            raise TypeError(f"{rule}: {error}; its parameters are {signature}") from None
        bound.apply_defaults()
        ProfilerRuleConfig.__init__(
            self, **{k: _checked(rule, k, v) for k, v in bound.arguments.items()})

    __init__.__signature__ = inspect.Signature(
        [inspect.Parameter("self", inspect.Parameter.POSITIONAL_ONLY), *signature.parameters.values()])
    doc = f"Debugger's {rule} profiler rule. Parameters (defaults): {signature}."
    return type(rule, (ProfilerRuleConfig,), {"__init__": __init__, "__doc__": doc,
                                               "rule_name": rule, "__module__": __name__})


BatchSize = _profiler_rule_class("BatchSize")
CPUBottleneck = _profiler_rule_class("CPUBottleneck")
Dataloader = _profiler_rule_class("Dataloader")
GPUMemoryIncrease = _profiler_rule_class("GPUMemoryIncrease")
IOBottleneck = _profiler_rule_class("IOBottleneck")
LoadBalancing = _profiler_rule_class("LoadBalancing")
LowGPUUtilization = _profiler_rule_class("LowGPUUtilization")
MaxInitializationTime = _profiler_rule_class("MaxInitializationTime")
OverallSystemUsage = _profiler_rule_class("OverallSystemUsage")
StepOutlier = _profiler_rule_class("StepOutlier")


class ProfilerReport(ProfilerRuleConfig):
    """Every profiler rule, and a report of their findings. Parameters are
    ``<Rule>_<parameter>`` (the rule name in any case): ``ProfilerReport(
    CPUBottleneck_threshold=30)``; they are sent as written."""

    rule_name = rule_table.REPORT

    def __init__(self, **rule_parameters):
        for key, value in rule_parameters.items():
            try:
                rule, param = rule_table.report_key(key)
            except ValueError as error:
                raise DebuggerError(f"ProfilerReport: {error}") from None
            _checked(rule, param, value)
        super().__init__(**rule_parameters)


# ---- debug rules: each built-in rule's name and the collections its hook saves ----

def _every(interval: str) -> dict[str, str]:
    return {"save_interval": interval}


_COLLECTIONS: dict[str, dict[str, str]] = {
    "weights": _every("500"),
    "gradients": _every("500"),
    "losses": _every("500"),
    "input_image": {"include_regex": ".*hybridsequential0_input_0", "save_interval": "500"},
    "relu_output": {"include_regex": ".*relu_output", "save_interval": "500"},
    "relu_input": {"include_regex": ".*relu_input", "save_interval": "500"},
    "input_sequence": {"include_regex": ".*embedding0_input_0", "save_interval": "500"},
    "feature_importance": _every("500"),
}

_DEBUG_RULES: dict[str, list[tuple[str, dict[str, str]]]] = {
    "VanishingGradient": [("gradients", _COLLECTIONS["gradients"])],
    "LossNotDecreasing": [("losses", _COLLECTIONS["losses"])],
    "WeightUpdateRatio": [("weights", _COLLECTIONS["weights"])],
    "CheckInputImages": [("input_image", _COLLECTIONS["input_image"])],
    "DeadRelu": [("relu_output", _COLLECTIONS["relu_output"])],
    "AllZero": [],
    "ExplodingTensor": [],
    "UnchangedTensor": [],
    "SimilarAcrossRuns": [],
    "TreeDepth": [],
    "ClassImbalance": [],
    "Confusion": [],
    "Overfit": [],
    "TensorVariance": [],
    "Overtraining": [],
    "PoorWeightInitialization": [("relu_input", _COLLECTIONS["relu_input"])],
    "SaturatedActivation": [],
    "NLPSequenceRatio": [("input_sequence", _COLLECTIONS["input_sequence"])],
    "StalledTrainingRule": [],
    "FeatureImportanceOverweight": [("feature_importance", _COLLECTIONS["feature_importance"])],
    "CreateXgboostReport": [("metrics", _every("5")), ("feature_importance", _every("5")),
                            ("hyperparameters", {"save_steps": "0"}),
                            ("predictions", _every("5")), ("labels", _every("5"))],
}

#: Rules that only mean something for XGBoost models (v2 warns when they are used).
XGBOOST_ONLY_RULES = ("FeatureImportanceOverweight", "TreeDepth")


def debug_rule_config(name: str) -> dict[str, Any]:
    """The configuration dict of a built-in debug rule, by its name (``"LossNotDecreasing"``)."""
    if name not in _DEBUG_RULES:
        raise DebuggerError(f"{name!r} is not a built-in debug rule; they are {sorted(_DEBUG_RULES)}")
    config: dict[str, Any] = {"DebugRuleConfiguration": {
        "RuleConfigurationName": name, "RuleParameters": {"rule_to_invoke": name}}}
    if _DEBUG_RULES[name]:
        config["CollectionConfigurations"] = [
            {"CollectionName": c, "CollectionParameters": dict(p)} for c, p in _DEBUG_RULES[name]]
    return config


#: The collections ``get_collection`` offers (rulesconfig's list).
PUBLISHED_COLLECTIONS = ("weights", "gradients", "losses", "input_image", "relu_output",
                         "relu_input", "input_sequence")


def get_collection(name: str) -> dict[str, Any] | None:
    """A built-in collection's configuration (``{"CollectionName", "CollectionParameters"}``;
    rulesconfig 1.0.1 gives the bare parameters for ``relu_output`` and ``relu_input``)."""
    if name not in PUBLISHED_COLLECTIONS:
        return None
    return {"CollectionName": name, "CollectionParameters": copy.deepcopy(_COLLECTIONS[name])}


def _snake(name: str) -> str:
    special = {"NLPSequenceRatio": "nlp_sequence_ratio", "StalledTrainingRule": "stalled_training_rule"}
    return special.get(name) or re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


def _debug_rule_function(name: str):
    def config() -> dict[str, Any]:
        return debug_rule_config(name)

    config.__name__ = config.__qualname__ = _snake(name)
    config.__doc__ = f"Debugger's built-in {name} rule, for ``Rule.sagemaker``."
    return config


for _name in _DEBUG_RULES:
    globals()[_snake(_name)] = _debug_rule_function(_name)

DEBUG_RULE_FUNCTIONS = tuple(_snake(n) for n in _DEBUG_RULES)
PROFILER_RULE_CLASSES = tuple(rule_table.PROFILER_RULES) + (rule_table.REPORT,)

from shoal.debugger.actions import SMS, ActionList, Email, StopTraining, is_valid_action_object  # noqa: E402 - v2 reaches them as rule_configs.*

__all__ = [*PROFILER_RULE_CLASSES, *DEBUG_RULE_FUNCTIONS, "ProfilerRuleConfig", "get_collection",
           "debug_rule_config", "ActionList", "StopTraining", "Email", "SMS",
           "is_valid_action_object"]
