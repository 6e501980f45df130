"""Parity with the SageMaker Python SDK v2: for each configuration, the same estimator is
built with ``sagemaker`` 2.x and with Shoal (only the import lines differ), both under
moto, and their ``CreateTrainingJob`` requests must be equal except for the documented,
deliberate differences (``DELIBERATE_DIFFERENCES``, also listed in the README).

v2's request is captured where its ``Session.train`` hands it to
``sagemaker_client.create_training_job``. Every request is also checked against
botocore's own model of the API.
"""

from __future__ import annotations

import copy
import functools
import os
import types
import warnings

import boto3
import botocore.session
import botocore.validate
import pytest
from moto import mock_aws

sagemaker = pytest.importorskip("sagemaker")

import shoal  # noqa: E402
import shoal.errors  # noqa: E402
import shoal.inputs  # noqa: E402
from shoal.containers import matrix  # noqa: E402

ROLE = "arn:aws:iam::123456789012:role/SageMakerRole"
ACCOUNT = "123456789012"
JOB = "parity-job-2026-01-01-00-00-00-000"

# The differences Shoal makes on purpose; each is applied to both requests before comparing.
DELIBERATE_DIFFERENCES = {
    "AlgorithmSpecification.TrainingImage":
        "Shoal's own image (shoal-<framework>-training in the user's account) instead of "
        "the AWS Deep Learning Container",
}


def offline_sdk_v2(monkeypatch) -> None:
    """v2 without its usage reports (over HTTP: the test machine has no network) or its
    v3 warning."""
    from sagemaker.telemetry import telemetry_logging

    monkeypatch.setattr(telemetry_logging, "_requests_helper", lambda *a, **k: None)
    monkeypatch.setenv("SAGEMAKER_SUPPRESS_V2_WARNING", "1")


@pytest.fixture
def aws(monkeypatch, tmp_path):
    offline_sdk_v2(monkeypatch)
    code = tmp_path / "code"
    code.mkdir()
    (code / "train.py").write_text("print('training')\n")
    (code / "util.py").write_text("X = 1\n")
    (tmp_path / "dep").mkdir()
    (tmp_path / "dep" / "helper.py").write_text("Y = 2\n")
    monkeypatch.chdir(tmp_path)
    with mock_aws():
        s3 = boto3.client("s3", region_name="us-west-2")
        for bucket in ("out-bucket", "code-bucket"):
            s3.create_bucket(Bucket=bucket,
                             CreateBucketConfiguration={"LocationConstraint": "us-west-2"})
        yield tmp_path


def v2_request(kind: str, kwargs: dict, inputs, region="us-west-2", local=False,
               session=None) -> dict:
    """The request sagemaker 2.x sends for ``kind`` (PyTorch, TensorFlow, Estimator)."""
    from sagemaker.estimator import Estimator
    from sagemaker.pytorch import PyTorch
    from sagemaker.tensorflow import TensorFlow

    if session is None:
        session = v2_session(region, local)
    captured = {}
    session.sagemaker_client.create_training_job = lambda **request: captured.update(request)
    cls = {"PyTorch": PyTorch, "TensorFlow": TensorFlow, "Estimator": Estimator}[kind]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        estimator = cls(sagemaker_session=session, **kwargs)
        estimator.fit(inputs, wait=False, logs=False, job_name=JOB)
    return captured


def v2_session(region: str, local: bool):
    boto_session = boto3.Session(region_name=region)
    if not local:
        return sagemaker.session.Session(boto_session=boto_session)
    from sagemaker.local import LocalSession

    session = LocalSession(boto_session=boto_session)
    session.config = {"local": {"local_code": True}}
    return session


def shoal_request(kind: str, kwargs: dict, inputs, region="us-west-2", session=None) -> dict:
    session = session or shoal.Session(boto_session=boto3.Session(region_name=region),
                                       local_mode=kwargs.get("instance_type") == "local")
    cls = getattr(shoal, kind)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        estimator = cls(sagemaker_session=session, **kwargs)
    return estimator.build_request(inputs, job_name=JOB)


def v2_names():
    from sagemaker.inputs import FileSystemInput, ShuffleConfig, TrainingInput
    from sagemaker.instance_group import InstanceGroup

    return types.SimpleNamespace(TrainingInput=TrainingInput, FileSystemInput=FileSystemInput,
                                 ShuffleConfig=ShuffleConfig, InstanceGroup=InstanceGroup)


def shoal_names():
    return types.SimpleNamespace(
        TrainingInput=shoal.inputs.TrainingInput, FileSystemInput=shoal.inputs.FileSystemInput,
        ShuffleConfig=shoal.inputs.ShuffleConfig, InstanceGroup=shoal.InstanceGroup)


def without_deliberate_differences(request: dict) -> dict:
    out = copy.deepcopy(request)
    out["AlgorithmSpecification"].pop("TrainingImage")
    return out


@functools.lru_cache(maxsize=1)
def create_training_job_shape():
    model = botocore.session.get_session().get_service_model("sagemaker")
    return model.operation_model("CreateTrainingJob").input_shape


def validate_with_botocore(request: dict) -> None:
    botocore.validate.validate_parameters(request, create_training_job_shape())


def expected_image(kind, kwargs, region="us-west-2"):
    if "image_uri" in kwargs:
        return kwargs["image_uri"]
    spec = matrix.find(kind.lower(), kwargs["framework_version"], kwargs.get("py_version"))
    instance = (kwargs.get("instance_type") or kwargs.get("train_instance_type")
                or kwargs["instance_groups"][0].instance_type)
    gpu = instance.startswith(("ml.p", "ml.g"))
    return matrix.image_uri(spec, "gpu" if gpu else "cpu", ACCOUNT, region)


PT = {"entry_point": "train.py", "source_dir": "code", "role": ROLE,
      "framework_version": "1.13.1", "py_version": "py39"}
PT_GPU = {**PT, "instance_count": 2, "instance_type": "ml.p4d.24xlarge"}
PT_CPU = {**PT, "instance_count": 1, "instance_type": "ml.c5.xlarge"}
TF = {"entry_point": "train.py", "source_dir": "code", "role": ROLE,
      "framework_version": "2.11.0", "py_version": "py39"}
TF_GPU = {**TF, "instance_count": 2, "instance_type": "ml.p4d.24xlarge"}
TF_CPU = {**TF, "instance_count": 1, "instance_type": "ml.c5.xlarge"}
VPC = {"subnets": ["subnet-0123456789abcdef0"], "security_group_ids": ["sg-0123456789abcdef0"]}
KMS = "arn:aws:kms:us-west-2:123456789012:key/1234abcd-12ab-34cd-56ef-1234567890ab"


def smddp(**options):
    return {"smdistributed": {"dataparallel": {"enabled": True, **options}}}


def heterogeneous(n, groups):
    """PyTorch on instance groups, the data-parallel job on the first group (v2 wants
    the very same InstanceGroup object in the distribution)."""
    return {**PT, "instance_groups": groups,
            "distribution": {**smddp(), "instance_groups": [groups[0]]}}


# id -> (kind, kwargs(ns) -> dict, inputs(ns) -> object, options)
CASES = {
    "pytorch-minimal": ("PyTorch", lambda n: PT_CPU, lambda n: "s3://data/train", {}),
    "pytorch-smddp": ("PyTorch", lambda n: {**PT_GPU, "distribution": smddp()},
                      lambda n: "s3://data/train", {}),
    "pytorch-smddp-custom-mpi-options": (
        "PyTorch", lambda n: {**PT_GPU, "distribution": smddp(
            custom_mpi_options="-verbose -x NCCL_DEBUG=VERSION")},
        lambda n: {"train": "s3://data/train", "test": "s3://data/test"}, {}),
    "pytorch-mpi": ("PyTorch", lambda n: {**PT_GPU, "distribution": {"mpi": {
        "enabled": True, "processes_per_host": 8, "custom_mpi_options": "--NCCL_DEBUG INFO"}}},
        lambda n: "s3://data/train", {}),
    "pytorch-torch-distributed": ("PyTorch", lambda n: {**PT_GPU, "distribution": {
        "torch_distributed": {"enabled": True}}}, lambda n: "s3://data/train", {}),
    "pytorch-pytorchddp": ("PyTorch", lambda n: {**PT_GPU, "distribution": {
        "pytorchddp": {"enabled": True}}}, lambda n: "s3://data/train", {}),
    "pytorch-modelparallel": ("PyTorch", lambda n: {**PT_GPU, "distribution": {
        "smdistributed": {"modelparallel": {"enabled": True, "parameters": {
            "partitions": 2, "microbatches": 4, "pipeline": "interleaved", "ddp": True}}},
        "mpi": {"enabled": True, "processes_per_host": 8}}}, lambda n: "s3://data/train", {}),
    "pytorch-instance-groups": ("PyTorch", lambda n: heterogeneous(
        n, [n.InstanceGroup("gpus", "ml.p4d.24xlarge", 2),
            n.InstanceGroup("cpus", "ml.c5.xlarge", 1)]),
        lambda n: {"train": n.TrainingInput("s3://data/train", instance_groups=["gpus"]),
                   "pre": n.TrainingInput("s3://data/pre", instance_groups=["cpus"])}, {}),
    "pytorch-spot-checkpoints": ("PyTorch", lambda n: {
        **PT_GPU, "use_spot_instances": True, "max_run": 3600, "max_wait": 7200,
        "checkpoint_s3_uri": "s3://ckpt/run", "checkpoint_local_path": "/opt/ml/checkpoints"},
        lambda n: "s3://data/train", {}),
    "pytorch-spot-s3-checkpoint-only": ("PyTorch", lambda n: {
        **PT_CPU, "use_spot_instances": True, "max_wait": 86400,
        "checkpoint_s3_uri": "s3://ckpt/run"}, lambda n: "s3://data/train", {}),
    "pytorch-vpc-fsx": ("PyTorch", lambda n: {**PT_GPU, **VPC, "distribution": smddp()},
                        lambda n: n.FileSystemInput("fs-0123456789abcdef0", "FSxLustre",
                                                    "/fsx/data", "ro"), {}),
    "pytorch-vpc-efs-rw": ("PyTorch", lambda n: {**PT_CPU, **VPC}, lambda n: {
        "train": n.FileSystemInput("fs-0123abcd", "EFS", "/data/train", "rw",
                                   content_type="application/x-image"),
        "test": "s3://data/test"}, {}),
    "pytorch-kms": ("PyTorch", lambda n: {
        **PT_CPU, "volume_kms_key": KMS, "output_kms_key": KMS,
        "output_path": "s3://out-bucket/prefix", "code_location": "s3://code-bucket/code"},
        lambda n: "s3://data/train", {}),
    "pytorch-retries-keepalive": ("PyTorch", lambda n: {
        **PT_CPU, "max_retry_attempts": 5, "keep_alive_period_in_seconds": 1800,
        "volume_size": 200}, lambda n: "s3://data/train", {}),
    "pytorch-tags-env-metrics": ("PyTorch", lambda n: {
        **PT_CPU, "tags": [{"Key": "team", "Value": "ml"}, {"Key": "cost-center", "Value": "42"}],
        "environment": {"NCCL_DEBUG": "INFO", "OMP_NUM_THREADS": "4"},
        "metric_definitions": [{"Name": "loss", "Regex": "loss=([0-9.]+)"}]},
        lambda n: "s3://data/train", {}),
    "pytorch-tags-dict": ("PyTorch", lambda n: {**PT_CPU, "tags": {"team": "ml", "n": 3}},
                          lambda n: None, {}),
    "pytorch-isolation-encryption": ("PyTorch", lambda n: {
        **PT_GPU, "enable_network_isolation": True, "encrypt_inter_container_traffic": True},
        lambda n: "s3://data/train", {}),
    "pytorch-model-channel": ("PyTorch", lambda n: {
        **PT_CPU, "model_uri": "s3://models/model.tar.gz", "model_channel_name": "pretrained"},
        lambda n: "s3://data/train", {}),
    "pytorch-training-input-fields": ("PyTorch", lambda n: PT_CPU, lambda n: {
        "train": n.TrainingInput("s3://data/manifest", distribution="ShardedByS3Key",
                                 compression="Gzip", content_type="application/x-recordio",
                                 record_wrapping="RecordIO", s3_data_type="ManifestFile",
                                 shuffle_config=n.ShuffleConfig(42)),
        "aug": n.TrainingInput("s3://data/aug.manifest", s3_data_type="AugmentedManifestFile",
                               attribute_names=["source-ref", "label"], input_mode="FastFile")},
        {}),
    "pytorch-lone-input-pipe-mode": ("PyTorch", lambda n: PT_CPU, lambda n: n.TrainingInput(
        "s3://data/train", input_mode="Pipe"), {}),
    "pytorch-estimator-pipe-mode": ("PyTorch", lambda n: {**PT_CPU, "input_mode": "Pipe"},
                                    lambda n: "s3://data/train", {}),
    "pytorch-disable-profiler": ("PyTorch", lambda n: {**PT_CPU, "disable_profiler": True},
                                 lambda n: "s3://data/train", {}),
    "pytorch-no-debugger": ("PyTorch", lambda n: {**PT_CPU, "debugger_hook_config": False},
                            lambda n: "s3://data/train", {}),
    "pytorch-output-path-base-name": ("PyTorch", lambda n: {
        **PT_CPU, "output_path": "s3://out-bucket/some/prefix/", "base_job_name": "my-base",
        "container_log_level": 10}, lambda n: "s3://data/train", {}),
    "pytorch-v1-argument-names": ("PyTorch", lambda n: {
        **PT, "train_instance_count": 1, "train_instance_type": "ml.g5.xlarge",
        "train_volume_size": 50, "train_max_run": 7200, "train_use_spot_instances": True,
        "train_max_wait": 7200}, lambda n: "s3://data/train", {}),
    "pytorch-source-dir-in-s3": ("PyTorch", lambda n: {
        **PT_CPU, "source_dir": "s3://code-bucket/prebuilt/sourcedir.tar.gz"},
        lambda n: "s3://data/train", {}),
    "pytorch-entry-point-only": ("PyTorch", lambda n: {
        **{k: v for k, v in PT_CPU.items() if k != "source_dir"}, "entry_point": "code/train.py"},
        lambda n: "s3://data/train", {}),
    "pytorch-dependencies-hyperparameters": ("PyTorch", lambda n: {
        **PT_CPU, "dependencies": ["dep"], "hyperparameters": {
            "epochs": 10, "lr": 0.001, "amp": True, "layers": [64, 32], "opt": {"name": "sgd"},
            "note": None, "name": "resnet"}}, lambda n: "s3://data/train", {}),
    "pytorch-no-debugger-region": ("PyTorch", lambda n: PT_CPU, lambda n: "s3://data/train",
                                   {"region": "eu-central-2"}),
    "pytorch-local-file-input": ("PyTorch", lambda n: {
        **PT, "instance_count": 1, "instance_type": "local", "source_dir": os.path.abspath("code"),
        "output_path": "file:///tmp/shoal-parity-out"},
        lambda n: "file:///tmp/shoal-parity-data", {"local": True}),
    "tensorflow-local": ("TensorFlow", lambda n: {
        **TF, "instance_count": 1, "instance_type": "local", "source_dir": os.path.abspath("code"),
        "output_path": "file:///tmp/shoal-parity-out"},
        lambda n: {"train": "file:///tmp/shoal-parity-data", "test": "s3://data/test"},
        {"local": True}),
    "tensorflow-minimal": ("TensorFlow", lambda n: TF_CPU, lambda n: "s3://data/train", {}),
    "tensorflow-smddp": ("TensorFlow", lambda n: {
        **TF_GPU, "framework_version": "2.10.1", "distribution": smddp()},
        lambda n: "s3://data/train", {}),
    "tensorflow-mpi": ("TensorFlow", lambda n: {**TF_GPU, "distribution": {"mpi": {
        "enabled": True, "processes_per_host": 8}}}, lambda n: "s3://data/train", {}),
    "tensorflow-parameter-server": ("TensorFlow", lambda n: {**TF_CPU, "instance_count": 2,
                                    "distribution": {"parameter_server": {"enabled": True}}},
                                    lambda n: "s3://data/train", {}),
    "tensorflow-mwms": ("TensorFlow", lambda n: {**TF_GPU, "distribution": {
        "multi_worker_mirrored_strategy": {"enabled": True}}}, lambda n: "s3://data/train", {}),
    "tensorflow-model-dir": ("TensorFlow", lambda n: {**TF_CPU, "model_dir": "s3://m/dir"},
                             lambda n: "s3://data/train", {}),
    "tensorflow-no-model-dir": ("TensorFlow", lambda n: {**TF_CPU, "model_dir": False},
                                lambda n: "s3://data/train", {}),
    "tensorflow-spot-vpc-fsx-kms": ("TensorFlow", lambda n: {
        **TF_GPU, **VPC, "use_spot_instances": True, "max_wait": 172800,
        "checkpoint_s3_uri": "s3://ckpt/tf", "checkpoint_local_path": "/opt/ml/checkpoints",
        "output_kms_key": KMS, "distribution": smddp()},
        lambda n: {"train": n.FileSystemInput("fs-0123456789abcdef0", "FSxLustre", "/fsx/tf")},
        {}),
    "estimator-image": ("Estimator", lambda n: {
        "image_uri": "111122223333.dkr.ecr.us-west-2.amazonaws.com/algo:1", "role": ROLE,
        "instance_count": 1, "instance_type": "ml.m5.xlarge",
        "hyperparameters": {"k": 10, "mode": "fast", "flag": True}},
        lambda n: {"train": "s3://data/train"}, {}),
    "estimator-image-script-mode": ("Estimator", lambda n: {
        "image_uri": "111122223333.dkr.ecr.us-west-2.amazonaws.com/algo:1", "role": ROLE,
        "instance_count": 1, "instance_type": "ml.m5.xlarge", "entry_point": "train.py",
        "source_dir": "code", "hyperparameters": {"k": 10, "mode": "fast"}},
        lambda n: "s3://data/train", {}),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_request_matches_sagemaker_v2(aws, case):
    kind, kwargs_of, inputs_of, options = CASES[case]
    region = options.get("region", "us-west-2")
    ours = shoal_request(kind, kwargs_of(shoal_names()), inputs_of(shoal_names()), region)
    theirs = v2_request(kind, kwargs_of(v2_names()), inputs_of(v2_names()), region,
                        local=options.get("local", False))
    if not options.get("local"):  # local requests carry file:// URIs the API would refuse
        validate_with_botocore(ours)
        validate_with_botocore(theirs)
    assert ours["AlgorithmSpecification"]["TrainingImage"] == expected_image(
        kind, kwargs_of(shoal_names()), region) or options.get("local")
    assert without_deliberate_differences(ours) == without_deliberate_differences(theirs)


def test_at_least_thirty_configurations():
    assert len(CASES) >= 30
    kinds = {kind for kind, *_ in CASES.values()}
    assert {"PyTorch", "TensorFlow", "Estimator"} <= kinds


def test_every_distribution_key_is_covered():
    keys = set()
    for _kind, kwargs_of, _, _ in CASES.values():
        keys |= set(kwargs_of(shoal_names()).get("distribution", {}))
    assert keys >= {"smdistributed", "mpi", "torch_distributed", "pytorchddp",
                    "parameter_server", "multi_worker_mirrored_strategy", "instance_groups"}


# ---- every version of the image matrix, with every distribution v2 knows -------------------

SMP = {"smdistributed": {"modelparallel": {"enabled": True, "parameters": {
    "partitions": 2, "microbatches": 4}}}, "mpi": {"enabled": True, "processes_per_host": 8}}
# distribution name -> (distribution dict or None, instance type, instance count)
EVERY_FRAMEWORK = {
    "cpu": (None, "ml.c5.xlarge", 1),
    "smddp": (smddp(), "ml.p4d.24xlarge", 2),
    "modelparallel": (SMP, "ml.p4d.24xlarge", 2),
    "mpi": ({"mpi": {"enabled": True, "processes_per_host": 8}}, "ml.p4d.24xlarge", 2),
}
MATRIX_DISTRIBUTIONS = {
    "pytorch": {
        **EVERY_FRAMEWORK,
        "torch_distributed": ({"torch_distributed": {"enabled": True}}, "ml.p4d.24xlarge", 2),
        "pytorchddp": ({"pytorchddp": {"enabled": True}}, "ml.p4d.24xlarge", 2),
    },
    "tensorflow": {
        **EVERY_FRAMEWORK,
        "mwms": ({"multi_worker_mirrored_strategy": {"enabled": True}}, "ml.p4d.24xlarge", 2),
        "parameter_server": ({"parameter_server": {"enabled": True}}, "ml.c5.xlarge", 2),
    },
}
MATRIX_CASES = [(spec.framework, spec.framework_version, spec.py_version, name)
                for spec in matrix.specs() for name in MATRIX_DISTRIBUTIONS[spec.framework]]


def matrix_kwargs(framework, framework_version, py_version, name):
    """A job of this version and distribution. Its code and output are in S3 already: what
    these cases compare is the version and the distribution (the upload has its own cases)."""
    distribution, instance_type, count = MATRIX_DISTRIBUTIONS[framework][name]
    kwargs = {"entry_point": "train.py", "source_dir": "s3://code-bucket/prebuilt/sourcedir.tar.gz",
              "output_path": "s3://out-bucket/matrix", "role": ROLE,
              "framework_version": framework_version, "py_version": py_version,
              "instance_type": instance_type, "instance_count": count}
    return {**kwargs, "distribution": distribution} if distribution else kwargs


@pytest.fixture(scope="module")
def sdks():
    """One mocked account and one session of each SDK for the matrix's cases (creating the
    sessions' clients had been most of each case's time); fake credentials of its own, as
    the suite's per-test fixture comes after it."""
    from sagemaker.telemetry import telemetry_logging

    with pytest.MonkeyPatch.context() as patch:
        for key in [key for key in os.environ if key.startswith("AWS_")]:
            patch.delenv(key)
        for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
            patch.setenv(key, "testing")
        patch.setenv("AWS_CONFIG_FILE", os.devnull)
        patch.setenv("AWS_SHARED_CREDENTIALS_FILE", os.devnull)
        patch.setenv("AWS_EC2_METADATA_DISABLED", "true")
        patch.setenv("SAGEMAKER_SUPPRESS_V2_WARNING", "1")
        patch.setattr(telemetry_logging, "_requests_helper", lambda *a, **k: None)
        with mock_aws():
            boto_session = boto3.Session(region_name="us-west-2")
            yield types.SimpleNamespace(
                v2=sagemaker.session.Session(boto_session=boto_session),
                shoal=shoal.Session(boto_session=boto_session))


def v2_outcome(kind, kwargs, session):
    """v2's request, or the ValueError with which v2 refuses the configuration."""
    try:
        return v2_request(kind, kwargs, "s3://data/train", session=session), None
    except ValueError as refusal:
        return None, refusal


@pytest.mark.parametrize("framework,version,py_version,name", MATRIX_CASES,
                         ids=["-".join(case) for case in MATRIX_CASES])
def test_every_matrix_version_builds_v2s_request_or_is_refused_as_v2_refuses(
        sdks, framework, version, py_version, name):
    kind = {"pytorch": "PyTorch", "tensorflow": "TensorFlow"}[framework]
    kwargs = matrix_kwargs(framework, version, py_version, name)
    theirs, refusal = v2_outcome(kind, kwargs, sdks.v2)
    if refusal is not None:
        with pytest.raises(shoal.errors.DistributionError) as ours:
            shoal_request(kind, kwargs, "s3://data/train", session=sdks.shoal)
        # the same reason: the strategy and the version v2 names
        strategy = next(iter(kwargs["distribution"]))
        assert f"distribution['{strategy}']" in str(ours.value), (refusal, ours.value)
        assert f"'{version}'" in str(ours.value) and version in str(refusal)
        return
    ours = shoal_request(kind, kwargs, "s3://data/train", session=sdks.shoal)
    validate_with_botocore(ours)
    assert ours["AlgorithmSpecification"]["TrainingImage"] == expected_image(kind, kwargs)
    assert without_deliberate_differences(ours) == without_deliberate_differences(theirs)


MINORS = sorted({(spec.framework, matrix.minor(spec.framework_version)) for spec in matrix.specs()})


@pytest.mark.parametrize("framework,short", MINORS, ids=["-".join(m) for m in MINORS])
def test_a_version_without_its_patch_is_v2s_alias(sdks, framework, short):
    """"1.12" is v2's alias of its newest patch release: the same request, and Shoal's image
    of that release."""
    from sagemaker import image_uris as v2_image_uris

    spec = matrix.find(framework, short)
    assert v2_image_uris.config_for_framework(framework)["training"]["version_aliases"][short] \
        == spec.framework_version
    kind = {"pytorch": "PyTorch", "tensorflow": "TensorFlow"}[framework]
    kwargs = matrix_kwargs(framework, short, spec.py_version, "cpu")
    ours = shoal_request(kind, kwargs, "s3://data/train", session=sdks.shoal)
    assert ours["AlgorithmSpecification"]["TrainingImage"].endswith(
        f":{spec.framework_version}-cpu-{spec.py_version}")
    theirs = v2_request(kind, kwargs, "s3://data/train", session=sdks.v2)
    assert without_deliberate_differences(ours) == without_deliberate_differences(theirs)


def test_the_matrix_holds_every_cuda11_version_v2_accepts():
    """PyTorch 1.10 through 2.0.1 and TensorFlow 2.4.1 through 2.14.1 (its CUDA 11 images:
    v2's TensorFlow 2.3 image is CUDA 10.2, 2.16 on is CUDA 12): every training version of v2's
    own configuration, with v2's Python version."""
    from sagemaker import image_uris as v2_image_uris

    def v2_versions(framework, low, high):
        versions = v2_image_uris.config_for_framework(framework)["training"]["versions"]
        return {(v, tuple(spec["py_versions"])) for v, spec in versions.items()
                if low <= matrix.release(v) <= high}

    ours = {(s.framework, s.framework_version, (s.py_version,)) for s in matrix.specs()}
    wanted = ({("pytorch", *entry) for entry in v2_versions("pytorch", (1, 10), (2, 0, 1))}
              | {("tensorflow", *entry) for entry in v2_versions("tensorflow", (2, 4, 1), (2, 14, 1))})
    assert wanted == ours
