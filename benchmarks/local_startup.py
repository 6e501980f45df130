"""Local-mode startup: the time from ``fit()`` to the first line of the user's script.

A job of N hosts x 2 ranks (MPI runner) whose script records ``time.time()`` as its very first
statement; the figure is measured from just before ``fit()`` to the first and to the last
rank. Target for 2 simulated hosts: at most 3 s on a 2-core machine. With ``--networks
loopback,namespaces`` the same jobs also run with hosts in network namespaces of their own
(sshd per host, mpirun over SSH), printed beside the loopback mode.

    .venv/bin/python benchmarks/local_startup.py [--runs 3] [--hosts 2,4] [--networks loopback]
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


def one_run(workdir: Path, index: int, hosts: int = 2, network: str = "loopback"
            ) -> tuple[float, float]:
    os.environ["SHOAL_LOCAL_NETWORK"] = network
    code = workdir / "code"
    code.mkdir(exist_ok=True)
    (code / "first_line.py").write_text(SCRIPT)
    estimator = shoal.PyTorch(
        entry_point="first_line.py", source_dir=str(code),
        role="arn:aws:iam::111122223333:role/Bench", instance_type="local", instance_count=hosts,
        framework_version="1.13.1", py_version="py39",
        distribution={"mpi": {"enabled": True, "processes_per_host": 2}},
        output_path=(workdir / f"out-{network}-{hosts}-{index}").as_uri())
    began = time.time()
    estimator.fit(wait=False, job_name=f"startup-{network[:2]}{hosts}-{os.getpid()}-{index}")
    estimator.latest_training_job.wait(logs="None")
    archive = Path(estimator.model_data.removeprefix("file://"))
    with tarfile.open(archive) as tar:
        starts = [float(tar.extractfile(m).read()) for m in tar.getmembers() if m.isfile()]
    # every host's model directory (the archive may hold the master's only)
    job_dir = workdir / "jobs" / estimator.latest_training_job.name
    starts = sorted({*starts, *(float(p.read_text()) for p in job_dir.glob("algo-*/model/start-*"))})
    assert len(starts) == 2 * hosts, starts
    return min(starts) - began, max(starts) - began


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--hosts", default="2")
    parser.add_argument("--networks", default="loopback")
    args = parser.parse_args()
    results = {}
    with tempfile.TemporaryDirectory(prefix="shoal-startup-") as tmp:
        os.environ["SHOAL_LOCAL_ROOT"] = str(Path(tmp) / "jobs")
        for network in args.networks.split(","):
            for hosts in (int(h) for h in args.hosts.split(",")):
                results[(network, hosts)] = [one_run(Path(tmp), i, hosts, network)
                                             for i in range(args.runs)]
    print("local startup: fit() -> the script's first line, N hosts x 2 ranks, "
          f"median of {args.runs} runs")
    print(f"{'network':>10} | {'hosts':>5} | {'first rank s':>12} | {'last rank s':>11}")
    for (network, hosts), runs in results.items():
        print(f"{network:>10} | {hosts:5d} | {statistics.median(r[0] for r in runs):12.2f} | "
              f"{statistics.median(r[1] for r in runs):11.2f}")
    loop = results.get(("loopback", 2))
    if loop:
        last = statistics.median(r[1] for r in loop)
        print(f"2 loopback hosts: last rank {last:.2f} s (target <= 3.0 s, ratio to target "
              f"{last / 3.0:.2f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
