"""Runs every benchmark and prints its table (``make benchmarks``).

    .venv/bin/python benchmarks/run_all.py [--rounds N] [--sizes 4K,1M,64M]

allreduce.py, p2p.py and reduce_scatter.py under mpirun in two configurations,
2 ranks on one host and 2 simulated hosts x 2 ranks (Shoal groups ranks by
SHOAL_HOST, so its inter-host path runs over TCP); --rounds applies to the three,
--sizes to allreduce.py. framework_step.py (FSDP, 1F1B) and ddp_step.py under
mpirun with 2 ranks; exchange_floor.py compiles and runs its C++ program;
local_startup.py starts its own local job; profiler_overhead.py and serve_load.py start
their own processes; sharded_data_parallel.py starts its own 4-rank mpirun job.
"""

from __future__ import annotations

import argparse
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
MPIRUN = ["mpirun", "--allow-run-as-root", "--oversubscribe"]


def configurations(extra: list[str]) -> list[tuple[str, list[str]]]:
    script = [sys.executable, str(HERE / "allreduce.py"), *extra]
    two_hosts = (
        "SHOAL_HOST=h$((OMPI_COMM_WORLD_RANK/2)) exec " + " ".join(shlex.quote(a) for a in script)
    )
    runs = [
        ("allreduce, 1 host x 2 ranks", [*MPIRUN, "-np", "2", *script]),
        ("allreduce, 2 simulated hosts x 2 ranks", [*MPIRUN, "-np", "4", "bash", "-c", two_hosts]),
    ]
    # The collectives and transfers that groups and model parallelism use, same two shapes.
    for name, title in (("p2p.py", "point-to-point"), ("reduce_scatter.py", "reduce-scatter, allgather")):
        other = [sys.executable, str(HERE / name), "--rounds", extra[1]]
        hosts = "SHOAL_HOST=h$((OMPI_COMM_WORLD_RANK/2)) exec " + shlex.join(other)
        runs.append((f"{title}, 1 host x 2 ranks", [*MPIRUN, "-np", "2", *other]))
        runs.append((f"{title}, 2 simulated hosts x 2 ranks", [*MPIRUN, "-np", "4", "bash", "-c", hosts]))
    runs.append(("FSDP and 1F1B steps, 2 ranks",
                 [*MPIRUN, "-np", "2", sys.executable, str(HERE / "framework_step.py")]))
    if (HERE / "ddp_step.py").exists():
        runs.append(("DDP step, 2 ranks", [*MPIRUN, "-np", "2", sys.executable, str(HERE / "ddp_step.py")]))
    runs.append(("two-core exchange floor", [sys.executable, str(HERE / "exchange_floor.py")]))
    if (HERE / "local_startup.py").exists():
        runs.append(("local-mode startup", [sys.executable, str(HERE / "local_startup.py")]))
    runs.append(("profiler overhead", [sys.executable, str(HERE / "profiler_overhead.py"),
                                       "--rounds", "9"]))
    runs.append(("shoal serve under load", [sys.executable, str(HERE / "serve_load.py")]))
    runs.append(("sharded data parallel 4 against FSDP2, 4 ranks",
                 [sys.executable, str(HERE / "sharded_data_parallel.py")]))
    return runs


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", default="5")
    parser.add_argument("--sizes", default=None, help="passed to allreduce.py")
    args = parser.parse_args(argv)
    if shutil.which("mpirun") is None:
        print("mpirun (Open MPI) is not installed", file=sys.stderr)
        return 1
    extra = ["--rounds", args.rounds] + (["--sizes", args.sizes] if args.sizes else [])
    failed = 0
    for title, argv_ in configurations(extra):
        print(f"== {title}\n$ {' '.join(shlex.quote(a) for a in argv_)}", flush=True)
        failed += subprocess.run(argv_).returncode != 0
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
