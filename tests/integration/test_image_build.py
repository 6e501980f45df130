"""A real build of the CPU training image with buildah, from a Debian base made here with
debootstrap, then a one-host, two-rank MPI job run inside it through ``train``, and a push
to a local OCI layout.

The base image and the image store are cached under ``$SHOAL_TEST_IMAGE_CACHE`` (default
/var/tmp/shoal-test-base), the base keyed by Debian suite and month, and the build uses
buildah's layer cache, so later runs rebuild only what changed in the source tree.
"""

import datetime
import glob
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from shoal.containers import builder as builders
from shoal.containers import local_base, push, render

CACHE = Path(os.environ.get("SHOAL_TEST_IMAGE_CACHE", "/var/tmp/shoal-test-base"))
SUITE = "bookworm"

pytestmark = [
    pytest.mark.buildah,
    pytest.mark.slow,
    pytest.mark.timeout(1200),
    pytest.mark.skipif(os.geteuid() != 0, reason="buildah and debootstrap need root"),
    pytest.mark.skipif(shutil.which("buildah") is None, reason="buildah is not installed"),
    pytest.mark.skipif(shutil.which("debootstrap") is None, reason="debootstrap is not installed"),
]

WRITE_RANK = """
import json, os, socket
rank = int(os.environ["RANK"])
record = {"rank": rank, "size": int(os.environ["WORLD_SIZE"]),
          "local_rank": int(os.environ["LOCAL_RANK"]), "hostname": socket.gethostname(),
          "sm_host": os.environ["SM_CURRENT_HOST"], "ompi_rank": int(os.environ["OMPI_COMM_WORLD_RANK"])}
with open(os.path.join(os.environ["SM_MODEL_DIR"], f"rank-{rank}.json"), "w") as f:
    json.dump(record, f)
"""


STORE_LIMIT_MB = 20_000


@pytest.fixture(scope="module")
def store():
    CACHE.mkdir(parents=True, exist_ok=True)
    settings = builders.Buildah(root=str(CACHE / "store"))
    # Each source change leaves the previous build's (small) layers behind as untagged
    # images that also serve as the layer cache: prune them only once the store is large.
    usage = subprocess.run(["du", "-sm", settings.root], capture_output=True, text=True)
    if usage.returncode == 0 and int(usage.stdout.split()[0]) > STORE_LIMIT_MB:
        subprocess.run([*settings.global_args(), "rmi", "--prune"], capture_output=True)
    return settings


@pytest.fixture(scope="module")
def base(store):
    name = local_base.base_name(SUITE, datetime.date.today())
    return local_base.make_local_base(name, suite=SUITE, buildah=store, workdir=CACHE)


@pytest.fixture(scope="module")
def options(base):
    # The host's extra CAs: pip inside the build goes through the same TLS inspection, if any.
    certs = sorted(glob.glob("/usr/local/share/ca-certificates/*.crt"))
    return render.BuildOptions("pytorch", "1.13.1", "cpu", base=base, python="3",
                               install_framework=False, ca_certificates=certs)


@pytest.fixture(scope="module")
def source_tree(tmp_path_factory):
    """The committed tree (HEAD) when this is a git checkout: the image is built from what
    is committed, not from files half-way through an edit; else the working tree."""
    repo = Path(__file__).resolve().parents[2]
    out = tmp_path_factory.mktemp("source")
    archive = subprocess.run(["git", "-C", str(repo), "archive", "--format=tar", "HEAD"],
                             capture_output=True, check=False)
    if archive.returncode != 0:
        return repo
    subprocess.run(["tar", "-x", "-C", str(out)], input=archive.stdout, check=True)
    return out


@pytest.fixture(scope="module")
def image(options, store, source_tree):
    return builders.build_image(options, source_root=source_tree, builder="buildah",
                                buildah=store)


def buildah(store, *args, **kwargs):
    return subprocess.run([*store.global_args(), *args], capture_output=True, text=True,
                          check=True, **kwargs).stdout


@pytest.fixture
def container(image, store):
    name = buildah(store, "from", "--add-host", "algo-1:127.0.0.1", image).strip()
    yield name
    buildah(store, "rm", name)


def test_image_config_entrypoint_env_and_labels(image, store):
    config = json.loads(buildah(store, "inspect", "--type", "image", image))
    oci = config["OCIv1"]["config"]
    assert oci["Entrypoint"] == ["/usr/local/bin/shoal-entrypoint"]
    assert oci["Cmd"] == ["train"]
    env = dict(item.split("=", 1) for item in oci["Env"])
    assert env["PYTHONUNBUFFERED"] == "1"
    assert env["SAGEMAKER_TRAINING_MODULE"] == "shoal.launcher.entrypoint:main"
    assert env["SHOAL_GETHOSTNAME_PRELOAD"] == "/usr/local/lib/libshoal_hostname.so"
    assert env["PATH"].startswith("/opt/shoal/venv/bin:")
    assert "LD_LIBRARY_PATH" in env
    labels = oci["Labels"]
    assert labels["org.opencontainers.image.version"] == "1.13.1-cpu-py39"
    assert labels["ai.shoal.framework-version"] == "1.13.1"
    assert labels["ai.shoal.processor"] == "cpu"


def test_image_holds_the_runtime_mpi_and_ssh_setup_but_no_sources(container, store):
    script = (
        "set -e; command -v train shoal-rank mpirun mpirun.real sshd;"
        " python -c 'import shoal.launcher, mpi4py; print(\"imports-ok\")';"
        " cat /etc/openmpi/openmpi-mca-params.conf /etc/ssh/ssh_config.d/shoal.conf;"
        " ls /etc/ssh/ssh_host_ed25519_key /root/.ssh/authorized_keys /usr/local/lib/libshoal_hostname.so;"
        " test ! -e /opt/shoal/src && test ! -e /opt/shoal/wheels && echo no-sources;"
        " ! command -v gcc && echo no-compiler;"
        " SHOAL_HOST=algo-3 LD_PRELOAD=/usr/local/lib/libshoal_hostname.so hostname"
    )
    out = buildah(store, "run", "--isolation", store.isolation, container, "--", "bash", "-c",
                  script)
    for expected in ("/opt/shoal/venv/bin/train", "/opt/shoal/venv/bin/shoal-rank",
                     "imports-ok", "btl_vader_single_copy_mechanism = none",
                     "StrictHostKeyChecking no", "no-sources", "no-compiler", "algo-3"):
        assert expected in out, out


def write_job(root: Path) -> Path:
    config = root / "input" / "config"
    config.mkdir(parents=True)
    (config / "resourceconfig.json").write_text(json.dumps(
        {"current_host": "algo-1", "hosts": ["algo-1"], "network_interface_name": "eth0"}))
    (config / "hyperparameters.json").write_text(json.dumps({
        "sagemaker_program": json.dumps("train.py"), "sagemaker_mpi_enabled": "true",
        "sagemaker_mpi_num_of_processes_per_host": "2"}))
    (config / "inputdataconfig.json").write_text("{}")
    (root / "code").mkdir()
    (root / "code" / "train.py").write_text(WRITE_RANK)
    return root


def test_a_two_rank_mpi_job_runs_through_train(container, store, tmp_path):
    job = write_job(tmp_path / "ml")
    done = subprocess.run(
        [*store.global_args(), "run", "--isolation", store.isolation, "--volume", f"{job}:/opt/ml", container, "--",
         "/usr/local/bin/shoal-entrypoint", "train"],
        capture_output=True, text=True, timeout=300, check=False)
    failure = job / "output" / "failure"
    assert done.returncode == 0, (done.stdout[-3000:], done.stderr[-3000:],
                                  failure.read_text() if failure.exists() else "")
    assert (job / "output" / "success").exists()
    records = sorted((json.loads(p.read_text()) for p in (job / "model").glob("rank-*.json")),
                     key=lambda r: r["rank"])
    assert [r["rank"] for r in records] == [0, 1]
    for r in records:
        assert (r["size"], r["local_rank"], r["ompi_rank"]) == (2, r["rank"], r["rank"])
        assert r["hostname"] == r["sm_host"] == "algo-1"


def test_push_to_a_local_oci_layout(image, options, store, tmp_path):
    where = push.push_image(options, dest=f"oci:{tmp_path}/layout", builder="buildah",
                            buildah=store)
    assert where == f"oci:{tmp_path}/layout:1.13.1-cpu-py39"
    layout = tmp_path / "layout"
    assert json.loads((layout / "oci-layout").read_text())["imageLayoutVersion"] == "1.0.0"
    index = json.loads((layout / "index.json").read_text())
    (entry,) = index["manifests"]
    assert entry["annotations"]["org.opencontainers.image.ref.name"] == "1.13.1-cpu-py39"
    algorithm, digest = entry["digest"].split(":")
    manifest = json.loads((layout / "blobs" / algorithm / digest).read_text())
    assert manifest["mediaType"] == "application/vnd.oci.image.manifest.v1+json"
    config_digest = manifest["config"]["digest"].split(":")[1]
    config = json.loads((layout / "blobs" / algorithm / config_digest).read_text())
    assert config["config"]["Entrypoint"] == ["/usr/local/bin/shoal-entrypoint"]
    for layer in manifest["layers"]:
        assert (layout / "blobs" / algorithm / layer["digest"].split(":")[1]).is_file()


NAMESPACED = """
import json, os, socket
from mpi4py import MPI
import numpy as np
from shoal.dataparallel import core
rank = MPI.COMM_WORLD.Get_rank()
core.init()
grads = np.array([float(rank + 1)], dtype=np.float32)
core.allreduce(grads)
print("RANK " + json.dumps({
    "rank": rank, "host": socket.gethostname(), "address": socket.gethostbyname(socket.gethostname()),
    "over_ssh": "SSH_CONNECTION" in os.environ, "sum": float(grads[0]),
    "setting": os.environ.get("MY_SETTING"), "image": os.path.exists("/usr/local/bin/shoal-entrypoint")}),
    flush=True)
"""


def test_a_two_host_job_runs_inside_the_image_in_namespaces(image, store, tmp_path, monkeypatch):
    """The container path end to end: each host of a 2-host x 2-rank local job inside the
    image in its own network namespace, through the image's entrypoint and its sshd."""
    from shoal.backends.local import LocalBackend
    from shoal.local.network import namespaces, preflight

    if preflight.missing():
        pytest.skip("; ".join(preflight.missing()))
    monkeypatch.setenv("SHOAL_LOCAL_NETWORK", "namespaces")
    monkeypatch.setenv("SHOAL_LOCAL_IMAGE", image)
    monkeypatch.setenv("SHOAL_LOCAL_BUILDAH_ROOT", store.root)
    code = tmp_path / "code"
    code.mkdir()
    (code / "train.py").write_text(NAMESPACED)
    request = {
        "TrainingJobName": "in-image", "RoleArn": "arn:aws:iam::111122223333:role/R",
        "AlgorithmSpecification": {"TrainingImage": image, "TrainingInputMode": "File"},
        "HyperParameters": {"sagemaker_program": json.dumps("train.py"),
                            "sagemaker_submit_directory": json.dumps(code.as_uri()),
                            "sagemaker_mpi_enabled": "true",
                            "sagemaker_mpi_num_of_processes_per_host": "2"},
        "OutputDataConfig": {"S3OutputPath": (tmp_path / "out").as_uri()},
        "ResourceConfig": {"InstanceType": "local", "InstanceCount": 2, "VolumeSizeInGB": 30},
        "Environment": {"MY_SETTING": "from-the-request"},
        "StoppingCondition": {"MaxRuntimeInSeconds": 300},
    }
    containers = buildah(store, "containers", "--quiet").split()
    job = LocalBackend(root=tmp_path / "jobs").submit(request)
    job.wait(logs=None)
    log = job.paths.log_file.read_text()
    ranks = [json.loads(line.split("RANK ", 1)[1]) for line in log.splitlines() if "RANK {" in line]
    assert sorted(r["rank"] for r in ranks) == [0, 1, 2, 3], log[-3000:]
    assert all(r["image"] and r["sum"] == 10.0 and r["setting"] == "from-the-request"
               for r in ranks)
    hosts = {r["host"]: r["address"] for r in ranks}
    assert sorted(hosts) == ["algo-1", "algo-2"] and len(set(hosts.values())) == 2
    assert all(r["over_ssh"] == (r["host"] == "algo-2") for r in ranks)
    slot = int(re.search(r"network slot (\d+):", log)[1])
    assert not [n for n in namespaces.list_namespaces() if namespaces.slot_of(n) == slot]
    assert buildah(store, "containers", "--quiet").split() == containers  # its own removed
