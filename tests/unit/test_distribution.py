"""The distribution dict: parity with the SageMaker Python SDK v2, every rule's message,
the runner and the round trips (hyperparameters and canonical dict)."""

from __future__ import annotations

import copy
import functools
import json
import logging
import os

import boto3
import moto
import pytest
from shoal.distribution import (
    HYPERPARAMETER_NAMES,
    RUNNERS,
    Distribution,
    parse_distribution,
)
from shoal.errors import DistributionError, ValidationError

from tests.unit.messages import assert_message

os.environ.setdefault("SAGEMAKER_SUPPRESS_V2_WARNING", "1")
sagemaker = pytest.importorskip("sagemaker")  # the reference SDK v2 (test extra)
from sagemaker.instance_group import InstanceGroup  # noqa: E402
from sagemaker.local import LocalSession  # noqa: E402
from sagemaker.pytorch import PyTorch  # noqa: E402
from sagemaker.session import Session  # noqa: E402
from sagemaker.tensorflow import TensorFlow  # noqa: E402

ROLE = "arn:aws:iam::123456789012:role/SageMakerRole"
CUSTOM_IMAGE = "123456789012.dkr.ecr.us-west-2.amazonaws.com/my-training:latest"
PT = dict(framework="pytorch", framework_version="1.13.1", py_version="py39",
          instance_type="ml.p4d.24xlarge", instance_count=2)  # fmt: skip
TF = dict(framework="tensorflow", framework_version="2.11", py_version="py39",
          instance_type="ml.p4d.24xlarge", instance_count=2)  # fmt: skip
SMP_V1 = {"partitions": 2, "microbatches": 4, "placement_strategy": "spread",
          "pipeline": "interleaved", "optimize": "speed", "ddp": True}  # fmt: skip
SMP_TF = {"partitions": 2, "microbatches": 4, "horovod": True, "contiguous": False}
MPI8 = {"enabled": True, "processes_per_host": 8}


@functools.lru_cache(maxsize=2)
def _v2_session(local: bool):
    # One session per kind for the module: building one parses botocore's models again.
    with moto.mock_aws():
        boto_session = boto3.Session(region_name="us-west-2")
        return (LocalSession if local else Session)(boto_session=boto_session)


def v2_estimator(distribution, *, framework, entry_point="train.py", **kwargs):
    """The reference SDK's estimator for the same arguments, against a mocked AWS."""
    if kwargs.get("instance_groups"):
        kwargs.pop("instance_count", None)
    cls = PyTorch if framework == "pytorch" else TensorFlow
    session = _v2_session(kwargs.get("instance_type") in ("local", "local_gpu"))
    with moto.mock_aws():
        return cls(
            entry_point=entry_point, role=ROLE, sagemaker_session=session,
            distribution=distribution, **kwargs,
        )  # fmt: skip


def v2_hyperparameters(distribution, **kwargs) -> dict[str, str]:
    est = v2_estimator(distribution, **kwargs)
    with moto.mock_aws():
        hps = est.hyperparameters()
    return {k: v for k, v in hps.items() if k in HYPERPARAMETER_NAMES}


def shoal(distribution, **kwargs) -> Distribution:
    return parse_distribution(copy.deepcopy(distribution), **kwargs)


def encoded(dist: Distribution) -> dict[str, str]:
    return {k: json.dumps(v) for k, v in dist.hyperparameters().items()}


def groups():
    return [InstanceGroup("train", "ml.p4d.24xlarge", 2), InstanceGroup("data", "ml.c5.xlarge", 1)]


# ---------------------------------------------------------------- parity with v2

PARITY = {
    "none": ({}, PT),
    "smddp": ({"smdistributed": {"dataparallel": {"enabled": True}}}, PT),
    "smddp-options": (
        {"smdistributed": {"dataparallel": {
            "enabled": True, "custom_mpi_options": "-verbose -x NCCL_DEBUG=VERSION"}}},
        PT,
    ),  # fmt: skip
    "smddp-disabled": ({"smdistributed": {"dataparallel": {"enabled": False}}}, PT),
    "smddp-no-enabled-key": ({"smdistributed": {"dataparallel": {}}}, PT),
    "smddp-pt-2.2.0": ({"smdistributed": {"dataparallel": {"enabled": True}}},
                       {**PT, "framework_version": "2.2.0", "py_version": "py310"}),
    "smddp-local": ({"smdistributed": {"dataparallel": {"enabled": True}}},
                    {**PT, "instance_type": "local"}),
    "smddp-custom-image": (
        {"smdistributed": {"dataparallel": {"enabled": True}}},
        {**PT, "framework_version": None, "py_version": None, "image_uri": CUSTOM_IMAGE},
    ),
    "pytorchddp": ({"pytorchddp": {"enabled": True}}, PT),
    "pytorchddp-disabled": ({"pytorchddp": {"enabled": False}}, PT),
    "smdistributed-empty": ({"smdistributed": {}}, PT),
    "pytorchddp-options": ({"pytorchddp": {"enabled": True, "custom_mpi_options": "-v"}}, PT),
    "mpi": ({"mpi": {"enabled": True, "processes_per_host": 4,
                     "custom_mpi_options": "--mca btl_vader_single_copy_mechanism none"}}, PT),
    "mpi-no-ppn": ({"mpi": {"enabled": True}}, PT),
    "mpi-disabled": ({"mpi": {"enabled": False, "processes_per_host": 2}}, PT),
    "smp-v1": ({"smdistributed": {"modelparallel": {"enabled": True, "parameters": SMP_V1}},
                "mpi": MPI8}, PT),
    "smp-v1-no-parameters": ({"smdistributed": {"modelparallel": {"enabled": True}},
                              "mpi": MPI8}, PT),
    "smp-v1-disabled": ({"smdistributed": {"modelparallel": {"enabled": False,
                                                             "parameters": SMP_V1}},
                         "mpi": MPI8}, PT),
    "smp-v1-sharded": (
        {"smdistributed": {"modelparallel": {"enabled": True, "parameters": {
            "ddp": True, "sharded_data_parallel_degree": 8, "bf16": True,
            "sdp_reduce_bucket_size": 5e8, "delayed_parameter_initialization": True,
            "placement_strategy": "cluster", "tensor_parallel_degree": 2}}},
         "mpi": MPI8},
        PT,
    ),  # fmt: skip
    "torch-distributed": ({"torch_distributed": {"enabled": True}}, PT),
    "torch-distributed-disabled": ({"torch_distributed": {"enabled": False}}, PT),
    "smp-v2": (
        {"torch_distributed": {"enabled": True},
         "smdistributed": {"modelparallel": {"enabled": True, "parameters": {
             "hybrid_shard_degree": 8, "tensor_parallel_degree": 2,
             "sm_activation_offloading": True}}}},
        {**PT, "framework_version": "2.2.0", "py_version": "py310"},
    ),  # fmt: skip
    "smp-v2-p5": (
        {"torch_distributed": {"enabled": True},
         "smdistributed": {"modelparallel": {"enabled": True,
                                             "parameters": {"hybrid_shard_degree": 8}}}},
        {**PT, "framework_version": "2.2.0", "py_version": "py310",
         "instance_type": "ml.p5.48xlarge"},
    ),  # fmt: skip
    "torch-distributed-with-smddp": ({"torch_distributed": {"enabled": True},
                                     "smdistributed": {"dataparallel": {"enabled": True}}}, PT),
    "smddp-with-mpi": ({"smdistributed": {"dataparallel": {"enabled": True}},
                       "mpi": {"enabled": True, "custom_mpi_options": "-v"}}, PT),
    "smp-v1-custom-image": (
        {"smdistributed": {"modelparallel": {"enabled": True, "parameters": SMP_V1}},
         "mpi": MPI8},
        {**PT, "framework_version": None, "py_version": None, "image_uri": CUSTOM_IMAGE},
    ),
    "groups-p5-torch-distributed": (
        {"torch_distributed": {"enabled": True}, "instance_groups": ["train"]},
        {**PT, "framework_version": "2.2.0", "py_version": "py310", "instance_type": None,
         "instance_groups": "p5"},
    ),
    "torch-distributed-trainium": ({"torch_distributed": {"enabled": True}},
                                   {**PT, "instance_type": "ml.trn1.32xlarge"}),
    "torch-distributed-custom-image": (
        {"torch_distributed": {"enabled": True}},
        {**PT, "framework_version": None, "py_version": None, "image_uri": CUSTOM_IMAGE,
         "instance_type": "ml.c5.xlarge"},
    ),  # fmt: skip
    "groups-named": (
        {"smdistributed": {"dataparallel": {"enabled": True}}, "instance_groups": ["train"]},
        {**PT, "instance_type": None, "instance_groups": "two"},
    ),
    "groups-one-implicit": (
        {"mpi": {"enabled": True}},
        {**PT, "instance_type": None, "instance_groups": "one"},
    ),
    "groups-torch-distributed": (
        {"torch_distributed": {"enabled": True}},
        {**PT, "instance_type": None, "instance_groups": "one"},
    ),
    "tf-parameter-server": ({"parameter_server": {"enabled": True}},
                            {**TF, "instance_type": "ml.c5.xlarge"}),
    "tf-mwms": ({"multi_worker_mirrored_strategy": {"enabled": True}}, TF),
    "tf-mwms-disabled-with-ps": (
        {"multi_worker_mirrored_strategy": {"enabled": False}, "parameter_server": {"enabled": True}},
        TF,
    ),
    "tf-smddp": ({"smdistributed": {"dataparallel": {"enabled": True}}}, TF),
    "tf-smp": ({"smdistributed": {"modelparallel": {"enabled": True, "parameters": SMP_TF}},
                "mpi": {**MPI8, "custom_mpi_options": "-x FOO=bar"}}, TF),
    "tf-horovod-mpi": ({"mpi": {"enabled": True, "processes_per_host": 8}}, TF),
}  # fmt: skip


def _with_groups(kwargs):
    kwargs = dict(kwargs)
    made = groups()
    if kwargs.get("instance_groups") == "two":
        kwargs["instance_groups"] = made
    elif kwargs.get("instance_groups") == "p5":
        made = [InstanceGroup("train", "ml.p5.48xlarge", 2), InstanceGroup("data", "ml.c5.xlarge", 1)]
        kwargs["instance_groups"] = made
    elif kwargs.get("instance_groups") == "one":
        kwargs["instance_groups"] = made[:1]
    return kwargs, made


@pytest.mark.parametrize("name", sorted(PARITY))
def test_hyperparameters_match_v2(name):
    distribution, kwargs = PARITY[name]
    kwargs, made = _with_groups(kwargs)
    theirs = v2_hyperparameters(_v2_distribution(distribution, made), **_v2_kwargs(kwargs))
    ours = encoded(shoal(distribution, **kwargs))
    assert ours == theirs


def _v2_distribution(distribution, made):
    theirs = copy.deepcopy(distribution)
    if isinstance(theirs.get("instance_groups"), list):  # v2 takes the InstanceGroup objects
        theirs["instance_groups"] = [
            next((g for g in made if g.instance_group_name == name), name)
            for name in theirs["instance_groups"]
        ]
    return theirs


def _v2_kwargs(kwargs):
    out = {k: v for k, v in kwargs.items() if v is not None or k == "framework"}
    return out


def test_parameters_file_matches_v2(tmp_path):
    path = tmp_path / "smp.json"
    path.write_text(json.dumps(SMP_V1))
    distribution = {"smdistributed": {"modelparallel": {"enabled": True, "parameters": str(path)}},
                    "mpi": MPI8}  # fmt: skip
    theirs = v2_hyperparameters(copy.deepcopy(distribution), **PT)
    assert encoded(shoal(distribution, **PT)) == theirs
    assert json.loads(theirs["mp_parameters"]) == SMP_V1


def test_v2_emits_only_the_distribution_names_we_know():
    distribution = {"smdistributed": {"modelparallel": {"enabled": True, "parameters": SMP_V1}},
                    "mpi": MPI8}  # fmt: skip
    est = v2_estimator(copy.deepcopy(distribution), **PT)
    with moto.mock_aws():
        names = set(est.hyperparameters())
    assert names - set(HYPERPARAMETER_NAMES) <= {
        "sagemaker_program", "sagemaker_submit_directory", "sagemaker_container_log_level",
        "sagemaker_job_name", "sagemaker_region", "model_dir",
    }  # fmt: skip


# Distributions that v2 and Shoal both refuse (v2 sometimes only when it builds hyperparameters).
REJECTED_BY_BOTH = {
    "smddp-short-version": ({"smdistributed": {"dataparallel": {"enabled": True}}},
                            {**PT, "framework_version": "1.13"}),
    "smddp-tf-2.12": ({"smdistributed": {"dataparallel": {"enabled": True}}},
                      {**TF, "framework_version": "2.12"}),
    "two-smdistributed": ({"smdistributed": {"dataparallel": {"enabled": True},
                                             "modelparallel": {"enabled": False}}}, PT),
    "unknown-smdistributed": ({"smdistributed": {"dataparalel": {"enabled": True}}}, PT),
    "trainium-smddp": ({"smdistributed": {"dataparallel": {"enabled": True}}},
                       {**PT, "instance_type": "ml.trn1.32xlarge"}),
    "trainium-two": ({"torch_distributed": {"enabled": True}, "mpi": {"enabled": True}},
                     {**PT, "instance_type": "ml.trn1.32xlarge"}),
    "p5-smddp": ({"smdistributed": {"dataparallel": {"enabled": True}}},
                 {**PT, "instance_type": "ml.p5.48xlarge"}),
    "pytorchddp-and-smdistributed": ({"pytorchddp": {"enabled": True},
                                      "smdistributed": {"dataparallel": {"enabled": True}}}, PT),
    "mwms-old-tf": ({"multi_worker_mirrored_strategy": {"enabled": True}},
                    {**TF, "framework_version": "2.8"}),
    "mwms-with-ps": ({"multi_worker_mirrored_strategy": {"enabled": True},
                      "parameter_server": {"enabled": True}}, TF),
    "mwms-pytorch": ({"multi_worker_mirrored_strategy": {"enabled": True}}, PT),
    "torch-distributed-cpu": ({"torch_distributed": {"enabled": True}},
                              {**PT, "instance_type": "ml.c5.xlarge"}),
    "torch-distributed-local": ({"torch_distributed": {"enabled": True}},
                                {**PT, "instance_type": "local"}),
    "torch-distributed-old": ({"torch_distributed": {"enabled": True}},
                              {**PT, "framework_version": "1.12.1"}),
    "torch-distributed-shell": ({"torch_distributed": {"enabled": True}},
                                {**PT, "entry_point": "train.sh"}),
    "groups-without-estimator-groups": ({"mpi": {"enabled": True}, "instance_groups": ["x"]}, PT),
    "groups-without-strategy": ({"mpi": {"enabled": False}},
                                {**PT, "instance_type": None, "instance_groups": "one"}),
    "groups-two-unnamed": ({"mpi": {"enabled": True}},
                           {**PT, "instance_type": None, "instance_groups": "two"}),
    "smp-default-partition": (
        {"smdistributed": {"modelparallel": {"enabled": True, "parameters": {
            "partitions": 2, "default_partition": 2}}}, "mpi": MPI8}, PT),
    "smp-manual-without-default": (
        {"smdistributed": {"modelparallel": {"enabled": True, "parameters": {
            "partitions": 2, "auto_partition": False}}}, "mpi": MPI8}, PT),
    "smp-memory-weight": (
        {"smdistributed": {"modelparallel": {"enabled": True, "parameters": {
            "partitions": 2, "memory_weight": 1.5}}}, "mpi": MPI8}, PT),
    "smp-pipeline": (
        {"smdistributed": {"modelparallel": {"enabled": True, "parameters": {
            "partitions": 2, "pipeline": "fast"}}}, "mpi": MPI8}, PT),
    "smp-microbatches": (
        {"smdistributed": {"modelparallel": {"enabled": True, "parameters": {
            "partitions": 2, "microbatches": 0}}}, "mpi": MPI8}, PT),
    "smp-ddp-port": (
        {"smdistributed": {"modelparallel": {"enabled": True, "parameters": {
            "partitions": 2, "ddp_port": 7777}}}, "mpi": MPI8}, PT),
    "smp-missing-file": (
        {"smdistributed": {"modelparallel": {"enabled": True,
                                             "parameters": "/nonexistent/smp.json"}},
         "mpi": MPI8}, PT),
    "smp-ddp-and-horovod": (
        {"smdistributed": {"modelparallel": {"enabled": True, "parameters": {
            "partitions": 2, "ddp": True, "horovod": True}}}, "mpi": MPI8}, PT),
    "smddp-new-cuda-image": (
        {"smdistributed": {"dataparallel": {"enabled": True}}},
        {**PT, "image_uri": "763104351884.dkr.ecr.us-west-2.amazonaws.com/"
                            "pytorch-training:2.0.1-gpu-py310-cu121-ubuntu20.04-sagemaker"}),
    # v2 asks for mpi or smddp with instance groups once smdistributed is present.
    "groups-torch-distributed-smp": (
        {"torch_distributed": {"enabled": True}, "instance_groups": ["train"],
         "smdistributed": {"modelparallel": {"enabled": True,
                                             "parameters": {"tensor_parallel_degree": 8}}}},
        {**PT, "framework_version": "2.2.0", "py_version": "py310", "instance_type": None,
         "instance_groups": "p5"},
    ),
    "pytorchxla-without-compiler": ({"pytorchxla": {"enabled": True}}, PT),
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(REJECTED_BY_BOTH))
def test_rejected_like_v2(name):
    distribution, kwargs = REJECTED_BY_BOTH[name]
    kwargs, made = _with_groups(kwargs)
    with pytest.raises(ValueError):
        v2_hyperparameters(_v2_distribution(distribution, made), **_v2_kwargs(kwargs))
    with pytest.raises(DistributionError):
        shoal(distribution, **kwargs)


# ---------------------------------------------------------------- Shoal's messages


def rejects(distribution, message, **kwargs):
    """Assert that parsing fails with exactly this message (a regex when it starts with ^)."""
    kwargs = {**PT, **kwargs}
    with pytest.raises(DistributionError) as info:
        parse_distribution(distribution, **kwargs)
    text = str(info.value)
    return assert_message(text, message)


def test_error_is_a_validation_error():
    assert issubclass(DistributionError, ValidationError)
    assert issubclass(DistributionError, ValueError)


def test_enabled_must_be_a_bool():
    rejects({"smdistributed": {"dataparallel": {"enabled": "yes"}}},
            "distribution['smdistributed']['dataparallel']['enabled'] must be a bool (got 'yes')")
    rejects({"mpi": {"enabled": 1}}, "distribution['mpi']['enabled'] must be a bool (got 1)")
    rejects({"torch_distributed": {"enabled": "true"}},
            "distribution['torch_distributed']['enabled'] must be a bool (got 'true')")


def test_distribution_must_be_a_dict():
    rejects([("mpi", {})], "^distribution must be a dict \\(got \\[")
    rejects({"mpi": True}, "distribution['mpi'] must be a dict (got True)")
    rejects({"smdistributed": ["dataparallel"]},
            "distribution['smdistributed'] must be a dict (got ['dataparallel'])")


def test_unknown_framework():
    rejects({}, "framework must be one of ['pytorch', 'tensorflow', None] (got 'mxnet')",
            framework="mxnet")


def test_unknown_top_level_key_suggests():
    rejects({"smdistributd": {}},
            "^distribution has an unknown key 'smdistributd': did you mean 'smdistributed'\\?")
    rejects({"torch_distrbuted": {"enabled": True}},
            "^distribution has an unknown key 'torch_distrbuted': did you mean 'torch_distributed'")
    rejects({"banana": {}}, "^distribution has an unknown key 'banana' \\(this estimator accepts")


def test_unknown_nested_key_suggests():
    rejects({"smdistributed": {"dataparalel": {"enabled": True}}},
            "^distribution\\['smdistributed'\\] has an unknown strategy 'dataparalel': "
            "did you mean 'dataparallel'\\?")
    rejects({"smdistributed": {"dataparallel": {"enabled": True, "custom_mpi_option": "-v"}}},
            "^distribution\\['smdistributed'\\]\\['dataparallel'\\] has an unknown key "
            "'custom_mpi_option': did you mean 'custom_mpi_options'\\?")
    rejects({"mpi": {"enabled": True, "process_per_host": 2}},
            "^distribution\\['mpi'\\] has an unknown key 'process_per_host': "
            "did you mean 'processes_per_host'\\?")


def test_strategy_of_another_framework():
    rejects({"torch_distributed": {"enabled": True}},
            "distribution['torch_distributed'] is only supported by the pytorch estimator, "
            "not tensorflow", **TF)
    rejects({"pytorchddp": {"enabled": True}},
            "distribution['pytorchddp'] is only supported by the pytorch estimator, "
            "not tensorflow", **TF)
    rejects({"parameter_server": {"enabled": True}},
            "^distribution\\['parameter_server'\\]: the PyTorch containers have no parameter server")
    rejects({"multi_worker_mirrored_strategy": {"enabled": True}},
            "^distribution\\['multi_worker_mirrored_strategy'\\]: MultiWorkerMirroredStrategy is "
            "only supported by the TensorFlow estimator")


def test_generic_estimator_with_a_custom_image():
    generic = dict(framework=None, image_uri=CUSTOM_IMAGE, instance_type="ml.p4d.24xlarge",
                   instance_count=2)  # fmt: skip
    dist = parse_distribution({"smdistributed": {"dataparallel": {"enabled": True}}}, **generic)
    assert dist.hyperparameters() == {
        "sagemaker_distributed_dataparallel_enabled": True,
        "sagemaker_instance_type": "ml.p4d.24xlarge",
        "sagemaker_distributed_dataparallel_custom_mpi_options": "",
    }
    ps = parse_distribution({"parameter_server": {"enabled": True}}, **generic)
    assert ps.hyperparameters() == {"sagemaker_parameter_server_enabled": True}
    assert ps.runner == "parameter_server"
    rejects({"torch_distributed": {"enabled": True}},
            "distribution['torch_distributed'] is only supported by the pytorch estimator, "
            "not a generic estimator", **generic)


def test_pytorchxla_needs_training_compiler():
    rejects({"pytorchxla": {"enabled": True}},
            "^distribution\\['pytorchxla'\\]: distributed training through PyTorch XLA needs "
            "SageMaker Training Compiler")


def test_processes_per_host():
    rejects({"mpi": {"enabled": True, "processes_per_host": 0}},
            "distribution['mpi']['processes_per_host'] must be >= 1 (got 0)")
    rejects({"mpi": {"enabled": True, "processes_per_host": "8"}},
            "distribution['mpi']['processes_per_host'] must be an int (got '8')")
    rejects({"mpi": {"enabled": True, "processes_per_host": True}},
            "distribution['mpi']['processes_per_host'] must be an int (got True)")


def test_custom_mpi_options_must_be_a_string():
    rejects({"mpi": {"enabled": True, "custom_mpi_options": ["-v"]}},
            "distribution['mpi']['custom_mpi_options'] must be a str (got ['-v'])")
    rejects({"smdistributed": {"dataparallel": {"enabled": True, "custom_mpi_options": 3}}},
            "distribution['smdistributed']['dataparallel']['custom_mpi_options'] must be a str "
            "(got 3)")
    rejects({"mpi": {"enabled": True, "custom_mpi_options": "-x 'FOO"}},
            "^distribution\\['mpi'\\]\\['custom_mpi_options'\\] is not a valid mpirun option "
            "string")


@pytest.mark.parametrize("option", [
    "-x AWS_SECRET_ACCESS_KEY",
    "-x AWS_ACCESS_KEY_ID",
    "-verbose -x AWS_SESSION_TOKEN -x NCCL_DEBUG=INFO",
    "-x AWS_SECRET_ACCESS_KEY=abc",
    "--mca mca_base_env_list AWS_ACCESS_KEY_ID",
])  # fmt: skip
def test_custom_mpi_options_never_forward_credentials(option):
    text = rejects(
        {"smdistributed": {"dataparallel": {"enabled": True, "custom_mpi_options": option}}},
        "^distribution\\['smdistributed'\\]\\['dataparallel'\\]\\['custom_mpi_options'\\] "
        "must not forward AWS_[A-Z_]+ to the ranks",
    )
    assert "IAM role" in text
    rejects({"mpi": {"enabled": True, "custom_mpi_options": option}},
            "^distribution\\['mpi'\\]\\['custom_mpi_options'\\] must not forward AWS_")
    rejects({"pytorchddp": {"enabled": True, "custom_mpi_options": option}},
            "^distribution\\['pytorchddp'\\]\\['custom_mpi_options'\\] must not forward AWS_")


def test_custom_mpi_options_messages_never_show_values():
    text = rejects({"mpi": {"enabled": True, "custom_mpi_options": "-x AWS_SECRET_ACCESS_KEY=s3cr3t"}},
                   "distribution['mpi']['custom_mpi_options'] must not forward "
                   "AWS_SECRET_ACCESS_KEY to the ranks: credentials reach the job through its "
                   "IAM role")
    assert "s3cr3t" not in text


@pytest.mark.parametrize("option", [
    "-x DB_PASSWORD=hunter2",
    "-verbose -x HF_API_KEY=abc123 -x NCCL_DEBUG=INFO",
    "--x WANDB_TOKEN=xyz",
])  # fmt: skip
def test_custom_mpi_options_refuse_exported_secrets(option):
    text = rejects({"mpi": {"enabled": True, "custom_mpi_options": option}},
                   "^distribution\\['mpi'\\]\\['custom_mpi_options'\\] sets [A-Z_]+ on the "
                   "command line \\(a secret-looking variable\\)")
    assert option.split("=")[1].split()[0] not in text


def test_custom_mpi_options_refuse_credential_values():
    text = rejects({"mpi": {"enabled": True, "custom_mpi_options": "-x KEY_ID=AKIAABCDEFGHIJKLMNOP"}},
                   "distribution['mpi']['custom_mpi_options'] holds what looks like a secret "
                   "(AWS access key id)")
    assert "AKIA" not in text


@pytest.mark.parametrize("option", [
    "-x DB_PASSWORD",  # forwards the launching host's own variable: nothing stored
    "-x NCCL_DEBUG=INFO -x TOKENIZERS_PARALLELISM=false -x MAX_TOKENS=5",
    "--mca btl_vader_single_copy_mechanism none -bind-to none",
])  # fmt: skip
def test_custom_mpi_options_allowed(option):
    dist = parse_distribution({"mpi": {"enabled": True, "custom_mpi_options": option}}, **PT)
    assert dist.hyperparameters()["sagemaker_mpi_custom_mpi_options"] == option


def test_custom_mpi_options_fit_in_a_hyperparameter():
    rejects({"mpi": {"enabled": True, "custom_mpi_options": "-v " * 1000}},
            "distribution['mpi']['custom_mpi_options'] must encode to <= 2500 characters as a "
            "hyperparameter (got 3002)")


def test_one_smdistributed_strategy():
    rejects({"smdistributed": {"dataparallel": {"enabled": True},
                               "modelparallel": {"enabled": False}}},
            "distribution['smdistributed'] holds ['dataparallel', 'modelparallel']: use one "
            "smdistributed strategy at a time, one of ['dataparallel', 'modelparallel']")


def test_smddp_versions():
    rejects({"smdistributed": {"dataparallel": {"enabled": True}}},
            "^distribution\\['smdistributed'\\]\\['dataparallel'\\]: framework_version '1.13' "
            "is not supported by the data-parallel library \\(did you mean '1.13.1'\\?\\); "
            "supported: \\[", framework_version="1.13")
    rejects({"smdistributed": {"dataparallel": {"enabled": True}}},
            "^.*framework_version '2.12' is not supported by the data-parallel library; "
            "supported: \\['2.3'", **{**TF, "framework_version": "2.12"})
    rejects({"smdistributed": {"dataparallel": {"enabled": True}}},
            "^distribution\\[.smdistributed.\\]\\[.dataparallel.\\]: py_version .py2. is not "
            "supported: use py3 or later$",
            py_version="py2")
    rejects({"smdistributed": {"dataparallel": {"enabled": True}}},
            "^.*: it needs an instance_type$", instance_type=None)


def test_smddp_disabled_skips_version_rules():
    dist = parse_distribution({"smdistributed": {"dataparallel": {"enabled": False}}},
                              **{**PT, "framework_version": "1.5.0"})
    assert not dist.smdataparallel_enabled


def test_custom_image_relaxes_versions():
    dist = parse_distribution({"smdistributed": {"dataparallel": {"enabled": True}}},
                              **{**PT, "framework_version": "9.9", "image_uri": CUSTOM_IMAGE})
    assert dist.smdataparallel_enabled


def test_trainium_rule():
    rejects({"smdistributed": {"dataparallel": {"enabled": True}}},
            "distribution ['smdistributed'] is not supported on Trainium instances "
            "(ml.trn1.32xlarge): use exactly one of ['torch_distributed']",
            instance_type="ml.trn1.32xlarge")
    rejects({"torch_distributed": {"enabled": True}, "mpi": {"enabled": True}},
            "^distribution \\['torch_distributed', 'mpi'\\] is not supported on Trainium",
            instance_type="ml.trn1.32xlarge")
    rejects({"pytorchddp": {"enabled": True}},
            "^distribution \\['pytorchddp'\\] is not supported on Trainium",
            instance_type="ml.trn1n.32xlarge")
    dist = parse_distribution({"torch_distributed": {"enabled": True}},
                              **{**PT, "instance_type": "ml.trn1.32xlarge"})
    assert dist.runner == "torch_distributed"


def test_p5_rule():
    rejects({"smdistributed": {"dataparallel": {"enabled": True}}},
            "distribution['smdistributed']: the model-parallel and data-parallel libraries do "
            "not support p5 instances (ml.p5.48xlarge); use 'torch_distributed'",
            instance_type="ml.p5.48xlarge")
    # v2 refuses smdistributed on p5 even when the library is disabled.
    rejects({"smdistributed": {"dataparallel": {"enabled": False}}}, "^.*p5 instances",
            instance_type="ml.p5.48xlarge")
    rejects({"smdistributed": {"dataparallel": {"enabled": True}}}, "^.*p5 instances",
            instance_type=None, instance_groups=[InstanceGroup("a", "ml.p5.48xlarge", 1)])


def test_new_cuda_image_rule():
    rejects({"smdistributed": {"dataparallel": {"enabled": True}}},
            "^distribution\\['smdistributed'\\] does not run on image '.*2.0.1-gpu-py310-cu121",
            image_uri="acct.dkr.ecr.us-west-2.amazonaws.com/pt:2.0.1-gpu-py310-cu121-ubuntu20.04")


def test_pytorchddp_with_smdistributed():
    rejects({"pytorchddp": {"enabled": True}, "smdistributed": {"dataparallel": {"enabled": True}}},
            "distribution cannot hold both 'pytorchddp' and 'smdistributed': pytorchddp runs on "
            "smdistributed.dataparallel; keep one of them")


def test_pytorchddp_follows_smddp_version_rules():
    rejects({"pytorchddp": {"enabled": True}},
            "^distribution\\['pytorchddp'\\]: framework_version '2.3.0' is not supported by the "
            "data-parallel library",
            framework_version="2.3.0")


def test_modelparallel_requires_mpi():
    message = ("distribution['smdistributed']['modelparallel'] runs under MPI: add "
               "'mpi': {'enabled': True, 'processes_per_host': <GPUs per host>} "
               "(or, for the PyTorch library launched by torchrun, 'torch_distributed')")  # fmt: skip
    rejects({"smdistributed": {"modelparallel": {"enabled": True, "parameters": SMP_V1}}},
            message)
    rejects({"smdistributed": {"modelparallel": {"enabled": True, "parameters": SMP_V1}},
             "mpi": {"enabled": False}}, message)


def test_torch_distributed_rules():
    rejects({"torch_distributed": {"enabled": True}},
            "distribution['torch_distributed']: it runs only on GPU and Trainium instances "
            "(got 'ml.c5.xlarge')", instance_type="ml.c5.xlarge")
    rejects({"torch_distributed": {"enabled": True}},
            "^distribution\\['torch_distributed'\\]: framework_version '1.12.1' is not supported "
            "by torch_distributed on ml.p4d.24xlarge; supported: \\['1.13.1'",
            framework_version="1.12.1")
    rejects({"torch_distributed": {"enabled": True}},
            "^.*framework_version '2.0' is not supported by torch_distributed on "
            "ml.p4d.24xlarge \\(did you mean '2.0.1'\\?\\)", framework_version="2.0")
    rejects({"torch_distributed": {"enabled": True}},
            "distribution['torch_distributed']: the entry point must be a Python file (*.py) "
            "(got 'train.sh')", entry_point="train.sh")
    rejects({"torch_distributed": {"enabled": True}},
            "^distribution\\['torch_distributed'\\]: py_version 'py2' is not supported",
            py_version="py2")


def test_torch_distributed_and_mpi_conflict():
    rejects({"torch_distributed": {"enabled": True}, "mpi": {"enabled": True}},
            "distribution['torch_distributed'] and distribution['mpi'] both launch the training "
            "script: enable one of them")
    dist = parse_distribution({"torch_distributed": {"enabled": True}, "mpi": {"enabled": False}},
                              **PT)
    assert dist.runner == "torch_distributed"


def test_placement_permutations_beyond_v2():
    # v2 only lets 'cluster' and 'spread' through; the library documents the D/P/T orders too.
    params = {"partitions": 2, "tensor_parallel_degree": 2, "ddp": True,
              "placement_strategy": "TPD"}  # fmt: skip
    dist = parse_distribution(
        {"smdistributed": {"modelparallel": {"enabled": True, "parameters": params}},
         "mpi": MPI8}, **PT)  # fmt: skip
    assert dist.mp_parameters["placement_strategy"] == "TPD"


def test_mwms_rules():
    rejects({"multi_worker_mirrored_strategy": {"enabled": True}},
            "distribution['multi_worker_mirrored_strategy'] needs TensorFlow >= 2.9 "
            "(got '2.8.0')", **{**TF, "framework_version": "2.8.0"})
    rejects({"multi_worker_mirrored_strategy": {"enabled": True},
             "parameter_server": {"enabled": False}},
            "distribution['multi_worker_mirrored_strategy'] cannot be combined with "
            "['parameter_server']", **TF)
    rejects({"multi_worker_mirrored_strategy": {"enabled": True},
             "smdistributed": {"dataparallel": {"enabled": False}}},
            "^.*cannot be combined with \\['smdistributed'\\]", **TF)


def test_instance_group_rules():
    two = groups()
    base = {**PT, "instance_type": None}
    rejects({"mpi": {"enabled": True}, "instance_groups": ["train"]},
            "distribution['instance_groups'] names training groups, but the estimator has no "
            "instance_groups")
    rejects({"mpi": {"enabled": True}},
            "distribution['instance_groups'] must name exactly one of the estimator's instance "
            "groups ['train', 'data'] (got 0)", **base, instance_groups=two)
    rejects({"mpi": {"enabled": True}, "instance_groups": ["train", "data"]},
            "^.*must name exactly one of the estimator's instance groups", **base,
            instance_groups=two)
    rejects({"mpi": {"enabled": True}, "instance_groups": ["a", "b", "c"]},
            "distribution['instance_groups'] lists 3 groups, more than the estimator's 2",
            **base, instance_groups=two)
    rejects({"mpi": {"enabled": True}, "instance_groups": ["trian"]},
            "distribution['instance_groups'] names 'trian', which is not one of the estimator's "
            "instance groups ['train', 'data']: did you mean 'train'?", **base, instance_groups=two)
    rejects({"mpi": {"enabled": True}, "instance_groups": "train"},
            "distribution['instance_groups'] must be a list of instance groups (got 'train')",
            **base, instance_groups=two)
    rejects({"mpi": {"enabled": True}, "instance_groups": [3]},
            "distribution['instance_groups'] must hold instance group names or InstanceGroup "
            "objects (got 3)", **base, instance_groups=two)
    rejects({"parameter_server": {"enabled": True}, "instance_groups": ["train"]},
            "distribution['instance_groups'] ['train'] needs a strategy that launches across "
            "the group: enable 'mpi' or smdistributed 'dataparallel'",
            **{**TF, "instance_type": None}, instance_groups=two)


def test_instance_groups_accept_objects_and_names():
    two = groups()
    by_object = parse_distribution({"mpi": {"enabled": True}, "instance_groups": [two[0]]},
                                   **{**PT, "instance_type": None}, instance_groups=two)
    by_name = parse_distribution({"mpi": {"enabled": True}, "instance_groups": ["train"]},
                                 **{**PT, "instance_type": None}, instance_groups=two)
    assert by_object == by_name
    assert by_name.instance_groups == ("train",)


def test_instance_group_types_are_checked():
    two = [InstanceGroup("train", "ml.c5.xlarge", 2), InstanceGroup("gpu", "ml.p4d.24xlarge", 1)]
    rejects({"torch_distributed": {"enabled": True}, "instance_groups": ["train"]},
            "^.*it runs only on GPU and Trainium instances \\(got 'ml.c5.xlarge'\\)",
            **{**PT, "instance_type": None}, instance_groups=two)
    ok = parse_distribution({"torch_distributed": {"enabled": True}, "instance_groups": ["gpu"]},
                            **{**PT, "instance_type": None}, instance_groups=two)
    assert ok.instance_groups == ("gpu",)


def test_parameter_server_on_multi_gpu_warns(caplog):
    with caplog.at_level(logging.WARNING, logger="shoal.distribution"):
        parse_distribution({"parameter_server": {"enabled": True}}, **TF)
    assert "parameter server uses one GPU per host" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="shoal.distribution"):
        parse_distribution({"parameter_server": {"enabled": True}},
                           **{**TF, "instance_type": "ml.p3.2xlarge"})
    assert caplog.text == ""


def test_modelparallel_parameter_errors_name_the_path():
    rejects({"smdistributed": {"modelparallel": {"enabled": True, "parameters": {
        "partitions": 2, "microbatch": 4}}}, "mpi": MPI8},
        "distribution['smdistributed']['modelparallel']['parameters'] has an unknown parameter "
        "'microbatch': did you mean 'microbatches'?")  # fmt: skip
    rejects({"smdistributed": {"modelparallel": {"enabled": True, "parameters": 7}},
             "mpi": MPI8},
            "distribution['smdistributed']['modelparallel']['parameters'] must be a dict or the "
            "path of a JSON file (got 7)")


def test_modelparallel_parameters_fit_in_a_hyperparameter():
    rejects({"smdistributed": {"modelparallel": {"enabled": True, "parameters": {
        "partitions": 2, "partition_file": "p" * 2600}}}, "mpi": MPI8},
        "distribution['smdistributed']['modelparallel']['parameters'] must encode to <= 2500 "
        "characters as a hyperparameter (got 2639)")  # fmt: skip


def smp_layout(params, processes=8, **kwargs):
    return {"smdistributed": {"modelparallel": {"enabled": True, "parameters": params}},
            "mpi": {"enabled": True, "processes_per_host": processes}}  # fmt: skip


def test_model_parallel_degrees_divide_the_ranks():
    rejects(smp_layout({"partitions": 3}),
            "distribution['smdistributed']['modelparallel']['parameters']: "
            "pipeline_parallel_degree (3) x tensor_parallel_degree (1) = 3 must divide the 16 "
            "ranks (processes_per_host 8 x 2 hosts)")
    rejects(smp_layout({"pipeline_parallel_degree": 2, "tensor_parallel_degree": 4, "ddp": True},
                       processes=6),
            "^.*= 8 must divide the 12 ranks \\(processes_per_host 6 x 2 hosts\\)$")
    rejects(smp_layout({"ddp": True, "tensor_parallel_degree": 2,
                        "sharded_data_parallel_degree": 3}),
            "distribution['smdistributed']['modelparallel']['parameters']: "
            "sharded_data_parallel_degree (3) must divide the data-parallel degree "
            "(8 = 16 ranks / 2 model-parallel ranks)")
    ok = parse_distribution(smp_layout({"ddp": True, "tensor_parallel_degree": 2,
                                        "pipeline_parallel_degree": 2,
                                        "sharded_data_parallel_degree": 4}), **PT)
    assert ok.modelparallel_enabled


def test_model_parallel_layout_counts_the_training_group():
    two = [InstanceGroup("train", "ml.p4d.24xlarge", 3), InstanceGroup("data", "ml.c5.xlarge", 1)]
    rejects({**smp_layout({"partitions": 16}), "instance_groups": ["train"]},
            "^.*= 16 must divide the 24 ranks \\(processes_per_host 8 x 3 hosts\\)$",
            **{**PT, "instance_type": None, "instance_count": None}, instance_groups=two)


def test_model_parallel_layout_needs_known_processes():
    # Without processes_per_host the ranks are one per GPU, known only on the hosts.
    dist = parse_distribution(
        {"smdistributed": {"modelparallel": {"enabled": True, "parameters": {"partitions": 3}}},
         "mpi": {"enabled": True}}, **PT)  # fmt: skip
    assert dist.processes_per_host is None


def test_tensorflow_smp_parameters():
    rejects({"smdistributed": {"modelparallel": {"enabled": True, "parameters": {
        "partitions": 2, "ddp": True}}}, "mpi": MPI8},
        "distribution['smdistributed']['modelparallel']['parameters']['ddp'] is a pytorch "
        "parameter; it does not apply to tensorflow", **TF)  # fmt: skip
    rejects({"smdistributed": {"modelparallel": {"enabled": True, "parameters": {
        "microbatches": 2}}}, "mpi": MPI8},
        "distribution['smdistributed']['modelparallel']['parameters']['partitions'] is required "
        "for TensorFlow", **TF)  # fmt: skip


# ---------------------------------------------------------------- runner, round trips


@pytest.mark.parametrize("distribution,kwargs,runner,ppn", [
    ({}, PT, "process", None),
    ({"smdistributed": {"dataparallel": {"enabled": True}}}, PT, "smddp", None),
    ({"smdistributed": {"dataparallel": {"enabled": False}}}, PT, "process", None),
    ({"pytorchddp": {"enabled": True}}, PT, "smddp", None),
    ({"mpi": {"enabled": True, "processes_per_host": 4}}, PT, "mpi", 4),
    ({"mpi": {"enabled": False, "processes_per_host": 4}}, PT, "process", None),
    ({"smdistributed": {"modelparallel": {"enabled": True, "parameters": SMP_V1}},
      "mpi": MPI8}, PT, "mpi", 8),
    ({"torch_distributed": {"enabled": True}}, PT, "torch_distributed", None),
    ({"parameter_server": {"enabled": True}}, TF, "parameter_server", None),
    ({"multi_worker_mirrored_strategy": {"enabled": True}}, TF, "mwms", None),
    ({"mpi": {"enabled": True}}, TF, "mpi", None),
])  # fmt: skip
def test_runner(distribution, kwargs, runner, ppn):
    dist = parse_distribution(distribution, **kwargs)
    assert dist.runner == runner
    assert runner in RUNNERS
    assert dist.processes_per_host == ppn


def test_flags():
    dist = parse_distribution({"smdistributed": {"modelparallel": {"enabled": True,
                                                                   "parameters": SMP_V1}},
                               "mpi": MPI8}, **PT)  # fmt: skip
    assert (dist.modelparallel_enabled, dist.smdataparallel_enabled) == (True, False)
    assert dist.mp_parameters == SMP_V1
    dist = parse_distribution({"pytorchddp": {"enabled": True}}, **PT)
    assert (dist.modelparallel_enabled, dist.smdataparallel_enabled) == (False, True)


@pytest.mark.parametrize("name", ["smp-v1", "pytorchddp-options", "groups-named", "smp-v2"])
def test_the_users_dict_is_left_alone(name):
    distribution, kwargs = PARITY[name]
    kwargs, _ = _with_groups(kwargs)
    given = copy.deepcopy(distribution)
    parse_distribution(given, **kwargs)
    assert given == distribution


def test_none_is_no_distribution():
    dist = parse_distribution(None, **PT)
    assert dist.hyperparameters() == {}
    assert dist.to_dict() == {}
    assert dist.runner == "process"


def test_hyperparameter_values_are_not_encoded():
    dist = parse_distribution({"mpi": {"enabled": True, "processes_per_host": 2}}, **PT)
    assert dist.hyperparameters()["sagemaker_mpi_enabled"] is True
    assert dist.hyperparameters()["sagemaker_mpi_num_of_processes_per_host"] == 2


def test_distribution_is_frozen():
    dist = parse_distribution({"mpi": {"enabled": True}}, **PT)
    smp = parse_distribution(
        {"smdistributed": {"modelparallel": {"enabled": True, "parameters": SMP_V1}},
         "mpi": MPI8}, **PT)  # fmt: skip
    assert len({dist, smp, parse_distribution({"mpi": {"enabled": True}}, **PT)}) == 2
    with pytest.raises(AttributeError):
        dist.mpi = None
    copy_ = dist.to_dict()
    copy_["mpi"]["enabled"] = False
    assert dist.mpi_enabled


@pytest.mark.parametrize("name", sorted(PARITY))
def test_round_trip_through_hyperparameters(name):
    distribution, kwargs = PARITY[name]
    kwargs, _ = _with_groups(kwargs)
    dist = shoal(distribution, **kwargs)
    back = Distribution.from_hyperparameters(encoded(dist), framework=kwargs["framework"])
    assert back.hyperparameters() == dist.hyperparameters()
    assert back.runner == dist.runner
    assert back.processes_per_host == dist.processes_per_host


@pytest.mark.parametrize("name", sorted(PARITY))
def test_round_trip_through_to_dict(name):
    distribution, kwargs = PARITY[name]
    kwargs, _ = _with_groups(kwargs)
    dist = shoal(distribution, **kwargs)
    again = parse_distribution(dist.to_dict(), **kwargs)
    assert again == dist


def test_to_dict_is_canonical():
    dist = parse_distribution({"pytorchddp": {"enabled": True, "custom_mpi_options": "-v"}}, **PT)
    assert dist.to_dict() == {
        "smdistributed": {"dataparallel": {"enabled": True, "custom_mpi_options": "-v"}}
    }


def test_from_hyperparameters_ignores_other_names_and_reads_legacy_ddp():
    hps = {"sagemaker_program": '"train.py"', "lr": "0.1",
           "sagemaker_pytorch_ddp_enabled": "true",
           "sagemaker_instance_type": '"ml.p3.16xlarge"'}  # fmt: skip
    dist = Distribution.from_hyperparameters(hps)
    assert dist.runner == "smddp"
    assert dist.hyperparameters() == {"sagemaker_pytorch_ddp_enabled": True,
                                      "sagemaker_instance_type": "ml.p3.16xlarge"}  # fmt: skip


def test_from_hyperparameters_of_a_plain_job():
    dist = Distribution.from_hyperparameters({"sagemaker_program": '"train.py"'})
    assert dist.runner == "process"
    assert dist.to_dict() == {}
