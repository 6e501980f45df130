"""The Slurm backend against the local backend, measured in the same run on this machine:

- startup: from just before ``fit()`` to the first line of the last rank's script, a job of
  2 hosts x 2 ranks (MPI runner), on the local Slurm cluster (``make slurm-up``: sbatch,
  the supervisor on node1, srun, sshd, mpirun over SSH) against the local backend with its
  hosts in network namespaces (the same path without Slurm) and on loopback;
- allreduce: ``allreduce.py`` (Shoal's core API beside gloo and Open MPI) across the two Slurm
  nodes against two namespaced local hosts; both over unshaped veth pairs (the Slurm nodes
  have no link emulation, so neither side gets one). Goal: within 5 %.

    .venv/bin/python benchmarks/slurm_backend.py [--runs 3] [--sizes 1M,16M,64M]

Needs root; starts the local Slurm cluster if it is not up and stops it again after.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import local_startup  # noqa: E402  (the local runs, as that benchmark measures them)

ROLE = "arn:aws:iam::111122223333:role/Bench"


def slurm_startup(workdir: Path, index: int) -> tuple[float, float]:
    import shoal

    code = workdir / "code"
    code.mkdir(exist_ok=True)
    (code / "first_line.py").write_text(local_startup.SCRIPT)
    shared = workdir / "shared"
    session = shoal.Session(backend="slurm", slurm={"shared_dir": str(shared)})
    estimator = shoal.PyTorch(
        entry_point="first_line.py", source_dir=str(code), role=ROLE,
        instance_type="ml.m5.xlarge", instance_count=2, framework_version="1.13.1",
        py_version="py39", sagemaker_session=session,
        distribution={"mpi": {"enabled": True, "processes_per_host": 2}})
    began = time.time()
    estimator.fit(wait=False, job_name=f"slurm-startup-{os.getpid()}-{index}")
    estimator.latest_training_job.wait(logs="None")
    job_dir = shared / estimator.latest_training_job.name
    starts = sorted(float(p.read_text()) for p in job_dir.glob("algo-*/model/start-*"))
    assert len(starts) == 4, starts
    return starts[0] - began, starts[-1] - began


def allreduce_request(name: str, instance_type: str, sizes: str, rounds: str, out: Path) -> dict:
    return {
        "TrainingJobName": name, "RoleArn": ROLE,
        "AlgorithmSpecification": {"TrainingImage": "local", "TrainingInputMode": "File"},
        "HyperParameters": {
            "sagemaker_program": json.dumps("allreduce.py"),
            "sagemaker_submit_directory": json.dumps(HERE.as_uri()),
            "sagemaker_mpi_enabled": "true", "sagemaker_mpi_num_of_processes_per_host": "2",
            "sizes": json.dumps(sizes), "rounds": json.dumps(rounds)},
        "OutputDataConfig": {"S3OutputPath": out.as_uri()},
        "ResourceConfig": {"InstanceType": instance_type, "InstanceCount": 2,
                           "VolumeSizeInGB": 30},
        "StoppingCondition": {"MaxRuntimeInSeconds": 3600},
    }


def table_of(job) -> dict[str, float]:
    """Rank 0's allreduce table: size -> Shoal's bus bandwidth (GB/s)."""
    log = job.paths.log_file.read_text()
    rows = [line.split("<stdout>:", 1)[1] for line in log.splitlines()
            if line.startswith("[1,mpirank:0,") and "<stdout>:" in line]
    out = {}
    for row in rows:
        cells = [c.strip() for c in row.split("|")]
        if len(cells) > 2 and re.fullmatch(r"[\d.]+\s*[KMG]?i?B", cells[0]):
            out[cells[0]] = float(cells[1].split()[1])
    if not out:
        raise SystemExit(f"no allreduce table in {job.paths.log_file}:\n{log[-3000:]}")
    return out


def allreduce(tmp: Path, sizes: str, rounds: str) -> tuple[dict, dict]:
    from shoal.backends.local import LocalBackend
    from shoal.backends.slurm import SlurmBackend
    from shoal.slurm.settings import SlurmSettings

    os.environ["SHOAL_LOCAL_NETWORK"] = "namespaces"
    os.environ.pop("SHOAL_LOCAL_LINK", None)
    local = LocalBackend(root=tmp / "jobs").submit(
        allreduce_request("ar-local", "local", sizes, rounds, tmp / "out-local"))
    local.wait(logs=None)
    slurm = SlurmBackend(settings=SlurmSettings(shared_dir=tmp / "shared")).submit(
        allreduce_request("ar-slurm", "ml.m5.xlarge", sizes, rounds, tmp / "out-slurm"))
    slurm.wait(logs=None)
    return table_of(local), table_of(slurm)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--sizes", default="1M,16M,64M")
    parser.add_argument("--rounds", default="5")
    args = parser.parse_args(argv)
    from shoal.slurm import devcluster

    was_up = devcluster.healthy(devcluster.plan(2))
    devcluster.up(2, say=lambda *_: None)
    try:
        with tempfile.TemporaryDirectory(prefix="shoal-slurm-bench-") as tmp:
            tmp = Path(tmp)
            os.environ["SHOAL_LOCAL_ROOT"] = str(tmp / "jobs")
            startup = {"slurm": [slurm_startup(tmp, i) for i in range(args.runs)]}
            for network in ("namespaces", "loopback"):
                startup[f"local {network}"] = [local_startup.one_run(tmp, i, 2, network)
                                               for i in range(args.runs)]
            local_bw, slurm_bw = allreduce(tmp, args.sizes, args.rounds)
    finally:
        if not was_up:
            devcluster.down(say=lambda *_: None)
    print(f"startup: fit() -> the script's first line, 2 hosts x 2 ranks, median of "
          f"{args.runs} runs, {os.cpu_count()} cores")
    print(f"{'backend':>16} | {'first rank s':>12} | {'last rank s':>11} | {'x slurm':>7}")
    slurm_last = statistics.median(r[1] for r in startup["slurm"])
    for name, runs in startup.items():
        last = statistics.median(r[1] for r in runs)
        print(f"{name:>16} | {statistics.median(r[0] for r in runs):12.2f} | {last:11.2f} | "
              f"{last / slurm_last:7.2f}")
    print("\nallreduce across 2 hosts x 2 ranks, unshaped veth: Shoal's bus bandwidth (GB/s)")
    print(f"{'size':>10} | {'local ns':>8} | {'slurm':>8} | {'slurm/local':>11}")
    worst = 0.0
    for size, local in local_bw.items():
        ratio = slurm_bw[size] / local
        worst = max(worst, abs(1 - ratio))
        print(f"{size:>10} | {local:8.2f} | {slurm_bw[size]:8.2f} | {ratio:11.3f}")
    print(f"largest difference {100 * worst:.1f} % (goal: within 5 %)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
