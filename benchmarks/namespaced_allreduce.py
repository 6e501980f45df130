"""The allreduce benchmark (``allreduce.py``: Shoal against gloo and Open MPI, same run) across
hosts in network namespaces of their own, over an emulated link: a local job of 2 hosts x 2
ranks with ``SHOAL_LOCAL_NETWORK=namespaces``, the master's mpirun starting the second
host's ranks over SSH, every byte between the hosts through the hosts' eth0 and the link.

    .venv/bin/python benchmarks/namespaced_allreduce.py [--link rate=10gbit] [--sizes 1M,16M,64M]

Needs root and ``ip netns``. A delay (``delay=50us``) needs the kernel's netem qdisc; where
the kernel has none the run says so and stops.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--link", default="rate=10gbit")
    parser.add_argument("--sizes", default="1M,16M,64M")
    parser.add_argument("--rounds", default="3")
    parser.add_argument("--hosts", type=int, default=2)
    parser.add_argument("--ranks-per-host", type=int, default=2)
    args = parser.parse_args(argv)
    os.environ["SHOAL_LOCAL_NETWORK"] = "namespaces"
    os.environ["SHOAL_LOCAL_LINK"] = args.link
    from shoal.backends.local import LocalBackend

    with tempfile.TemporaryDirectory(prefix="shoal-ns-bench-") as tmp:
        request = {
            "TrainingJobName": "namespaced-allreduce",
            "RoleArn": "arn:aws:iam::111122223333:role/R",
            "AlgorithmSpecification": {"TrainingImage": "local", "TrainingInputMode": "File"},
            "HyperParameters": {
                "sagemaker_program": json.dumps("allreduce.py"),
                "sagemaker_submit_directory": json.dumps(HERE.as_uri()),
                "sagemaker_mpi_enabled": "true",
                "sagemaker_mpi_num_of_processes_per_host": str(args.ranks_per_host),
                "sizes": json.dumps(args.sizes), "rounds": json.dumps(args.rounds)},
            "OutputDataConfig": {"S3OutputPath": Path(tmp, "out").as_uri()},
            "ResourceConfig": {"InstanceType": "local", "InstanceCount": args.hosts,
                               "VolumeSizeInGB": 30},
            "StoppingCondition": {"MaxRuntimeInSeconds": 3600},
        }
        job = LocalBackend(root=Path(tmp, "jobs")).submit(request)
        try:
            job.wait(logs=None)
        finally:
            log = job.paths.log_file.read_text()
        rows = [line.split("<stdout>:", 1)[1] for line in log.splitlines()
                if line.startswith("[1,mpirank:0,") and "<stdout>:" in line]
        print(f"allreduce across {args.hosts} namespaced hosts x {args.ranks_per_host} ranks, "
              f"link {args.link}, {os.cpu_count()} cores")
        print("\n".join(rows) if rows else log[-4000:])
    return 0


if __name__ == "__main__":
    sys.exit(main())
