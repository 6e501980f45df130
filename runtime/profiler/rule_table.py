"""The built-in profiler rules: every rule's parameters, their defaults and their limits.

Debugger's rule configurations (``smdebug_rulesconfig`` 1.0.1, the version SageMaker Python
SDK v2 pins) define each rule by its constructor: the parameter names, the defaults, and two
checks, a percentile (``0 <= v <= 100``) or a positive number (``v > 0``). The request
carries every value as a string (``"50"``, ``"0.5"``, ``"None"``), so the rule engine parses
them back with :func:`parse_value`: as data, never evaluated.

``ProfilerReport`` runs every rule below plus ``OverallFrameworkMetrics`` (which takes only
``scan_interval_us`` and exists inside the report alone); its parameters are
``<Rule>_<parameter>`` pairs, the rule name matched case-insensitively.
"""

from __future__ import annotations

import ast
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

import attrs

SCAN_INTERVAL_US = 60 * 1000 * 1000  # Debugger scans its data in one-minute windows


@attrs.frozen
class Param:
    """One parameter of a rule: its default and the check its value must pass."""

    name: str
    default: Any
    # "percentile": 0 <= v <= 100; "positive": v > 0; "mode": None or a string
    check: str

    def problem(self, value) -> str | None:
        """Why ``value`` is refused, or None."""
        if self.check == "mode":
            return None if value is None or isinstance(value, str) else "must be None or a str"
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return "must be a number"
        if self.check == "percentile" and not 0 <= value <= 100:
            return "must be a percentile (0 <= value <= 100)"
        if self.check == "positive" and not value > 0:
            return "must be > 0"
        return None


def _rule(*params: Param) -> tuple[Param, ...]:
    return (*params, Param("scan_interval_us", SCAN_INTERVAL_US, "positive"))


def _pct(name: str, default) -> Param:
    return Param(name, default, "percentile")


def _pos(name: str, default) -> Param:
    return Param(name, default, "positive")


#: Each built-in profiler rule's parameters, in constructor order.
PROFILER_RULES: Mapping[str, tuple[Param, ...]] = MappingProxyType({
    "BatchSize": _rule(_pct("cpu_threshold_p95", 70), _pct("gpu_threshold_p95", 70),
                       _pct("gpu_memory_threshold_p95", 70), _pos("patience", 1000),
                       _pos("window", 500)),
    "CPUBottleneck": _rule(_pct("threshold", 50), _pct("gpu_threshold", 10),
                           _pct("cpu_threshold", 90), _pos("patience", 1000)),
    "Dataloader": _rule(_pos("min_threshold", 70), _pos("max_threshold", 200)),
    "GPUMemoryIncrease": _rule(_pos("increase", 5), _pos("patience", 1000), _pos("window", 10)),
    "IOBottleneck": _rule(_pct("threshold", 50), _pct("gpu_threshold", 10),
                          _pct("io_threshold", 50), _pos("patience", 1000)),
    "LoadBalancing": _rule(_pct("threshold", 0.5), _pos("patience", 1000)),
    "LowGPUUtilization": _rule(_pct("threshold_p95", 70), _pct("threshold_p5", 10),
                               _pos("window", 500), _pos("patience", 1000)),
    "MaxInitializationTime": _rule(_pos("threshold", 20)),
    "OverallSystemUsage": _rule(),
    "StepOutlier": _rule(_pos("stddev", 3), Param("mode", None, "mode"), _pos("n_outliers", 10)),
})

#: Rules ProfilerReport runs that have no configuration class of their own.
REPORT_ONLY_RULES: Mapping[str, tuple[Param, ...]] = MappingProxyType({
    "OverallFrameworkMetrics": _rule(),
})

#: Shoal's own rules, from the data-parallel library's documented pitfalls; on by default in
#: local jobs (the configuration ``ShoalRules``).
SHOAL_RULES: Mapping[str, tuple[Param, ...]] = MappingProxyType({
    # collectives inflating while the ranks' CPU is saturated (CPU preprocessing against the
    # CPU AllReduce): the median collective takes ``inflation`` x its calm time
    "CollectiveCPUContention": _rule(_pct("cpu_threshold", 90), _pos("inflation", 3),
                                     _pos("min_collectives", 20)),
    # exposed (synchronous) collective time above ``threshold`` percent of the step
    "CommunicationBound": _rule(_pct("threshold", 20), _pos("min_steps", 10)),
    # data parallelism across the processes of one node
    "SingleNodeDataParallel": _rule(_pos("min_collectives", 10)),
})
SHOAL_CONFIGURATION = "ShoalRules"

REPORT = "ProfilerReport"


def params_of(rule: str) -> tuple[Param, ...]:
    for table in (PROFILER_RULES, REPORT_ONLY_RULES, SHOAL_RULES):
        if rule in table:
            return table[rule]
    raise KeyError(rule)


def defaults(rule: str) -> dict[str, Any]:
    return {p.name: p.default for p in params_of(rule)}


def report_key(key: str) -> tuple[str, str]:
    """``"CPUBottleneck_threshold"`` (any case) -> ``("CPUBottleneck", "threshold")``.

    Raises ValueError naming what is wrong."""
    rule, sep, param = key.partition("_")
    if not sep or not param:
        raise ValueError(f"{key!r} does not follow the naming scheme <rule_name>_<parameter_name>")
    by_lower = {name.lower(): name for name in PROFILER_RULES}
    if rule.lower() not in by_lower:
        raise ValueError(f"{key!r}: {rule!r} is not a rule ProfilerReport runs; the rules are "
                         f"{sorted(PROFILER_RULES)} (any case)")
    name = by_lower[rule.lower()]
    names = [p.name for p in PROFILER_RULES[name]]
    if param.lower() not in names:
        raise ValueError(f"{key!r}: {param.lower()!r} is not a parameter of {name}; its "
                         f"parameters are {names}")
    return name, param.lower()


def parse_value(text: Any) -> Any:
    """A rule parameter as the request carries it (``"50"``, ``"0.5"``, ``"None"``, ``"True"``)
    back to its value. Literals only (``ast.literal_eval``); anything else stays a string."""
    if not isinstance(text, str):
        return text
    try:
        return ast.literal_eval(text.strip())
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return text


def resolve(rule: str, parameters: Mapping[str, Any]) -> dict[str, Any]:
    """A rule's parameters from a request (strings) over its defaults, checked.

    Raises ValueError naming the parameter, the limit and the value."""
    values = defaults(rule)
    known = {p.name: p for p in params_of(rule)}
    for key, raw in parameters.items():
        if key in ("rule_to_invoke", "opt_out_telemetry") or key not in known:
            continue
        value = parse_value(raw)
        why = known[key].problem(value)
        if why:
            raise ValueError(f"{rule}: '{key}' {why} (got {raw!r})")
        values[key] = value
    return values
