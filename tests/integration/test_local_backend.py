"""Local mode end to end, from a hand-written CreateTrainingJob request: real processes,
the real launcher and mpirun spanning simulated hosts, file:// and s3:// (moto server) data."""

import json
import os
import tarfile
import textwrap
import time

import boto3
import psutil
import pytest
from shoal.backends.local import LocalBackend, LocalTrainingJob
from shoal.errors import JobFailedError, JobNameInUseError, JobStoppedError

pytestmark = [pytest.mark.mpi, pytest.mark.slow]

RANK_SCRIPT = """
import json, os, sys
sys.stdout.write("script started\\n")
sys.stdout.flush()
out = os.environ["SM_MODEL_DIR"]
info = {k: os.environ.get(k) for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
                                       "SHOAL_HOST", "SM_CURRENT_HOST")}
info["channel"] = sorted(os.listdir(os.environ["SM_CHANNEL_TRAIN"]))
with open(os.path.join(out, "rank-%s.json" % os.environ["RANK"]), "w") as f:
    json.dump(info, f)
ckpt = os.path.join(os.environ["SAGEMAKER_BASE_DIR"], "checkpoints")
if os.path.isdir(ckpt):
    seen = ",".join(sorted(os.listdir(ckpt)))
    with open(os.path.join(ckpt, "step-%s.txt" % os.environ["RANK"]), "w") as f:
        f.write("seen:" + seen)
if os.environ.get("FAIL_RANK") == os.environ["RANK"]:
    raise ZeroDivisionError("rank %s divided by zero" % os.environ["RANK"])
if os.environ.get("SLEEP"):
    import time
    time.sleep(float(os.environ["SLEEP"]))
"""


def request(tmp_path, name, hosts=2, per_host=2, env=None, inputs=None, output=None, extra=None):
    code = tmp_path / "code"
    code.mkdir(exist_ok=True)
    (code / "train.py").write_text(textwrap.dedent(RANK_SCRIPT))
    data = tmp_path / "data"
    data.mkdir(exist_ok=True)
    (data / "part-0.csv").write_text("1,2\n")
    hps = {
        "sagemaker_program": "train.py",
        "sagemaker_submit_directory": code.as_uri(),
        "sagemaker_distributed_dataparallel_enabled": True,
        "sagemaker_mpi_num_of_processes_per_host": per_host,
        "sagemaker_job_name": name,
    }
    return {
        "TrainingJobName": name,
        "AlgorithmSpecification": {"TrainingImage": "shoal-pytorch-training:1.13.1-cpu-py39",
                                   "TrainingInputMode": "File"},
        "RoleArn": "arn:aws:iam::111122223333:role/R",
        "HyperParameters": {k: json.dumps(v) for k, v in hps.items()},
        "InputDataConfig": [{"ChannelName": "train", "DataSource": {"S3DataSource": {
            "S3DataType": "S3Prefix", "S3Uri": inputs or data.as_uri(),
            "S3DataDistributionType": "FullyReplicated"}}}],
        "OutputDataConfig": {"S3OutputPath": output or (tmp_path / "out").as_uri()},
        "ResourceConfig": {"InstanceType": "local", "InstanceCount": hosts, "VolumeSizeInGB": 30},
        "StoppingCondition": {"MaxRuntimeInSeconds": 300},
        "Environment": env or {},
        **(extra or {}),
    }


@pytest.fixture
def root(tmp_path, monkeypatch):
    monkeypatch.setenv("SHOAL_LOCAL_ROOT", str(tmp_path / "jobs"))
    return tmp_path / "jobs"


def job_processes(job_dir):
    """Live processes that belong to the job (its tree carries the job dir in argv or env)."""
    found = []
    for proc in psutil.process_iter(["cmdline", "environ"]):
        try:
            text = " ".join(proc.info["cmdline"] or []) + json.dumps(proc.info["environ"] or {})
        except psutil.Error:
            continue
        if str(job_dir) in text and proc.pid != os.getpid():
            found.append(proc)
    return [p for p in found if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]


def members(archive):
    with tarfile.open(archive) as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}


@pytest.mark.parametrize("hosts", [1, 2])
def test_job_completes_with_every_rank_and_the_model_archive(tmp_path, root, capsys, hosts):
    job = LocalBackend(root=root).submit(request(tmp_path, f"ok-{hosts}", hosts=hosts))
    description = job.wait()
    assert description["TrainingJobStatus"] == "Completed"
    assert [t["Status"] for t in description["SecondaryStatusTransitions"]] == [
        "Starting", "Downloading", "Training", "Uploading", "Completed"]
    artifacts = tmp_path / "out" / f"ok-{hosts}" / "output"
    assert job.model_data == (artifacts / "model.tar.gz").as_uri()
    files = members(artifacts / "model.tar.gz")
    ranks = [json.loads(files[f"rank-{r}.json"]) for r in range(2 * hosts)]
    assert {r["WORLD_SIZE"] for r in ranks} == {str(2 * hosts)}
    assert sorted((r["SHOAL_HOST"], r["LOCAL_RANK"]) for r in ranks) == sorted(
        (f"algo-{h}", str(lr)) for h in range(1, hosts + 1) for lr in range(2))
    assert all(r["channel"] == ["part-0.csv"] for r in ranks)
    assert (artifacts / "output.tar.gz").exists()
    config = json.loads((root / f"ok-{hosts}/algo-1/input/config/resourceconfig.json").read_text())
    assert config["hosts"] == [f"algo-{h}" for h in range(1, hosts + 1)]
    log = (root / f"ok-{hosts}" / "logs.txt").read_text()
    assert "script started" in log
    # Interleaved hosts stay readable: every launcher line and every other host line names its host.
    launcher = [ln for ln in log.splitlines() if " shoal.launcher" in ln]
    assert {ln.split("]")[0] + "]" for ln in launcher} == {f"[algo-{h}]" for h in range(1, hosts + 1)}
    host_lines = [ln for ln in log.splitlines() if not ln.startswith("[local] ")]
    assert host_lines and all(ln.startswith("[algo-") or ",mpirank:" in ln[:30] for ln in host_lines)
    assert not job_processes(root / f"ok-{hosts}")
    # Another process (here: a fresh handle) sees the same record.
    assert LocalTrainingJob.attach(f"ok-{hosts}", root).describe()["TrainingJobStatus"] == "Completed"


def test_attach_to_a_local_job_restores_its_estimator(tmp_path, root, capsys):
    import shoal
    from shoal.pytorch import PyTorch

    # The channel as fit() writes a file:// input in local mode.
    channel = {"ChannelName": "train", "DataSource": {"FileDataSource": {
        "FileDataDistributionType": "FullyReplicated", "FileUri": (tmp_path / "data").as_uri()}}}
    job = LocalBackend(root=root).submit(
        request(tmp_path, "again", hosts=1, extra={"InputDataConfig": [channel]}))
    job.wait(logs="None")
    est = shoal.attach("local://again", wait=True, logs=False)
    assert type(est) is PyTorch and est.framework_version == "1.13.1"
    assert est.instance_type == "local" and est.instance_count == 1
    assert est.distribution == {"smdistributed": {"dataparallel": {"enabled": True}}}
    assert est.entry_point == "train.py"
    assert set(est.inputs) == {"train"}
    assert isinstance(est.latest_training_job, LocalTrainingJob)
    assert est.latest_training_job.describe()["TrainingJobStatus"] == "Completed"
    assert est.model_data == (tmp_path / "out" / "again" / "output" / "model.tar.gz").as_uri()


def test_failing_rank_fails_the_job_with_its_root_cause(tmp_path, root, capsys):
    job = LocalBackend(root=root).submit(request(tmp_path, "bad", env={"FAIL_RANK": "1"}))
    with pytest.raises(JobFailedError) as error:
        job.wait()
    assert error.value.job_name == "bad"
    assert "ZeroDivisionError" in error.value.reason
    assert job.describe()["FailureReason"] == error.value.reason
    assert not job_processes(root / "bad")


def test_stop_ends_the_whole_process_tree(tmp_path, root, capsys):
    job = LocalBackend(root=root).submit(request(tmp_path, "slow", env={"SLEEP": "120"}))
    deadline = time.monotonic() + 60
    while "script started" not in job.paths.log_file.read_text():
        assert time.monotonic() < deadline, job.paths.log_file.read_text()
        time.sleep(0.2)
    assert job_processes(root / "slow")
    job.stop(wait=True)
    with pytest.raises(JobStoppedError):
        job.wait(logs=None)
    assert job.describe()["SecondaryStatus"] == "Stopped"
    assert not job_processes(root / "slow")


def test_every_job_keeps_its_own_artifacts_whatever_its_end(tmp_path, root, capsys):
    """A failed and a stopped job after a completed one, all with one output path: each
    writes into its own folder, and the completed job's model stays what it points to."""
    backend, out = LocalBackend(root=root), tmp_path / "out"
    first = backend.submit(request(tmp_path, "first", hosts=1))
    first.wait(logs="None")
    model = out / "first" / "output" / "model.tar.gz"
    assert first.model_data == model.as_uri()
    saved = model.read_bytes()
    assert sorted(members(model)) == ["rank-0.json", "rank-1.json"]

    failed = backend.submit(request(tmp_path, "failed", hosts=1, env={"FAIL_RANK": "1"}))
    with pytest.raises(JobFailedError):
        failed.wait(logs="None")
    stopped = backend.submit(request(tmp_path, "stopped", hosts=1, env={"SLEEP": "120"}))
    deadline = time.monotonic() + 60
    while not (stopped.paths.model_dir("algo-1") / "rank-0.json").exists():
        assert time.monotonic() < deadline, stopped.paths.log_file.read_text()
        time.sleep(0.2)
    stopped.stop(wait=True)
    with pytest.raises(JobStoppedError):
        stopped.wait(logs="None")

    # As on SageMaker, a failed or stopped job keeps what its ranks saved: in its own folder.
    for job, saved_by in ((failed, "rank-1.json"), (stopped, "rank-0.json")):
        own = out / job.name / "output"
        assert job.model_data == (own / "model.tar.gz").as_uri()
        assert saved_by in members(own / "model.tar.gz")
        assert (own / "output.tar.gz").exists()
    assert sorted(p.name for p in out.iterdir()) == ["failed", "first", "stopped"]
    assert model.read_bytes() == saved
    assert first.describe()["ModelArtifacts"]["S3ModelArtifacts"] == model.as_uri()

    # A taken name, in any case, is refused before anything is written.
    record = first.paths.state_file.read_bytes()
    for name in ("first", "FIRST"):
        with pytest.raises(JobNameInUseError):
            backend.submit(request(tmp_path, name, hosts=1))
    assert sorted(p.name for p in root.iterdir()) == ["failed", "first", "stopped"]
    assert sorted(p.name for p in out.iterdir()) == ["failed", "first", "stopped"]
    assert first.paths.state_file.read_bytes() == record
    assert model.read_bytes() == saved


def test_a_job_out_of_time_keeps_its_artifacts_in_its_own_folder(tmp_path, root, capsys):
    req = request(tmp_path, "late", hosts=1, per_host=1, env={"SLEEP": "120"})
    req["StoppingCondition"]["MaxRuntimeInSeconds"] = 5
    job = LocalBackend(root=root).submit(req)
    with pytest.raises(JobStoppedError):
        job.wait(logs="None")
    assert job.describe()["SecondaryStatus"] == "MaxRuntimeExceeded"
    own = tmp_path / "out" / "late" / "output"
    assert job.model_data == (own / "model.tar.gz").as_uri()
    assert (own / "output.tar.gz").exists()


@pytest.fixture
def s3_server(monkeypatch):
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0)
    server.start()
    host, port = server.get_host_and_port()
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", f"http://{host}:{port}")
    from shoal.local import storage

    monkeypatch.setattr(storage, "_s3_client", None)
    yield boto3.client("s3", endpoint_url=f"http://{host}:{port}", region_name="us-west-2")
    server.stop()


def test_s3_inputs_outputs_and_checkpoints_through_a_local_s3_server(tmp_path, root, s3_server,
                                                                     capsys):
    s3 = s3_server
    s3.create_bucket(Bucket="data-bkt", CreateBucketConfiguration={"LocationConstraint": "us-west-2"})
    s3.put_object(Bucket="data-bkt", Key="train/a.csv", Body=b"1\n")
    s3.put_object(Bucket="data-bkt", Key="train/sub/b.csv", Body=b"2\n")
    s3.put_object(Bucket="data-bkt", Key="ckpt/step-0.txt", Body=b"old")
    req = request(tmp_path, "s3-job", hosts=2, per_host=1, inputs="s3://data-bkt/train",
                  output="s3://data-bkt/out",
                  extra={"CheckpointConfig": {"S3Uri": "s3://data-bkt/ckpt"}})
    job = LocalBackend(root=root).submit(req)
    job.wait()
    assert job.model_data == "s3://data-bkt/out/s3-job/output/model.tar.gz"
    archive = tmp_path / "model.tar.gz"
    s3.download_file("data-bkt", "out/s3-job/output/model.tar.gz", str(archive))
    ranks = [json.loads(v) for k, v in members(archive).items() if k.startswith("rank-")]
    assert [r["channel"] for r in ranks] == [["a.csv", "sub"], ["a.csv", "sub"]]
    s3.head_object(Bucket="data-bkt", Key="out/s3-job/output/output.tar.gz")
    # Restored at the start (every host saw step-0.txt), saved at the end.
    saved = s3.get_object(Bucket="data-bkt", Key="ckpt/step-1.txt")["Body"].read().decode()
    assert saved == "seen:step-0.txt"


def test_code_from_a_staged_tarball_in_s3(tmp_path, root, s3_server, capsys):
    s3 = s3_server
    s3.create_bucket(Bucket="code-bkt", CreateBucketConfiguration={"LocationConstraint": "us-west-2"})
    req = request(tmp_path, "s3-code", hosts=2, per_host=1)
    with tarfile.open(tmp_path / "sourcedir.tar.gz", "w:gz") as tar:
        tar.add(tmp_path / "code" / "train.py", arcname="train.py")
    s3.upload_file(str(tmp_path / "sourcedir.tar.gz"), "code-bkt", "job/source/sourcedir.tar.gz")
    req["HyperParameters"]["sagemaker_submit_directory"] = json.dumps(
        "s3://code-bkt/job/source/sourcedir.tar.gz")
    job = LocalBackend(root=root).submit(req)
    job.wait()
    ranks = [k for k in members(job.model_data.removeprefix("file://")) if k.startswith("rank-")]
    assert job.model_data == (tmp_path / "out" / "s3-code" / "output" / "model.tar.gz").as_uri()
    assert sorted(ranks) == ["rank-0.json", "rank-1.json"]
    assert (root / "s3-code" / "algo-2" / "code" / "train.py").exists()


TF_SCRIPT = """
import argparse, json, os
parser = argparse.ArgumentParser()
parser.add_argument("--model_dir")
args = parser.parse_args()
os.makedirs(args.model_dir, exist_ok=True)
open(os.path.join(args.model_dir, "saved"), "w").close()
with open(os.path.join(os.environ["SM_MODEL_DIR"], "seen.json"), "w") as f:
    json.dump({"arg": args.model_dir, "sm_hp": os.environ["SM_HP_MODEL_DIR"]}, f)
"""


def test_tensorflow_model_dir_under_opt_ml_stays_inside_the_local_job(tmp_path, root, capsys):
    import shoal

    code = tmp_path / "tf-code"
    code.mkdir()
    (code / "train.py").write_text(TF_SCRIPT)
    real_opt_ml = os.path.exists("/opt/ml")
    estimator = shoal.TensorFlow(
        entry_point="train.py", source_dir=str(code), role="arn:aws:iam::111122223333:role/R",
        instance_type="local", instance_count=1, framework_version="2.11.0", py_version="py39",
        output_path=(tmp_path / "tf-out").as_uri())
    estimator.fit(job_name="tf-model-dir", wait=True, logs="None")
    seen = json.loads(members(estimator.model_data.removeprefix("file://"))["seen.json"])
    host_dir = root / "tf-model-dir" / "algo-1"
    assert seen == {"arg": str(host_dir / "shared" / "model"),
                    "sm_hp": str(host_dir / "shared" / "model")}
    assert (host_dir / "shared" / "model" / "saved").exists()
    assert os.path.exists("/opt/ml") == real_opt_ml
    log = (root / "tf-model-dir" / "logs.txt").read_text()
    assert "/opt/ml paths mapped under" in log and "model_dir" in log
