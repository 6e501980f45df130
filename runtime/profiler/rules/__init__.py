"""Debugger's built-in profiler rules, re-implemented from their documented behaviour, and
the rules ``ProfilerReport`` runs."""

from shoal.profiler.rules.base import ISSUES, NO_ISSUES, Rule
from shoal.profiler.rules.framework import (
    Dataloader,
    MaxInitializationTime,
    OverallFrameworkMetrics,
    StepOutlier,
)
from shoal.profiler.rules.shoal import (
    CollectiveCPUContention,
    CommunicationBound,
    SingleNodeDataParallel,
)
from shoal.profiler.rules.system import (
    BatchSize,
    CPUBottleneck,
    GPUMemoryIncrease,
    IOBottleneck,
    LoadBalancing,
    LowGPUUtilization,
    OverallSystemUsage,
)

RULES: dict[str, type[Rule]] = {cls.name: cls for cls in (
    BatchSize, CPUBottleneck, Dataloader, GPUMemoryIncrease, IOBottleneck, LoadBalancing,
    LowGPUUtilization, MaxInitializationTime, OverallSystemUsage, StepOutlier,
    OverallFrameworkMetrics)}
#: Shoal's own rules (``rule_table.SHOAL_RULES``), run together as ``ShoalRules``.
SHOAL_RULES: dict[str, type[Rule]] = {cls.name: cls for cls in (
    CollectiveCPUContention, CommunicationBound, SingleNodeDataParallel)}

__all__ = ["ISSUES", "NO_ISSUES", "RULES", "SHOAL_RULES", "Rule", *RULES, *SHOAL_RULES]
