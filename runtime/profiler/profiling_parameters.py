"""``ProfilerConfig.ProfilingParameters`` as a job receives them (``profilerconfig.json`` in a
SageMaker container, the request in local mode): file rotation settings and one
configuration string per framework metric, written as a Python dict literal with a
trailing comma (``{"StartStep": 5, "NumSteps": 1, }``). Parsed as data with
``ast.literal_eval``; Debugger's own parser evaluates them, Shoal never does.
"""

from __future__ import annotations

import ast
from collections.abc import Mapping
from typing import Any

METRICS = ("DetailedProfilingConfig", "DataloaderProfilingConfig", "PythonProfilingConfig",
           "HorovodProfilingConfig", "SMDataParallelProfilingConfig")


class ProfilingParametersError(ValueError):
    """A configuration string that is not a literal dict."""


def parse_metric(name: str, text: str) -> dict[str, Any]:
    try:
        value = ast.literal_eval(text.strip()) if isinstance(text, str) else text
    except (ValueError, SyntaxError, MemoryError, RecursionError) as error:
        raise ProfilingParametersError(
            f"'{name}' must be a literal dict such as {{\"StartStep\": 5, \"NumSteps\": 1, }} "
            f"(got {text!r}: {error})") from None
    if not isinstance(value, dict):
        raise ProfilingParametersError(f"'{name}' must be a literal dict (got {text!r})")
    return value


def parse(parameters: Mapping[str, str] | None) -> dict[str, dict[str, Any]]:
    """The framework metrics asked for, by configuration name."""
    return {name: parse_metric(name, text) for name, text in (parameters or {}).items()
            if name in METRICS}
