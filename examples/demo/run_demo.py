"""Shoal's demo: a real data-parallel training job, 2 hosts x 2 processes, on this machine.

The job is the one you would submit to SageMaker: the same estimator call, the same request,
the same script (``examples/pytorch/train_digits.py``, the ``torch.distributed`` API on Shoal's
``shoal`` backend). ``instance_type="local"`` runs it as two simulated hosts (``algo-1``,
``algo-2``), each with its own ``/opt/ml`` tree, and mpirun spanning them.

Processes per host: with GPUs the launcher starts one process per GPU; this machine has none,
so the job asks for two with the launcher's hyperparameter
``sagemaker_mpi_num_of_processes_per_host`` (the same key works on SageMaker).

The data set is scikit-learn's 8x8 digits (bundled with scikit-learn, nothing is downloaded),
split here into train and held-out sets and handed to the job as its ``train`` channel.
"""

import json
import os
import sys
import tarfile
import time
from pathlib import Path

import numpy as np
import shoal
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

HERE = Path(__file__).resolve().parent
CODE = HERE.parent / "pytorch"
MIN_ACCURACY = 0.95


def write_dataset(directory: Path) -> Path:
    x, y = load_digits(return_X_y=True)
    x_train, x_test, y_train, y_test = train_test_split(
        x / 16.0, y, test_size=0.2, random_state=0, stratify=y)
    directory.mkdir(parents=True, exist_ok=True)
    np.savez(directory / "digits.npz", x_train=x_train, y_train=y_train, x_test=x_test,
             y_test=y_test)
    return directory


def main(workdir: Path) -> int:
    data = write_dataset(workdir / "data")
    estimator = shoal.PyTorch(
        entry_point="train_digits.py",
        source_dir=str(CODE),
        role="arn:aws:iam::111122223333:role/ShoalDemo",
        instance_type="local",
        instance_count=2,
        framework_version="1.13.1",
        py_version="py39",
        distribution={"smdistributed": {"dataparallel": {"enabled": True}}},
        hyperparameters={"epochs": 12, "sagemaker_mpi_num_of_processes_per_host": 2},
        output_path=(workdir / "output").as_uri(),
        base_job_name="shoal-demo",
        # read from the log as on SageMaker: the job's final values close fit()'s output
        metric_definitions=[{"Name": "loss", "Regex": r"loss ([0-9.]+)"},
                            {"Name": "accuracy", "Regex": r"held-out accuracy ([0-9.]+)"}],
    )
    start = time.perf_counter()
    estimator.fit({"train": data.as_uri()})
    elapsed = time.perf_counter() - start

    archive = Path(estimator.model_data.removeprefix("file://"))
    with tarfile.open(archive) as tar:
        metrics = json.load(tar.extractfile("metrics.json"))
    print()
    print(f"job:                {estimator.latest_training_job.name} (2 hosts x 2 processes)")
    print(f"held-out accuracy:  {metrics['accuracy']:.4f}")
    print(f"model.tar.gz:       {archive}")
    print(f"wall time:          {elapsed:.1f} s")
    if metrics["accuracy"] < MIN_ACCURACY:
        print(f"accuracy below {MIN_ACCURACY}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    # The data and every run's output/<job>/output/model.tar.gz stay here, so the printed
    # path can be opened afterwards.
    default = Path.home() / ".shoal" / "demo"
    sys.exit(main(Path(os.environ.get("SHOAL_DEMO_DIR") or default)))
