"""SageMaker Debugger's estimator surface, as SageMaker Python SDK v2 has it
(``from sagemaker.debugger import ...``): rules (``rules=``), the profiler
(``profiler_config=``, ``disable_profiler=``), the tensor hook (``debugger_hook_config=``)
and TensorBoard output (``tensorboard_output_config=``).

:mod:`shoal.debugger.request` turns them into the request's ``ProfilerConfig``,
``ProfilerRuleConfigurations``, ``DebugRuleConfigurations``, ``DebugHookConfig`` and
``TensorBoardOutputConfig``.
"""

from shoal.debugger import rule_configs
from shoal.debugger.hooks import CollectionConfig, DebuggerHookConfig, TensorBoardOutputConfig
from shoal.debugger.profiling import (
    DataloaderProfilingConfig,
    DetailedProfilingConfig,
    FrameworkProfile,
    HorovodProfilingConfig,
    Profiler,
    ProfilerConfig,
    PythonProfiler,
    PythonProfilingConfig,
    SMDataParallelProfilingConfig,
    cProfileTimer,
)
from shoal.debugger.rules import ProfilerRule, Rule, get_rule_container_image_uri

__all__ = [
    "CollectionConfig", "DataloaderProfilingConfig", "DebuggerHookConfig",
    "DetailedProfilingConfig", "FrameworkProfile", "HorovodProfilingConfig", "Profiler",
    "ProfilerConfig", "ProfilerRule", "PythonProfiler", "PythonProfilingConfig", "Rule",
    "SMDataParallelProfilingConfig", "TensorBoardOutputConfig", "cProfileTimer",
    "get_rule_container_image_uri", "rule_configs",
]
