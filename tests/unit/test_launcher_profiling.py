"""The launcher turns the container's profilerconfig.json into the job processes' profiling
environment: into LocalPath (under the base directory), steps or every span, and nothing
without a configuration or when the caller set it up already."""

from __future__ import annotations

import json

import pytest
from shoal.debugger import FrameworkProfile
from shoal.launcher import profiling
from shoal.launcher.paths import JobPaths
from shoal.profiler.profiling_parameters import ProfilingParametersError


def paths_with(tmp_path, config) -> JobPaths:
    paths = JobPaths(str(tmp_path))
    folder = tmp_path / "input" / "config"
    folder.mkdir(parents=True)
    if config is not None:
        (folder / "profilerconfig.json").write_text(json.dumps(config))
    return paths


def test_no_configuration_no_profiling(tmp_path):
    assert profiling.profiler_env(paths_with(tmp_path, None), {}) == {}


def test_system_monitoring_alone_records_steps(tmp_path):
    env = profiling.profiler_env(paths_with(tmp_path, {"ProfilingParameters": {}}),
                                 {"PYTHONPATH": "/x"})
    assert env["SHOAL_PROFILER_DIR"] == str(tmp_path / "output" / "profiler")
    assert env["SHOAL_PROFILER_EVENTS"] == "steps"
    assert env["PYTHONPATH"] == f"{profiling.BOOTSTRAP}:/x"
    assert (profiling.BOOTSTRAP / "sitecustomize.py").exists()


def test_framework_profiling_records_every_span_into_its_local_path(tmp_path):
    params = FrameworkProfile(local_path="/opt/ml/output/tensors/prof").profiling_parameters
    env = profiling.profiler_env(paths_with(tmp_path, {"ProfilingParameters": params}), {})
    assert env["SHOAL_PROFILER_DIR"] == str(tmp_path / "output" / "tensors" / "prof")
    assert env["SHOAL_PROFILER_EVENTS"] == "all"


def test_set_up_already_or_disabled(tmp_path):
    paths = paths_with(tmp_path, {"ProfilingParameters": {}})
    assert profiling.profiler_env(paths, {"SHOAL_PROFILER_DIR": "/elsewhere"}) == {}
    (tmp_path / "input" / "config" / "profilerconfig.json").write_text(
        json.dumps({"DisableProfiler": True}))
    assert profiling.profiler_env(paths, {}) == {}


def test_a_configuration_string_that_is_code_is_refused(tmp_path):
    paths = paths_with(tmp_path, {"ProfilingParameters": {
        "DetailedProfilingConfig": "__import__('os').system('false')"}})
    with pytest.raises(ProfilingParametersError):
        profiling.profiler_env(paths, {})
