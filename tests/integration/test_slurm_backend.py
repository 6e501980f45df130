"""The Slurm backend on a real Slurm cluster: this machine's (``make slurm-up``: Debian's
Slurm, two nodes in namespaces of their own). Each test runs an estimator's job through
sbatch and checks it from inside the ranks and from Slurm's side, and that nothing of the job
is left on the nodes."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import pytest
import shoal
from shoal.errors import JobFailedError, JobStoppedError
from shoal.local.network.namespaces import namespace_pids
from shoal.slurm import commands, devcluster

pytestmark = [
    pytest.mark.slurm, pytest.mark.mpi, pytest.mark.torch, pytest.mark.runtime,
    pytest.mark.slow,
    pytest.mark.skipif(os.geteuid() != 0, reason="the local Slurm cluster needs root"),
    pytest.mark.skipif(shutil.which("slurmd") is None or shutil.which("sbatch") is None,
                       reason="Debian's Slurm is not installed (make test installs it)"),
]

ROLE = "arn:aws:iam::111122223333:role/R"
RANKS = """
import json, os, socket, sys, time
import psutil
import shoal.dataparallel.torch  # noqa: F401 - registers smddp
import torch, torch.distributed as dist
dist.init_process_group("smddp")
rank = dist.get_rank()
total = torch.tensor([float(rank + 1)])
dist.all_reduce(total)
eth0 = [a.address for a in psutil.net_if_addrs().get("eth0", []) if a.family == socket.AF_INET]
print("RANK " + json.dumps({
    "rank": rank, "world": dist.get_world_size(), "host": os.environ["SM_CURRENT_HOST"],
    "hostname": socket.gethostname(), "node": os.environ.get("SHOAL_SLURM_NODE"),
    "eth0": eth0, "over_ssh": "SSH_CONNECTION" in os.environ, "sum": total.item(),
    "step": os.environ.get("SHOAL_SLURM_STEP"),
    "sshd": [p.pid for p in psutil.process_iter(["name"]) if p.info["name"] == "sshd"],
    "slurm_vars": sorted(k for k in os.environ if k.startswith("SLURM_"))}), flush=True)
print(f"loss={1.0 / (rank + 1):.3f}", flush=True)
open(os.path.join(os.environ["SM_MODEL_DIR"], f"rank-{rank}.txt"), "w").write("ok")
mode = os.environ.get("TEST_MODE", "")
if mode == "fail" and rank == 2:
    raise RuntimeError("rank 2 could not go on")
if mode == "sleep":
    for _ in range(600):
        time.sleep(1)
dist.destroy_process_group()
"""


@pytest.fixture(scope="module")
def cluster():
    was_up = devcluster.healthy(devcluster.plan(2))
    devcluster.up(2, say=lambda *_: None)
    yield
    if not was_up:
        devcluster.down(say=lambda *_: None)


@pytest.fixture(autouse=True)
def no_jobs_left(cluster):
    """A test that fails midway leaves no job holding the nodes for the next one."""
    yield
    subprocess.run(["scancel", "--partition", devcluster.plan(2).partition], capture_output=True)
    wait_until(lambda: not subprocess.run(["squeue", "-h"], capture_output=True,
                                          text=True).stdout.strip(), 60, "the queue empties")


def estimator(tmp_path, mode: str = "", script: str = RANKS, **kwargs):
    code = tmp_path / "code"
    code.mkdir(exist_ok=True)
    (code / "train.py").write_text(script)
    session = shoal.Session(backend="slurm", slurm={"shared_dir": str(tmp_path / "shared")})
    args = {"entry_point": "train.py", "source_dir": str(code), "role": ROLE,
            "framework_version": "2.0.1", "py_version": "py310", "instance_type": "ml.m5.xlarge",
            "instance_count": 2, "sagemaker_session": session,
            "distribution": {"smdistributed": {"dataparallel": {"enabled": True}},
                             "mpi": {"enabled": True, "processes_per_host": 2}},
            "environment": {"TEST_MODE": mode},
            "metric_definitions": [{"Name": "loss", "Regex": "loss=([0-9.]+)"}], **kwargs}
    return shoal.PyTorch(**args)


def node_processes() -> list[str]:
    """Every process on the nodes but their slurmd."""
    found = []
    for node in devcluster.plan(2).nodes:
        for pid in namespace_pids([node.namespace]):
            try:
                name = open(f"/proc/{pid}/comm").read().strip()
            except OSError:
                continue
            if name != "slurmd":
                found.append(f"{node.name}:{pid}:{name}")
    return found


def wait_until(check, seconds: float, what: str):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.5)
    raise AssertionError(f"not within {seconds} s: {what}")


def sleeping_job(tmp_path):
    """A job whose four ranks are up and sleep (for ten minutes)."""
    est = estimator(tmp_path, mode="sleep")
    est.fit(wait=False)
    job = est.latest_training_job
    wait_until(lambda: len(ranks_of(job)) == 4, 90, "the ranks start")
    return job


def ended(job, seconds: float) -> dict:
    """The job's description once it has ended."""
    return wait_until(lambda: (d := job.describe())["TrainingJobStatus"] in (
        "Completed", "Failed", "Stopped") and d, seconds, "the job ends")


def ranks_of(job) -> list[dict]:
    if not job.paths.log_file.exists():  # pending: the batch script has not started
        return []
    log = job.paths.log_file.read_text()
    return [json.loads(line.split("RANK ", 1)[1]) for line in log.splitlines() if "RANK {" in line]


def test_a_two_node_data_parallel_job_allreduces_across_the_nodes(cluster, tmp_path):
    est = estimator(tmp_path)
    est.fit(wait=False)
    job = est.latest_training_job
    # Slurm sees the job under its name while it runs; the record says where it is
    listed = wait_until(lambda: subprocess.run(
        ["squeue", "-h", "-j", job.slurm_job_id, "-o", "%j %T"], capture_output=True,
        text=True).stdout.split(), 30, "squeue lists the job")
    assert listed[0] == job.name
    assert job.describe()["TrainingJobStatus"] in ("InProgress", "Completed")
    job.wait(logs=None)
    ranks = ranks_of(job)
    assert sorted(r["rank"] for r in ranks) == [0, 1, 2, 3], job.paths.log_file.read_text()[-3000:]
    by_host = {h: [r for r in ranks if r["host"] == h] for h in ("algo-1", "algo-2")}
    assert {r["node"] for r in by_host["algo-1"]} == {"node1"}
    assert {r["node"] for r in by_host["algo-2"]} == {"node2"}
    assert {r["hostname"] for r in ranks} == {"algo-1", "algo-2"}
    assert {a for r in by_host["algo-1"] for a in r["eth0"]} == {"10.215.0.11"}
    assert {a for r in by_host["algo-2"] for a in r["eth0"]} == {"10.215.0.12"}
    # mpirun from algo-1 started algo-2's daemon as a step of the job, not over SSH
    assert not any(r["over_ssh"] or r["sshd"] for r in ranks)
    assert {r["step"] for r in by_host["algo-1"]} == {None}
    steps = {r["step"] for r in by_host["algo-2"]}
    assert len(steps) == 1 and steps.pop().startswith(f"{job.slurm_job_id}.")
    assert all(r["sum"] == 10.0 and r["world"] == 4 for r in ranks)  # across the nodes
    assert all(r["slurm_vars"] == [] for r in ranks)  # kept from Open MPI
    description = job.describe()
    assert description["TrainingJobStatus"] == "Completed"
    assert description["FinalMetricDataList"][0]["MetricName"] == "loss"
    model = description["ModelArtifacts"]["S3ModelArtifacts"]
    assert model == f"{(tmp_path / 'shared' / 'output').as_uri()}/{job.name}/output/model.tar.gz"
    assert commands.show(job.slurm_job_id).state == "COMPLETED"
    wait_until(lambda: not node_processes(), 30, f"nothing left: {node_processes()}")
    # attach binds an estimator to the job on the cluster (its record on the shared directory)
    attached = shoal.PyTorch.attach(f"slurm://{job.name}", est.sagemaker_session)
    assert attached.instance_count == 2 and attached.instance_type == "ml.m5.xlarge"
    assert attached.model_data == est.model_data
    out = __import__("io").StringIO()
    attached.latest_training_job.logs(wait=False, out=out)
    assert "[slurm] Training job completed" in out.getvalue()


# MPI itself, not smddp: the smddp glue compiles per user and per interpreter (a minute here)
USER_RANKS = """
import json, os, socket
from mpi4py import MPI
comm = MPI.COMM_WORLD
total = comm.allreduce(comm.Get_rank() + 1)
print("RANK " + json.dumps({
    "rank": comm.Get_rank(), "host": os.environ["SM_CURRENT_HOST"], "sum": total,
    "hostname": socket.gethostname(), "step": os.environ.get("SHOAL_SLURM_STEP"),
    "uid": os.getuid(), "uid_map": open("/proc/self/uid_map").read().split()}), flush=True)
"""
USER_DRIVER = """
import json, sys
import shoal
root = sys.argv[1]
est = shoal.PyTorch(
    entry_point="train.py", source_dir=root + "/code", role="arn:aws:iam::111122223333:role/R",
    framework_version="2.0.1", py_version="py310", instance_type="ml.m5.xlarge",
    instance_count=2, sagemaker_session=shoal.Session(
        backend="slurm", slurm={"shared_dir": root + "/shared", "python": sys.executable}),
    distribution={"mpi": {"enabled": True, "processes_per_host": 2}})
est.fit(wait=False)
job = est.latest_training_job
job.wait(logs=None)
print("JOB " + json.dumps({"log": str(job.paths.log_file), "slurm_id": job.slurm_job_id,
                           "description": job.describe()}, default=str))
"""


def user_python(folder: Path) -> str:
    """An interpreter an unprivileged user may run, with this checkout's packages, as a user's
    own environment on the shared filesystem would be (this machine's lives under /root)."""
    subprocess.run(["/usr/bin/python3", "-m", "venv", "--without-pip", str(folder)], check=True)
    python = folder / "bin" / "python"
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_path("
                           "'purelib'))"], capture_output=True, text=True, check=True).stdout.strip()
    ours = next(p for p in sys.path if p.endswith("site-packages") and p.startswith(sys.prefix))
    Path(site, "shoal-checkout.pth").write_text(f"import site; site.addsitedir({ours!r})\n")
    for name in ("train", "shoal-rank"):  # the launcher's console scripts, for this interpreter
        script = (Path(sys.executable).parent / name).read_text().split("\n", 1)[1]
        (folder / "bin" / name).write_text(f"#!{python}\n{script}")
        (folder / "bin" / name).chmod(0o755)
    return str(python)


SAME_SYSTEM_PYTHON = subprocess.run(
    ["/usr/bin/python3", "-c", f"import sys; assert sys.version_info[:2] == {sys.version_info[:2]}"],
    capture_output=True).returncode == 0


@pytest.mark.skipif(not SAME_SYSTEM_PYTHON, reason="needs the system's /usr/bin/python3 at this interpreter's version, "
                    "for an environment an unprivileged user may run")
def test_a_users_job_runs_without_root_on_the_nodes():
    """Submitted by an unprivileged user (nobody): the nodes' parts enter user namespaces of
    their own, mpirun's daemons join them as steps, and every file is the user's."""
    nobody = pwd.getpwnam("nobody")
    root = Path(tempfile.mkdtemp(prefix="shoal-slurm-user-"))
    try:
        python = user_python(root / "venv")
        (root / "code").mkdir()
        (root / "code" / "train.py").write_text(USER_RANKS)
        for folder, dirs, files in os.walk(root):
            for path in [folder, *(os.path.join(folder, n) for n in dirs + files)]:
                os.chown(path, nobody.pw_uid, nobody.pw_gid, follow_symlinks=False)
        env = {"PATH": f"{root / 'venv' / 'bin'}:/usr/bin:/bin", "HOME": str(root),
               "LANG": "C.UTF-8"}
        done = subprocess.run([shutil.which("runuser"), "-u", "nobody", "--", "env",
                               f"HOME={root}", python, "-c",
                               USER_DRIVER, str(root)], env=env, capture_output=True,
                              text=True, timeout=240)
        assert done.returncode == 0, done.stderr[-3000:]
        job = json.loads(done.stdout.split("JOB ", 1)[1])
        log = Path(job["log"]).read_text()
        assert job["description"]["TrainingJobStatus"] == "Completed", log[-3000:]
        ranks = [json.loads(line.split("RANK ", 1)[1]) for line in log.splitlines()
                 if "RANK {" in line]
        assert sorted(r["rank"] for r in ranks) == [0, 1, 2, 3]
        assert all(r["sum"] == 10.0 for r in ranks)  # across the nodes
        # every rank is the user, in a user namespace of its own on both nodes (where the
        # user was root long enough to set the hostname and mount /opt/ml)
        assert all(r["uid"] == nobody.pw_uid for r in ranks)
        assert all(r["uid_map"] == [str(nobody.pw_uid), "0", "1"] for r in ranks)
        assert {r["hostname"] for r in ranks} == {"algo-1", "algo-2"}
        steps = {r["step"] for r in ranks if r["host"] == "algo-2"}
        assert len(steps) == 1 and steps.pop().startswith(f"{job['slurm_id']}.")
        model = Path(job["description"]["ModelArtifacts"]["S3ModelArtifacts"][len("file://"):])
        assert model.stat().st_uid == nobody.pw_uid
        assert commands.show(job["slurm_id"]).state == "COMPLETED"
        wait_until(lambda: not node_processes(), 30, f"nothing left: {node_processes()}")
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_a_failing_rank_fails_the_job_with_its_error(cluster, tmp_path):
    est = estimator(tmp_path, mode="fail")
    with pytest.raises(JobFailedError, match="rank 2 could not go on"):
        est.fit(logs=None)
    assert "RuntimeError: rank 2 could not go on" in est.latest_training_job.describe()[
        "FailureReason"]
    wait_until(lambda: not node_processes(), 30, f"nothing left: {node_processes()}")


def test_stop_ends_every_rank_on_every_node(cluster, tmp_path):
    job = sleeping_job(tmp_path)
    # while it runs: its log, and its status through the command line
    out = __import__("io").StringIO()
    job.logs(wait=False, out=out)
    assert out.getvalue().count("RANK {") == 4
    from click.testing import CliRunner
    from shoal.cli import cli

    env = {"SHOAL_SLURM_SHARED_DIR": str(tmp_path / "shared"), "XDG_CONFIG_HOME": str(tmp_path)}
    shown = CliRunner(env=env).invoke(cli, ["status", f"slurm://{job.name}"])
    assert shown.exit_code == 0 and "SecondaryStatus: Training" in shown.output, shown.output
    listed = CliRunner(env=env).invoke(cli, ["list", "--slurm"])
    assert f"slurm://{job.name}" in listed.output and "InProgress" in listed.output
    started = time.monotonic()
    job.stop(wait=True)
    description = job.describe()
    assert description["TrainingJobStatus"] == "Stopped", description.get("FailureReason")
    assert time.monotonic() - started < 60
    wait_until(lambda: not node_processes(), 30, f"nothing left: {node_processes()}")
    with pytest.raises(JobStoppedError):
        job.wait(logs=None)


def test_the_run_time_limit_stops_the_job_as_maxruntimeexceeded(cluster, tmp_path):
    est = estimator(tmp_path, mode="sleep", max_run=12)
    with pytest.raises(JobStoppedError):
        est.fit(logs=None)
    description = est.latest_training_job.describe()
    assert description["SecondaryStatus"] == "MaxRuntimeExceeded"
    wait_until(lambda: not node_processes(), 30, f"nothing left: {node_processes()}")


def test_a_cancel_by_someone_else_is_stopped_and_says_so(cluster, tmp_path):
    job = sleeping_job(tmp_path)
    subprocess.run(["scancel", job.slurm_job_id], check=True)  # as an administrator would
    description = ended(job, 60)
    assert description["TrainingJobStatus"] == "Stopped"
    message = description["SecondaryStatusTransitions"][-1]["StatusMessage"]
    assert "someone other than Shoal" in message
    wait_until(lambda: not node_processes(), 30, f"nothing left: {node_processes()}")


def test_a_node_that_dies_fails_the_job_naming_its_host(cluster, tmp_path):
    job = sleeping_job(tmp_path)
    node2 = devcluster.plan(2).nodes[1].namespace
    started = time.monotonic()
    pids = namespace_pids([node2])
    subprocess.run(["kill", "-KILL", *map(str, pids)])  # the node, slurmd and all, is gone
    description = ended(job, 90)
    assert description["TrainingJobStatus"] == "Failed"
    assert "algo-2" in description["FailureReason"] or "node2" in description["FailureReason"]
    assert time.monotonic() - started < 60, description["FailureReason"]
    devcluster.up(2, say=lambda *_: None)  # node2 back for the tests after this one
    wait_until(lambda: not node_processes(), 30, f"nothing left: {node_processes()}")


def test_a_node_cut_off_the_network_fails_the_job_naming_its_host(cluster, tmp_path):
    job = sleeping_job(tmp_path)
    node2 = devcluster.plan(2).nodes[1]
    started = time.monotonic()
    subprocess.run(["ip", "link", "set", node2.veth, "down"], check=True)  # its cable pulled
    try:
        description = ended(job, 90)
    finally:
        subprocess.run(["ip", "link", "set", node2.veth, "up"], check=True)
    assert description["TrainingJobStatus"] == "Failed"
    reason = description["FailureReason"]
    assert "HostLostError: host algo-2" in reason, reason
    assert time.monotonic() - started < 60, reason
    devcluster.up(2, say=lambda *_: None)  # node2 answering again, or restarted
    wait_until(lambda: not node_processes(), 60, f"nothing left: {node_processes()}")


RESUMING = """
import os, sys, time
folder = "/opt/ml/checkpoints"
os.makedirs(folder, exist_ok=True)
path = os.path.join(folder, "step.txt")
start = int(open(path).read()) if os.path.exists(path) else 0
print(f"starting at step {start}", flush=True)
host = os.environ["SM_CURRENT_HOST"]
for step in range(start, start + 600):
    if host == "algo-1":
        with open(path + ".tmp", "w") as f:
            f.write(str(step + 1))
        os.replace(path + ".tmp", path)
    print(f"step {step}", flush=True)
    if start > 0 and step >= start + 2:
        break
    time.sleep(1)
"""


def test_a_requeued_job_restarts_from_its_checkpoints_and_completes(cluster, tmp_path):
    code = tmp_path / "code"
    code.mkdir()
    (code / "train.py").write_text(RESUMING)
    session = shoal.Session(backend="slurm", slurm={"shared_dir": str(tmp_path / "shared")})
    est = shoal.PyTorch(entry_point="train.py", source_dir=str(code), role=ROLE,
                        framework_version="2.0.1", py_version="py310",
                        instance_type="ml.m5.xlarge", instance_count=2, sagemaker_session=session,
                        checkpoint_s3_uri=(tmp_path / "checkpoints").as_uri())
    est.fit(wait=False)
    job = est.latest_training_job
    log = job.paths.log_file
    wait_until(lambda: log.exists() and "[algo-1] step 3" in log.read_text(), 90, "step 3")
    assert "--requeue" in (job.paths.job_dir / "sbatch.sh").read_text()
    subprocess.run(["scontrol", "requeue", job.slurm_job_id], check=True)
    # Slurm holds a requeued job back until its last run's credential expires (20 s here)
    wait_until(lambda: "Restarting" in [t["Status"] for t in job.describe()[
        "SecondaryStatusTransitions"]], 120, "the job runs again")
    description = job.wait(logs=None)
    assert description["TrainingJobStatus"] == "Completed"
    statuses = [t["Status"] for t in description["SecondaryStatusTransitions"]]
    assert statuses.index("Interrupted") < statuses.index("Restarting") < statuses.index(
        "Completed"), statuses
    starts = [int(line.split("starting at step ")[1].split()[0])
              for line in log.read_text().splitlines() if "[algo-1] starting at step" in line]
    assert starts[0] == 0 and starts[-1] >= 4, starts  # the second run resumed, not restarted
    assert commands.show(job.slurm_job_id).restarts == 1
    wait_until(lambda: not node_processes(), 30, f"nothing left: {node_processes()}")


S3_RANKS = """
import json, os
from mpi4py import MPI
comm = MPI.COMM_WORLD
ckpt = sorted(os.listdir("/opt/ml/checkpoints"))
print("RANK " + json.dumps({"rank": comm.Get_rank(), "host": os.environ["SM_CURRENT_HOST"],
                            "train": sorted(os.listdir(os.environ["SM_CHANNEL_TRAIN"])),
                            "ckpt": ckpt, "secrets": [k for k in os.environ
                                                      if k.startswith("AWS_SECRET")]}), flush=True)
if comm.Get_rank() == 0:
    open("/opt/ml/checkpoints/step-1.txt", "w").write("seen:" + ",".join(ckpt))
    open(os.path.join(os.environ["SM_MODEL_DIR"], "model.txt"), "w").write("ok")
"""


def test_s3_channels_output_and_checkpoints_through_an_s3_server_the_nodes_reach(
        cluster, tmp_path, monkeypatch):
    """s3:// input, output_path and checkpoint_s3_uri on the cluster: a local S3 server on the
    cluster's bridge, which the nodes reach as they would reach S3. The nodes take credentials
    from a shared credentials file: the submitter's secret variables stay out of the job."""
    import boto3
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address=devcluster.CONTROLLER_ADDRESS, port=0)
    server.start()
    try:
        url = "http://{}:{}".format(*server.get_host_and_port())
        # moto's state is the process's: other tests' servers may have made buckets already
        bucket = f"slurm-{uuid.uuid4().hex[:12]}"
        monkeypatch.setenv("AWS_ENDPOINT_URL_S3", url)  # exported to the job by sbatch
        Path(os.environ["AWS_SHARED_CREDENTIALS_FILE"]).write_text(
            "[default]\naws_access_key_id = testing\naws_secret_access_key = testing\n")
        s3 = boto3.client("s3", endpoint_url=url, region_name="us-west-2")
        s3.create_bucket(Bucket=bucket,
                         CreateBucketConfiguration={"LocationConstraint": "us-west-2"})
        s3.put_object(Bucket=bucket, Key="train/a.csv", Body=b"1\n")
        s3.put_object(Bucket=bucket, Key="train/sub/b.csv", Body=b"2\n")
        s3.put_object(Bucket=bucket, Key="ckpt/step-0.txt", Body=b"old")
        est = estimator(tmp_path, script=S3_RANKS, output_path=f"s3://{bucket}/out",
                        checkpoint_s3_uri=f"s3://{bucket}/ckpt",
                        distribution={"mpi": {"enabled": True, "processes_per_host": 1}})
        est.fit({"train": f"s3://{bucket}/train"}, wait=False)
        job = est.latest_training_job
        description = job.wait(logs=None)
        log = job.paths.log_file.read_text()
        assert description["TrainingJobStatus"] == "Completed", log[-3000:]
        ranks = [json.loads(line.split("RANK ", 1)[1]) for line in log.splitlines()
                 if "RANK {" in line]
        # every host got the channel and the checkpoints restored before it started
        assert {r["host"] for r in ranks} == {"algo-1", "algo-2"}
        assert all(r["train"] == ["a.csv", "sub"] and r["ckpt"] == ["step-0.txt"] for r in ranks)
        assert all(r["secrets"] == [] for r in ranks)  # the submitter's stayed here
        assert est.model_data == f"s3://{bucket}/out/{job.name}/output/model.tar.gz"
        s3.head_object(Bucket=bucket, Key=f"out/{job.name}/output/model.tar.gz")
        saved = s3.get_object(Bucket=bucket, Key="ckpt/step-1.txt")["Body"].read()
        assert saved == b"seen:step-0.txt"
        wait_until(lambda: not node_processes(), 30, f"nothing left: {node_processes()}")
    finally:
        server.stop()


def test_a_pipeline_by_data_parallel_smp_job_trains_across_the_nodes(cluster, tmp_path):
    """The SMP v1 example, pipeline 2 x data parallel 2 on 2 nodes x 2 processes: the loss
    falls well below guessing's and the archive holds one file per partition."""
    from tests.integration.test_examples import (
        EXAMPLES,
        PIPELINE_BY_DATA,
        check_pipeline_by_data_archive,
    )

    session = shoal.Session(backend="slurm", slurm={"shared_dir": str(tmp_path / "shared")})
    est = shoal.PyTorch(
        entry_point="train_lm.py", source_dir=str(EXAMPLES / "smdistributed_modelparallel"),
        role=ROLE, instance_type="ml.m5.xlarge", instance_count=2, framework_version="1.13.1",
        py_version="py39", sagemaker_session=session, hyperparameters={"steps": 60},
        distribution=PIPELINE_BY_DATA)
    est.fit(logs=None)
    check_pipeline_by_data_archive(est.model_data.removeprefix("file://"))
    log = est.latest_training_job.paths.log_file.read_text()
    assert "mpirank:3,algo-2" in log
    wait_until(lambda: not node_processes(), 30, f"nothing left: {node_processes()}")

