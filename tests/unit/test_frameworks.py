"""Framework/version/instance facts, checked against the SageMaker Python SDK v2's own tables."""

from __future__ import annotations

import os

import pytest
from shoal import frameworks

os.environ.setdefault("SAGEMAKER_SUPPRESS_V2_WARNING", "1")
fw_utils = pytest.importorskip("sagemaker.fw_utils")  # the reference SDK v2 (test extra)


def test_version_tables_match_v2():
    assert {k: list(v) for k, v in frameworks.SMDDP_SUPPORTED_VERSIONS.items()} == (
        fw_utils.SM_DATAPARALLEL_SUPPORTED_FRAMEWORK_VERSIONS
    )
    assert list(frameworks.TORCH_DISTRIBUTED_GPU_VERSIONS) == (
        fw_utils.TORCH_DISTRIBUTED_GPU_SUPPORTED_FRAMEWORK_VERSIONS
    )
    assert list(frameworks.TORCH_DISTRIBUTED_TRAINIUM_VERSIONS) == (
        fw_utils.TRAINIUM_SUPPORTED_TORCH_DISTRIBUTED_FRAMEWORK_VERSIONS
    )
    assert list(frameworks.TRAINIUM_STRATEGIES) == fw_utils.TRAINIUM_SUPPORTED_DISTRIBUTION_STRATEGIES
    assert frameworks.SINGLE_GPU_INSTANCE_TYPES == fw_utils.SINGLE_GPU_INSTANCE_TYPES
    assert frameworks.SMDDP_RECOMMENDED_INSTANCE_TYPES == (
        fw_utils.SM_DATAPARALLEL_SUPPORTED_INSTANCE_TYPES
    )


INSTANCE_TYPES = [
    "ml.p3.2xlarge", "ml.p3.16xlarge", "ml.p4d.24xlarge", "ml.p5.48xlarge", "ml.g5.12xlarge",
    "ml.trn1.32xlarge", "ml.trn1n.32xlarge", "ml.c5.xlarge", "ml.m5.large", "local",
    "local_gpu", "ml_p3.16xlarge", "bogus", None,
]  # fmt: skip


@pytest.mark.parametrize("instance_type", INSTANCE_TYPES)
def test_instance_classes_match_v2(instance_type):
    assert frameworks.is_gpu_instance(instance_type) == fw_utils._is_gpu_instance(instance_type)
    assert frameworks.is_trainium_instance(instance_type) == (
        fw_utils._is_trainium_instance(instance_type)
    )


def test_instance_classes():
    assert frameworks.instance_family("ml.p4d.24xlarge") == "p4d"
    assert frameworks.instance_family("local") is None
    assert frameworks.is_local("local") and frameworks.is_local("local_gpu")
    assert not frameworks.is_local("ml.c5.xlarge")
    assert frameworks.is_p5_instance("ml.p5.48xlarge")
    assert not frameworks.is_p5_instance("ml.p4d.24xlarge") and not frameworks.is_p5_instance(None)
    assert frameworks.is_multi_gpu_instance("ml.p3.16xlarge")
    assert frameworks.is_multi_gpu_instance("local_gpu")
    assert not frameworks.is_multi_gpu_instance("ml.p3.2xlarge")
    assert not frameworks.is_multi_gpu_instance("ml.c5.xlarge")
    assert not frameworks.is_multi_gpu_instance("local")


def test_smddp_versions_are_exact_strings():
    assert frameworks.smddp_supports("pytorch", "1.13.1")
    assert not frameworks.smddp_supports("pytorch", "1.13")
    assert frameworks.smddp_supports("pytorch", "1.12")
    assert not frameworks.smddp_supports("tensorflow", "2.12")
    assert frameworks.smddp_supports("tensorflow", "2.11")
    assert frameworks.smddp_versions("mxnet") == ()
    assert frameworks.smddp_supports("pytorch", "1.13.1", "py39")
    assert not frameworks.smddp_supports("pytorch", "1.13.1", "py2")


def test_suggest_version():
    pytorch = frameworks.smddp_versions("pytorch")
    assert frameworks.suggest_version("1.13", pytorch) == "1.13.1"
    assert frameworks.suggest_version("2.0", pytorch) == "2.0.1"
    assert frameworks.suggest_version("1.10", pytorch) == "1.10.2"
    assert frameworks.suggest_version("3.0", pytorch) is None
    assert frameworks.suggest_version("1.1", ("1.10.0", "1.1.5")) == "1.1.5"


def test_torch_distributed_versions():
    assert frameworks.torch_distributed_versions("ml.p4d.24xlarge") == (
        frameworks.TORCH_DISTRIBUTED_GPU_VERSIONS
    )
    assert frameworks.torch_distributed_versions("local_gpu") == (
        frameworks.TORCH_DISTRIBUTED_GPU_VERSIONS
    )
    assert frameworks.torch_distributed_versions("ml.trn1.2xlarge") == (
        frameworks.TORCH_DISTRIBUTED_TRAINIUM_VERSIONS
    )
    assert frameworks.torch_distributed_versions("ml.c5.xlarge") is None
    assert frameworks.torch_distributed_versions("local") is None


def test_mwms_versions():
    assert frameworks.mwms_supports("2.9")
    assert frameworks.mwms_supports("2.9.1")
    assert frameworks.mwms_supports("2.10")
    assert not frameworks.mwms_supports("2.8.0")
    assert not frameworks.mwms_supports("1.15")


def test_python3():
    assert frameworks.is_python3("py3") and frameworks.is_python3("py310")
    assert not frameworks.is_python3("py2") and not frameworks.is_python3(None)


def test_smdistributed_images():
    assert frameworks.smdistributed_supports_image(None)
    assert frameworks.smdistributed_supports_image("acct.dkr.ecr.x.amazonaws.com/a:1.13.1-gpu-py39")
    assert not frameworks.smdistributed_supports_image("x/pytorch-training:2.0.1-gpu-py310-cu121")


def test_framework_profiling_deprecation():
    assert frameworks.framework_profiling_deprecated("pytorch", "2.0.1")
    assert not frameworks.framework_profiling_deprecated("pytorch", "1.13.1")
    assert frameworks.framework_profiling_deprecated("tensorflow", "2.12")
    assert not frameworks.framework_profiling_deprecated("tensorflow", "2.11.0")
    assert not frameworks.framework_profiling_deprecated("xgboost", "9.0")
