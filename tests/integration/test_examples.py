"""Every example runs in local mode with 1 and 2 hosts through the estimator, and leaves a
model archive with the trained model; the demo runs as ``make demo`` does."""

import json
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
import pytest
import shoal
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

pytestmark = [pytest.mark.mpi, pytest.mark.runtime, pytest.mark.slow]
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
SMDDP = {"smdistributed": {"dataparallel": {"enabled": True}}}

CASES = {
    "pytorch": (shoal.PyTorch, "pytorch", "train_digits.py", "1.13.1", "model.pt"),
    "smdistributed_pytorch": (shoal.PyTorch, "smdistributed_pytorch", "train.py", "1.13.1",
                              "model.pt"),
    "tensorflow": (shoal.TensorFlow, "tensorflow", "train.py", "2.10.1", "model.weights.h5"),
}


@pytest.fixture(scope="module")
def digits(tmp_path_factory):
    directory = tmp_path_factory.mktemp("digits")
    x, y = load_digits(return_X_y=True)
    x_train, x_test, y_train, y_test = train_test_split(
        x / 16.0, y, test_size=0.2, random_state=0, stratify=y)
    np.savez(directory / "digits.npz", x_train=x_train, y_train=y_train, x_test=x_test,
             y_test=y_test)
    return directory


@pytest.mark.parametrize("hosts", [1, 2])
@pytest.mark.parametrize("name", list(CASES))
def test_example_runs_locally(name, hosts, digits, tmp_path, monkeypatch):
    if name == "tensorflow":
        pytest.importorskip("tensorflow")
    monkeypatch.setenv("SHOAL_LOCAL_ROOT", str(tmp_path / "jobs"))
    cls, directory, entry, version, artifact = CASES[name]
    estimator = cls(
        entry_point=entry, source_dir=str(EXAMPLES / directory),
        role="arn:aws:iam::111122223333:role/Examples", instance_type="local",
        instance_count=hosts, framework_version=version, py_version="py39", distribution=SMDDP,
        hyperparameters={"epochs": 6, "sagemaker_mpi_num_of_processes_per_host": 2 if hosts == 1 else 1},
        output_path=(tmp_path / "out").as_uri())
    job_name = f"example-{name.replace('_', '-')}-{hosts}"
    estimator.fit({"train": digits.as_uri()}, job_name=job_name)
    with tarfile.open(tmp_path / "out" / job_name / "output" / "model.tar.gz") as tar:
        names = tar.getnames()
        assert artifact in names
        if "metrics.json" in names:
            metrics = json.load(tar.extractfile("metrics.json"))
            assert metrics["accuracy"] >= 0.9
    log = (tmp_path / "jobs" / estimator.latest_training_job.name / "logs.txt").read_text()
    assert "world size 2" in log  # two ranks took part


def test_demo_trains_to_095_on_2_hosts_x_2_processes(tmp_path):
    env = {"SHOAL_DEMO_DIR": str(tmp_path), "SHOAL_LOCAL_ROOT": str(tmp_path / "jobs"),
           "PATH": str(Path(sys.executable).parent) + ":/usr/bin:/bin"}
    result = subprocess.run([sys.executable, str(EXAMPLES / "demo" / "run_demo.py")], env=env,
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    accuracy = float(result.stdout.split("held-out accuracy:")[1].split()[0])
    assert accuracy >= 0.95
    job = result.stdout.split("job:")[1].split()[0]
    assert job.startswith("shoal-demo-")
    assert f"model.tar.gz:       {tmp_path / 'output' / job / 'output' / 'model.tar.gz'}" \
        in result.stdout
    assert "throughput" in result.stdout + result.stderr
    # fit()'s closing summary: the metrics its definitions read from the log
    closing = [line for line in result.stdout.splitlines() if line.startswith("Final metrics: ")]
    assert len(closing) == 1 and f"accuracy={accuracy:g} (at " in closing[0], closing
    for rank in range(4):
        assert f"mpirank:{rank}," in result.stdout + result.stderr


# the SMP v1 example's pipeline 2 x data parallel 2 on 2 hosts x 2 processes (also run on Slurm)
PIPELINE_BY_DATA = {"smdistributed": {"modelparallel": {"enabled": True, "parameters": {
    "partitions": 2, "microbatches": 4, "ddp": True}}},
    "mpi": {"enabled": True, "processes_per_host": 2}}


def check_pipeline_by_data_archive(archive) -> None:
    """The loss fell well below guessing's and the archive holds one file per partition."""
    with tarfile.open(archive) as tar:
        names = set(tar.getnames())
        metrics = json.load(tar.extractfile("metrics.json"))
    assert {"model.pt_0_0.pt", "model.pt_1_0.pt"} <= names, names
    assert metrics["pp"] == 2 and metrics["dp"] == 2 and metrics["tp"] == 1
    assert metrics["loss"] < 2.0, metrics  # guessing: log(64) = 4.16


@pytest.mark.torch
def test_model_parallel_example_pipeline_2_by_data_parallel_2_on_2_hosts(tmp_path, monkeypatch):
    """The SMP v1 example through the estimator, as SageMaker runs it: mpirun over 2 hosts x 2
    processes, pipeline 2 x data parallel 2; the loss falls well below guessing's and the
    archive holds one file per partition."""
    monkeypatch.setenv("SHOAL_LOCAL_ROOT", str(tmp_path / "jobs"))
    estimator = shoal.PyTorch(
        entry_point="train_lm.py", source_dir=str(EXAMPLES / "smdistributed_modelparallel"),
        role="arn:aws:iam::111122223333:role/Examples", instance_type="local",
        instance_count=2, framework_version="1.13.1", py_version="py39",
        distribution=PIPELINE_BY_DATA, hyperparameters={"steps": 60},
        output_path=(tmp_path / "out").as_uri())
    estimator.fit(job_name="example-modelparallel")
    check_pipeline_by_data_archive(
        tmp_path / "out" / "example-modelparallel" / "output" / "model.tar.gz")


@pytest.mark.torch
def test_model_parallel_example_tensor_2_by_pipeline_2_job_file(tmp_path, monkeypatch):
    """The same example's tensor-parallel job file through ``shoal run``: tensor 2 x pipeline 2
    on 2 hosts x 2 processes; the MLPs' linear layers and the position embedding are
    distributed, the loss falls well below guessing's and the archive holds one file per
    (pipeline, tensor) partition."""
    monkeypatch.setenv("SHOAL_LOCAL_ROOT", str(tmp_path / "jobs"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    monkeypatch.delenv("SHOAL_CONFIG", raising=False)
    job = EXAMPLES / "smdistributed_modelparallel" / "job_tensor_parallel.yaml"
    shoal_cli = Path(sys.executable).with_name("shoal")
    done = subprocess.run([str(shoal_cli), "run", str(job), "--job-name", "example-tp",
                           "--output-path", (tmp_path / "out").as_uri()],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    log = (tmp_path / "jobs" / "example-tp" / "logs.txt").read_text()
    assert "pipeline 2 x tensor 2 x data parallel 1 (2 data-parallel ranks)" in log, log[-3000:]
    assert "tensor parallel: 9 modules distributed (DistributedEmbedding, DistributedLinear)" in log, log[-3000:]
    with tarfile.open(tmp_path / "out" / "example-tp" / "output" / "model.tar.gz") as tar:
        names = set(tar.getnames())
        metrics = json.load(tar.extractfile("metrics.json"))
    assert {f"model.pt_{pp}_{tp}.pt" for pp in (0, 1) for tp in (0, 1)} <= names, names
    assert (metrics["pp"], metrics["tp"], metrics["dp"]) == (2, 2, 2), metrics
    assert metrics["loss"] < 2.0, metrics  # guessing: log(64) = 4.16


@pytest.mark.torch
def test_model_parallel_example_sharded_data_parallel_job_file(tmp_path, monkeypatch):
    """The example's sharded-data-parallel job file through ``shoal run``: sharding groups of
    2 on 2 hosts x 2 processes; each rank holds about half of the parameters, the loss falls
    well below guessing's and the archive holds the whole model and a file per shard."""
    monkeypatch.setenv("SHOAL_LOCAL_ROOT", str(tmp_path / "jobs"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    monkeypatch.delenv("SHOAL_CONFIG", raising=False)
    job = EXAMPLES / "smdistributed_modelparallel" / "job_sharded_data_parallel.yaml"
    shoal_cli = Path(sys.executable).with_name("shoal")
    done = subprocess.run([str(shoal_cli), "run", str(job), "--job-name", "example-sdp",
                           "--output-path", (tmp_path / "out").as_uri()],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    log = (tmp_path / "jobs" / "example-sdp" / "logs.txt").read_text()
    held, whole = map(int, log.split("sharded data parallel: degree 2, this rank holds ")[1]
                      .split(" parameter elements")[0].split(" of "))
    assert whole > 0 and held <= 0.55 * whole, (held, whole)
    with tarfile.open(tmp_path / "out" / "example-sdp" / "output" / "model.tar.gz") as tar:
        names = set(tar.getnames())
        metrics = json.load(tar.extractfile("metrics.json"))
    assert {"model_full.pt", "final_partial/model_0.pt", "final_partial/model_1.pt",
            "final_partial/optimizer_0.pt", "final_partial/optimizer_1.pt"} <= names, names
    assert (metrics["sdp"], metrics["dp"]) == (2, 4), metrics
    assert metrics["loss"] < 2.0, metrics  # guessing: log(64) = 4.16


@pytest.mark.torch
def test_an_smp_script_in_the_style_of_the_mnist_example_runs_on_2_hosts(digits, tmp_path,
                                                                          monkeypatch):
    """SageMaker's MNIST model-parallel example's structure, CUDA lines aside, through the
    estimator with its notebook's parameters: 2 partitions, 4 microbatches, ddp, interleaved,
    spread placement; mpirun over 2 hosts x 2 processes."""
    monkeypatch.setenv("SHOAL_LOCAL_ROOT", str(tmp_path / "jobs"))
    scripts = Path(__file__).resolve().parent / "smp_scripts"
    estimator = shoal.PyTorch(
        entry_point="smp_mnist_style.py", source_dir=str(scripts),
        role="arn:aws:iam::111122223333:role/Examples", instance_type="local",
        instance_count=2, framework_version="1.13.1", py_version="py39",
        distribution={"smdistributed": {"modelparallel": {"enabled": True, "parameters": {
            "microbatches": 4, "placement_strategy": "spread", "pipeline": "interleaved",
            "optimize": "speed", "partitions": 2, "ddp": True}}},
            "mpi": {"enabled": True, "processes_per_host": 2}},
        hyperparameters={"epochs": 4}, output_path=(tmp_path / "out").as_uri())
    estimator.fit({"train": digits.as_uri()}, job_name="smp-mnist-style")
    log = (tmp_path / "jobs" / "smp-mnist-style" / "logs.txt").read_text()
    accuracy = float(log.split("final accuracy ")[1].split()[0])
    assert accuracy >= 0.9, log[-3000:]
    with tarfile.open(tmp_path / "out" / "smp-mnist-style" / "output" / "model.tar.gz") as tar:
        names = set(tar.getnames())
    assert {"model_checkpoint.pt_0_0.pt", "model_checkpoint.pt_1_0.pt"} <= names, names
