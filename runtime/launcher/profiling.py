"""Framework profiling inside the container: when the job was configured with a profiler,
the service writes ``input/config/profilerconfig.json`` (``{"ProfilingParameters": {...}}``);
the job's processes then record framework events into its ``LocalPath``
(``/opt/ml/output/profiler`` unless set; under ``SAGEMAKER_BASE_DIR`` locally), through
Shoal's bootstrap on PYTHONPATH. Nothing here imports more than the standard library: the
launcher stays light."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path

import shoal.profiler
from shoal.launcher.paths import JobPaths, rebase
from shoal.profiler import profiling_parameters

CONFIG_FILE = "profilerconfig.json"
DEFAULT_LOCAL_PATH = "/opt/ml/output/profiler"
BOOTSTRAP = Path(shoal.profiler.__file__).parent / "bootstrap"


def profiler_env(paths: JobPaths, environ: Mapping[str, str]) -> dict[str, str]:
    """What the job's processes need to record framework events (nothing when the job has no
    profiler configuration, or when the caller set it up already, as local jobs do)."""
    config_file = os.path.join(paths.input_config_dir, CONFIG_FILE)
    if environ.get("SHOAL_PROFILER_DIR") or not os.path.exists(config_file):
        return {}
    with open(config_file, encoding="utf-8") as f:
        config = json.load(f) or {}
    params = {str(k): v for k, v in (config.get("ProfilingParameters") or {}).items()}
    if config.get("DisableProfiler") is True:
        return {}
    local = params.get("LocalPath") or DEFAULT_LOCAL_PATH
    metrics = profiling_parameters.parse(params)  # literal dicts only: data, never code
    path = os.pathsep.join(p for p in (str(BOOTSTRAP), environ.get("PYTHONPATH")) if p)
    return {"SHOAL_PROFILER_DIR": str(rebase(local, paths.base_dir)), "PYTHONPATH": path,
            "SHOAL_PROFILER_EVENTS": "all" if metrics else "steps"}
