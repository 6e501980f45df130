"""Local-mode startup: the time from ``fit()`` to the first line of the user's script.

A job of 2 simulated hosts x 2 ranks (MPI runner) whose script records ``time.time()`` as its
very first statement; the figure is measured from just before ``fit()`` to the first and to
the last of the four ranks. Target: at most 3 s on a 2-core machine.

    .venv/bin/python benchmarks/local_startup.py [--runs 3]
"""

import argparse
import os
import statistics
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import shoal

SCRIPT = """\
import time; STARTED = time.time()
import os
with open(os.path.join(os.environ["SM_MODEL_DIR"], "start-%s" % os.environ["RANK"]), "w") as f:
    f.write(repr(STARTED))
"""


def one_run(workdir: Path, index: int) -> tuple[float, float]:
    code = workdir / "code"
    code.mkdir(exist_ok=True)
    (code / "first_line.py").write_text(SCRIPT)
    estimator = shoal.PyTorch(
        entry_point="first_line.py", source_dir=str(code),
        role="arn:aws:iam::111122223333:role/Bench", instance_type="local", instance_count=2,
        framework_version="1.13.1", py_version="py39",
        distribution={"mpi": {"enabled": True, "processes_per_host": 2}},
        output_path=(workdir / f"out-{index}").as_uri())
    began = time.time()
    estimator.fit(wait=False, job_name=f"startup-bench-{os.getpid()}-{index}")
    estimator.latest_training_job.wait(logs="None")
    archive = Path(estimator.model_data.removeprefix("file://"))
    with tarfile.open(archive) as tar:
        starts = [float(tar.extractfile(m).read()) for m in tar.getmembers() if m.isfile()]
    assert len(starts) == 4, starts
    return min(starts) - began, max(starts) - began


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="shoal-startup-") as tmp:
        os.environ["SHOAL_LOCAL_ROOT"] = str(Path(tmp) / "jobs")
        runs = [one_run(Path(tmp), i) for i in range(args.runs)]
    first = [r[0] for r in runs]
    last = [r[1] for r in runs]
    print("local startup, 2 hosts x 2 ranks: fit() -> script's first line")
    for i, (a, b) in enumerate(runs):
        print(f"  run {i + 1}: first rank {a:.2f} s, last rank {b:.2f} s")
    print(f"median: first rank {statistics.median(first):.2f} s, "
          f"last rank {statistics.median(last):.2f} s (target <= 3.0 s, "
          f"ratio to target {statistics.median(last) / 3.0:.2f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
