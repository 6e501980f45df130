"""The request's Debugger keys from the estimator's arguments, as SageMaker Python SDK v2
builds them (``ProfilerConfig``, ``ProfilerRuleConfigurations``, ``DebugHookConfig``,
``DebugRuleConfigurations``, ``TensorBoardOutputConfig``). Pure: no I/O, and the user's
rule and config objects are left as they were.

v2's behaviour, kept: system monitoring is on by default (no rule is added); a debug rule
turns the hook on; the hook saves every collection a debug rule needs plus its own; Trainium
instances and regions without Debugger turn the profiler off, and asking for it there is an
error; a framework job with checkpoints and more than one instance leaves the hook off.
Shoal's own checks (the service's limits, made before any call): at most 20 rules of each
kind, unique rule names, at most 20 collections, rule parameters within the API's sizes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from shoal.debugger.hooks import CollectionConfig, DebuggerHookConfig
from shoal.debugger.profiling import ProfilerConfig
from shoal.debugger.rules import (
    DETAILED_PROFILER_RULE,
    ProfilerRule,
    Rule,
    debug_rule_request,
    profiler_rule_request,
)
from shoal.errors import DebuggerError

# Regions where SageMaker Debugger (hook and profiler) is not offered.
UNSUPPORTED_REGIONS = frozenset({
    "us-iso-east-1", "us-isob-east-1", "ap-southeast-3", "ap-southeast-4", "eu-south-2",
    "me-central-1", "ap-south-2", "eu-central-2", "us-gov-east-1",
})
RULES_MAX = 20            # each of ProfilerRuleConfigurations and DebugRuleConfigurations
COLLECTIONS_MAX = 20      # DebugHookConfig.CollectionConfigurations
RULE_PARAMETERS_MAX = 100
PARAMETER_TEXT_MAX = 256  # a RuleParameters key or value


def _refuse(name: str, message: str, value):
    raise DebuggerError(f"'{name}' {message} (got {value!r})")


def check_rules(rules) -> None:
    """The ``rules=`` argument: Rule and ProfilerRule objects within the service's limits."""
    if rules is None:
        return
    if isinstance(rules, (str, bytes, Mapping)) or not isinstance(rules, Sequence):
        _refuse("rules", "must be a list of Rule and ProfilerRule objects", rules)
    for kind in (Rule, ProfilerRule):
        count = sum(isinstance(r, kind) for r in rules)
        if count > RULES_MAX:
            _refuse("rules", f"must hold at most {RULES_MAX} {kind.__name__} objects", count)
    for rule in rules:
        if not isinstance(rule, (Rule, ProfilerRule)):
            _refuse("rules", "must hold only sagemaker.debugger Rule and ProfilerRule objects "
                    "(shoal.debugger)", rule)
        _check_parameters(rule)
    names = [r.name for r in rules]
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        _refuse("rules", "must have unique names (pass name= to tell two apart)", repeated)


def _check_parameters(rule) -> None:
    params = rule.rule_parameters or {}
    if len(params) > RULE_PARAMETERS_MAX:
        _refuse(f"rules[{rule.name!r}].rule_parameters",
                f"must have at most {RULE_PARAMETERS_MAX} entries", len(params))
    for key, value in params.items():
        if not 1 <= len(str(key)) <= PARAMETER_TEXT_MAX or len(str(value)) > PARAMETER_TEXT_MAX:
            _refuse(f"rules[{rule.name!r}].rule_parameters[{key!r}]",
                    f"must be at most {PARAMETER_TEXT_MAX} characters as a string", value)


def check_profiler_config(value) -> None:
    if value is not None and not isinstance(value, ProfilerConfig):
        _refuse("profiler_config", "must be a ProfilerConfig", value)


def profiler_disabled(disable_profiler: bool, instance_type: str | None, region: str) -> bool:
    """Whether the job runs without the profiler (asked, a Trainium type, or the region)."""
    trainium = (instance_type or "").startswith(("ml.trn", "ml_trn"))
    return bool(disable_profiler) or trainium or region in UNSUPPORTED_REGIONS


def _split(rules) -> tuple[list[Rule], list[ProfilerRule]]:
    rules = list(rules or ())
    return ([r for r in rules if isinstance(r, Rule)],
            [r for r in rules if isinstance(r, ProfilerRule)])


def profiler_request(*, rules, profiler_config: ProfilerConfig | None, disabled: bool,
                     output_path: str, region: str, detailed_rule_name: str | None = None,
                     sources: dict[str, str] | None = None) -> tuple[dict, list[dict] | None]:
    """``ProfilerConfig`` and ``ProfilerRuleConfigurations`` (None when there is none).

    ``detailed_rule_name``: the name SageMaker Profiler's processing rule gets
    (``DetailedProfilerProcessingJobConfig-<timestamp>``), when ``profile_params`` adds it."""
    _, profiler_rules = _split(rules)
    if disabled:
        if profiler_config is not None and not profiler_config.disable_profiler:
            why = ("the region offers no Debugger" if region in UNSUPPORTED_REGIONS
                   else "disable_profiler is True (or the instance type is Trainium)")
            _refuse("profiler_config", f"cannot enable the profiler: {why}", profiler_config)
        if profiler_rules:
            _refuse("rules", "cannot hold a ProfilerRule when the profiler is disabled",
                    [r.name for r in profiler_rules])
        config = profiler_config or ProfilerConfig(disable_profiler=True)
    else:
        config = profiler_config or ProfilerConfig(s3_output_path=output_path)
        if (rules is None or not profiler_rules) and config.profile_params is not None:
            profiler_rules = [_detailed_rule(config, detailed_rule_name)]
    entries = [profiler_rule_request(r, region, sources) for r in profiler_rules]
    return config._to_request_dict(default_output=output_path), entries or None


def _detailed_rule(config: ProfilerConfig, name: str | None) -> ProfilerRule:
    class _Base:
        rule_name = DETAILED_PROFILER_RULE
        rule_parameters = {"rule_to_invoke": "DetailedProfilerProcessing"}

    params = config.profile_params
    return ProfilerRule.sagemaker(_Base(), name=name or DETAILED_PROFILER_RULE,
                                  instance_type=params.instanceType,
                                  volume_size_in_gb=params.volumeSizeInGB)


def _collections(debug_rules: list[Rule], hook) -> list[CollectionConfig]:
    """Every collection the rules and the hook name, each once, in the order first named."""
    seen: dict[CollectionConfig, None] = {}
    for rule in debug_rules:
        seen.update(dict.fromkeys(rule.collection_configs))
    if isinstance(hook, DebuggerHookConfig):
        seen.update(dict.fromkeys(hook.collection_configs or ()))
    if len(seen) > COLLECTIONS_MAX:
        _refuse("debugger_hook_config", f"must save at most {COLLECTIONS_MAX} collections "
                "(the rules' and its own)", [c.name for c in seen])
    return list(seen)


def debug_request(*, rules, hook, allowed: bool, output_path: str, region: str, job_name: str,
                  sources: dict[str, str] | None = None) -> tuple[dict | None, list[dict] | None]:
    """``DebugHookConfig`` and ``DebugRuleConfigurations`` (None when absent).

    ``hook``: the ``debugger_hook_config`` argument (None, True/False, a DebuggerHookConfig
    or the request's dict); ``allowed``: False where the framework turns the hook off."""
    debug_rules, _ = _split(rules)
    entries = [debug_rule_request(r, region, job_name, sources) for r in debug_rules] or None
    if hook is True or (isinstance(hook, Mapping) and not hook):
        hook = None
    if region in UNSUPPORTED_REGIONS:
        if hook is not None and hook is not False:
            _refuse("debugger_hook_config", f"cannot be set: SageMaker Debugger is not offered "
                    f"in {region}", hook)
        return None, entries
    if hook is False or not allowed:
        return None, entries
    collections = _collections(debug_rules, hook)
    if isinstance(hook, Mapping):
        config = dict(hook)
        config.setdefault("S3OutputPath", output_path)
        config.setdefault("CollectionConfigurations", [c._to_request_dict() for c in collections])
        return config, entries
    hook = hook or DebuggerHookConfig(s3_output_path=output_path)
    return hook._to_request_dict(collections, default_output=output_path), entries


def rule_source_uris(rules, bucket_uri: str, unique) -> dict[str, str]:
    """Where each custom rule's local ``source`` goes: ``<bucket_uri>/<rule>/<unique()>/<file>``
    (v2's place). ``bucket_uri``: the default bucket and its prefix."""
    from shoal.debugger.rules import local_source

    out = {}
    for rule in rules or ():
        path = local_source(rule)
        if path:
            name = path.replace("\\", "/").rsplit("/", 1)[-1]
            out[rule.name] = f"{bucket_uri.rstrip('/')}/{rule.name}/{unique()}/{name}"
    return out


def tensorboard_request(config) -> dict[str, Any] | None:
    return None if config is None else config._to_request_dict()
