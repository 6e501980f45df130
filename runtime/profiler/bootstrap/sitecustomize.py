"""Started in every Python process of a profiled job (this directory leads PYTHONPATH):
records framework events without changes to the training script, then hands over to the
``sitecustomize`` this one shadows, if there is one."""

import os
import sys


def _chain() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    import importlib.util

    for entry in sys.path:
        if os.path.abspath(entry or ".") == here:
            continue
        candidate = os.path.join(entry or ".", "sitecustomize.py")
        if os.path.isfile(candidate):
            spec = importlib.util.spec_from_file_location("_shoal_chained_sitecustomize", candidate)
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            return


try:
    if os.environ.get("SHOAL_PROFILER_DIR"):
        from shoal.profiler import hooks

        hooks.install_when_imported()
except Exception as error:  # profiling must never stop a job
    sys.stderr.write(f"shoal profiler: framework events off ({error})\n")
_chain()
