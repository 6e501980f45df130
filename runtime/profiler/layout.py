"""Where Debugger's profiler data lives (``<output>/<job>/profiler-output/`` on S3, the
``ProfilingParameters.LocalPath`` tree in a job), file names included, so that Debugger's own
readers and Shoal's rule engine find the same files.

    system/incremental/<YYYYMMDDHH>/<minute epoch s>.<node>.json      JSON lines, one per metric
    system/training_job_end.ts                                       the job has ended
    framework/pevents/<YYYYMMDDHH>/<end us>_<node>_model_timeline.json  Chrome trace events
    framework/training_job_end.ts
"""

from __future__ import annotations

import re
import time
from pathlib import Path

END_MARKER = "training_job_end.ts"
SYSTEM_FILE = re.compile(r"(\d{10})\.(algo-\d+)\.json$")
FRAMEWORK_FILE = re.compile(r"(\d+)_(algo-\d+)_model_timeline\.json$")


def hour_dir(epoch_s: float) -> str:
    return time.strftime("%Y%m%d%H", time.gmtime(epoch_s))


def system_file(root: Path, node: str, epoch_s: float) -> Path:
    minute = int(epoch_s) // 60 * 60
    return Path(root) / "system" / "incremental" / hour_dir(minute) / f"{minute}.{node}.json"


def framework_file(root: Path, node: str, end_us: int) -> Path:
    return (Path(root) / "framework" / "pevents" / hour_dir(end_us / 1e6)
            / f"{end_us}_{node}_model_timeline.json")


def system_files(root: Path) -> list[Path]:
    base = Path(root) / "system" / "incremental"
    return sorted(p for p in base.glob("*/*.json") if SYSTEM_FILE.search(p.name))


def framework_files(root: Path) -> list[Path]:
    base = Path(root) / "framework" / "pevents"
    return sorted(p for p in base.glob("*/*.json") if FRAMEWORK_FILE.search(p.name))


def mark_end(root: Path, epoch_s: float | None = None) -> None:
    """Write the end markers the rules wait for (once the job's data is complete)."""
    stamp = f"{(time.time() if epoch_s is None else epoch_s):.6f}\n"
    for part in ("system", "framework"):
        (Path(root) / part).mkdir(parents=True, exist_ok=True)
        (Path(root) / part / END_MARKER).write_text(stamp)


def ended(root: Path) -> bool:
    return any((Path(root) / part / END_MARKER).exists() for part in ("system", "framework"))
