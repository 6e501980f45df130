"""The profiler's configuration (``profiler_config=``): system monitoring and its interval,
framework profiling (deprecated by SageMaker for PyTorch >= 2.0 and TensorFlow >= 2.12, still
sent as v2 sends it), and SageMaker Profiler (``Profiler``).

Framework profiling's per-metric configurations travel as strings in the form Debugger's
hook reads, a Python dict literal with a trailing comma (``{"StartStep": 5, "NumSteps": 1, }``);
Shoal's runtime reads them back as data (``ast.literal_eval``), never evaluated.
"""

from __future__ import annotations

import re
import warnings
from datetime import datetime
from enum import Enum
from typing import Any

from shoal.errors import DebuggerError

#: The intervals the service accepts for system monitoring, in milliseconds.
MONITOR_INTERVALS_MS = (100, 200, 500, 1000, 5000, 60000)
DEFAULT_LOCAL_PATH = "/opt/ml/output/profiler"


class PythonProfiler(Enum):
    CPROFILE = "cprofile"
    PYINSTRUMENT = "pyinstrument"


class cProfileTimer(Enum):  # noqa: N801 - v2's name
    TOTAL_TIME = "total_time"
    CPU_TIME = "cpu_time"
    OFF_CPU_TIME = "off_cpu_time"
    DEFAULT = "default"


def _refuse(name: str, message: str, value):
    raise DebuggerError(f"'{name}' {message} (got {value!r})")


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def dict_literal(config: dict[str, Any]) -> str:
    """``{"StartStep": 5, "NumSteps": 1, }``: strings quoted, everything else as Python shows it."""
    def show(v):
        return f'"{v}"' if isinstance(v, str) else f"{v}"

    return "{" + "".join(f"{show(k)}: {show(v)}, " for k, v in config.items()) + "}"


class MetricsConfig:
    """One framework metric's profiling range: steps (start_step, num_steps) or time
    (start_unix_time, duration), not both."""

    name = ""
    default_start_step = 0
    default_num_steps = 1

    def __init__(self, start_step=None, num_steps=None, start_unix_time=None, duration=None,
                 profile_default_steps=False):
        if not isinstance(profile_default_steps, bool):
            _refuse("profile_default_steps", "must be a bool", profile_default_steps)
        if profile_default_steps or start_step is num_steps is start_unix_time is duration is None:
            start_step, num_steps = self.default_start_step, self.default_num_steps
        if start_step is not None and not (_is_int(start_step) and start_step >= 0):
            _refuse("start_step", "must be an int >= 0", start_step)
        if num_steps is not None and not (_is_int(num_steps) and num_steps > 0):
            _refuse("num_steps", "must be an int > 0", num_steps)
        if start_unix_time is not None and not (_is_int(start_unix_time) and _valid_time(start_unix_time)):
            _refuse("start_unix_time", "must be an int Unix time", start_unix_time)
        if duration is not None and not (_is_number(duration) and duration > 0):
            _refuse("duration", "must be a number > 0", duration)
        steps = start_step is not None or num_steps is not None
        if steps and (start_unix_time is not None or duration is not None):
            raise DebuggerError(f"{self.name}: give a step range (start_step, num_steps) or a "
                                "time range (start_unix_time, duration), not both")
        if steps:
            self.range = {"StartStep": 0 if start_step is None else start_step,
                          "NumSteps": 1 if num_steps is None and start_step is not None else num_steps}
        else:
            self.range = {k: v for k, v in (("StartTimeInSecSinceEpoch", start_unix_time),
                                            ("Duration", duration)) if v is not None}

    def _to_json(self) -> dict[str, Any]:
        return dict(self.range)

    def to_json_string(self) -> str:
        return dict_literal(self._to_json())


def _valid_time(t: int) -> bool:
    try:
        datetime.fromtimestamp(t)
        return True
    except (OverflowError, ValueError, OSError):
        return False


class DetailedProfilingConfig(MetricsConfig):
    name, default_start_step = "DetailedProfilingConfig", 5


class DataloaderProfilingConfig(MetricsConfig):
    name, default_start_step = "DataloaderProfilingConfig", 7

    def __init__(self, start_step=None, num_steps=None, start_unix_time=None, duration=None,
                 profile_default_steps=False, metrics_regex=".*"):
        super().__init__(start_step, num_steps, start_unix_time, duration, profile_default_steps)
        try:
            re.compile(metrics_regex)
        except (re.error, TypeError):
            _refuse("metrics_regex", "must be a regular expression", metrics_regex)
        self.metrics_regex = metrics_regex

    def _to_json(self) -> dict[str, Any]:
        return {**self.range, "MetricsRegex": self.metrics_regex}


class PythonProfilingConfig(MetricsConfig):
    name, default_start_step, default_num_steps = "PythonProfilingConfig", 9, 3

    def __init__(self, start_step=None, num_steps=None, start_unix_time=None, duration=None,
                 profile_default_steps=False, python_profiler=PythonProfiler.CPROFILE,
                 cprofile_timer=cProfileTimer.TOTAL_TIME):
        super().__init__(start_step, num_steps, start_unix_time, duration, profile_default_steps)
        if not isinstance(python_profiler, PythonProfiler):
            _refuse("python_profiler", "must be a PythonProfiler", python_profiler)
        if not isinstance(cprofile_timer, cProfileTimer):
            _refuse("cprofile_timer", "must be a cProfileTimer", cprofile_timer)
        self.python_profiler = python_profiler
        if profile_default_steps:
            cprofile_timer = cProfileTimer.DEFAULT
        self.cprofile_timer = None if python_profiler is PythonProfiler.PYINSTRUMENT else cprofile_timer

    def _to_json(self) -> dict[str, Any]:
        out = {**self.range, "ProfilerName": self.python_profiler.value}
        if self.cprofile_timer is not None:
            out["cProfileTimer"] = self.cprofile_timer.value
        return out


class HorovodProfilingConfig(MetricsConfig):
    name, default_start_step = "HorovodProfilingConfig", 13


class SMDataParallelProfilingConfig(MetricsConfig):
    name, default_start_step = "SMDataParallelProfilingConfig", 15


METRICS_CONFIGS = (DetailedProfilingConfig, DataloaderProfilingConfig, PythonProfilingConfig,
                   HorovodProfilingConfig, SMDataParallelProfilingConfig)


class FrameworkProfile:
    """Framework profiling: trace files (where, rotation) and which metrics, over which steps.

    Three ways, as v2: per-metric configurations; one range for all metrics (start_step &
    num_steps, or start_unix_time & duration); or, with neither, each metric's default steps."""

    def __init__(self, local_path=DEFAULT_LOCAL_PATH, file_max_size=10485760,
                 file_close_interval=60, file_open_fail_threshold=50,
                 detailed_profiling_config=None, dataloader_profiling_config=None,
                 python_profiling_config=None, horovod_profiling_config=None,
                 smdataparallel_profiling_config=None, start_step=None, num_steps=None,
                 start_unix_time=None, duration=None):
        if not isinstance(local_path, str):
            _refuse("local_path", "must be a str", local_path)
        if not (_is_int(file_max_size) and file_max_size > 0):
            _refuse("file_max_size", "must be an int > 0", file_max_size)
        if not (_is_number(file_close_interval) and file_close_interval > 0):
            _refuse("file_close_interval", "must be a number > 0", file_close_interval)
        if not (_is_int(file_open_fail_threshold) and file_open_fail_threshold > 0):
            _refuse("file_open_fail_threshold", "must be an int > 0", file_open_fail_threshold)
        self.profiling_parameters: dict[str, str] = {
            "LocalPath": local_path, "RotateMaxFileSizeInBytes": str(file_max_size),
            "RotateFileCloseIntervalInSeconds": str(file_close_interval),
            "FileOpenFailThreshold": str(file_open_fail_threshold),
        }
        given = [c for c in (detailed_profiling_config, dataloader_profiling_config,
                             python_profiling_config, horovod_profiling_config,
                             smdataparallel_profiling_config) if c is not None]
        if given:
            configs = given
        elif not start_step is num_steps is start_unix_time is duration is None:
            configs = [cls(start_step=start_step, num_steps=num_steps,
                           start_unix_time=start_unix_time, duration=duration)
                       for cls in METRICS_CONFIGS]
        else:
            configs = [cls(profile_default_steps=True) for cls in METRICS_CONFIGS]
        for config in configs:
            if not isinstance(config, MetricsConfig):
                _refuse("profiling config", "must be one of the *ProfilingConfig classes", config)
            self.profiling_parameters[config.name] = config.to_json_string()


class Profiler:
    """SageMaker Profiler (a processing job over detailed traces)."""

    instanceType = "ml.m5.4xlarge"  # noqa: N815 - v2's attribute names
    volumeSizeInGB = 128  # noqa: N815

    def __init__(self, cpu_profiling_duration: str = "3600", file_rotation_interval: str = "600"):
        self.profiling_parameters = {"CPUProfilingDuration": str(cpu_profiling_duration),
                                     "SMPFileRotationSecs": str(file_rotation_interval)}


class ProfilerConfig:
    """System monitoring (on unless ``disable_profiler``), its interval, and framework
    profiling (``framework_profile_params``) or SageMaker Profiler (``profile_params``)."""

    def __init__(self, s3_output_path: str | None = None,
                 system_monitor_interval_millis: int | None = None,
                 framework_profile_params: FrameworkProfile | None = None,
                 profile_params: Profiler | None = None, disable_profiler: bool = False):
        if framework_profile_params is not None and not isinstance(framework_profile_params,
                                                                   FrameworkProfile):
            _refuse("framework_profile_params", "must be a FrameworkProfile", framework_profile_params)
        if profile_params is not None and not isinstance(profile_params, Profiler):
            _refuse("profile_params", "must be a Profiler", profile_params)
        if profile_params is not None and framework_profile_params is not None:
            raise DebuggerError("'profile_params' (SageMaker Profiler) and "
                                "'framework_profile_params' cannot be used together")
        interval = system_monitor_interval_millis
        if interval is not None and interval not in MONITOR_INTERVALS_MS:
            _refuse("system_monitor_interval_millis", f"must be in {MONITOR_INTERVALS_MS}", interval)
        if not isinstance(disable_profiler, bool):
            _refuse("disable_profiler", "must be a bool", disable_profiler)
        if framework_profile_params is not None:
            warnings.warn("Framework profiling will be deprecated from tensorflow 2.12 and "
                          "pytorch 2.0", FutureWarning, stacklevel=2)
        self.s3_output_path = s3_output_path
        self.system_monitor_interval_millis = interval
        self.framework_profile_params = framework_profile_params
        self.profile_params = profile_params
        self.disable_profiler = disable_profiler

    def _to_request_dict(self, default_output: str | None = None) -> dict[str, Any]:
        out: dict[str, Any] = {}
        output = self.s3_output_path or default_output
        if output is not None and self.disable_profiler is False:
            out["S3OutputPath"] = output
        out["DisableProfiler"] = self.disable_profiler
        if self.system_monitor_interval_millis is not None:
            out["ProfilingIntervalInMilliseconds"] = self.system_monitor_interval_millis
        params = self.framework_profile_params or self.profile_params
        if params is not None:
            out["ProfilingParameters"] = dict(params.profiling_parameters)
        return out
