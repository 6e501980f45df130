"""Facts about frameworks, versions and instance types that distributed training depends on.

These are the rules of the SageMaker platform as the SageMaker Python SDK v2 applies them:
which framework/Python versions the data-parallel library supports, which ones
``torch_distributed`` supports on GPU and Trainium instances, from which TensorFlow version
MultiWorkerMirroredStrategy works, and how instance types are classified (GPU, Trainium, p5,
local). Versions are compared as the exact strings the user wrote, the way v2 does: "1.13" is
not "1.13.1"; :func:`suggest_version` turns such near misses into a hint.
"""

from __future__ import annotations

import re

from shoal.containers.matrix import release

#: Framework versions the data-parallel library (smdistributed.dataparallel) supports.
#: TensorFlow >= 2.12 is not supported by the library.
SMDDP_SUPPORTED_VERSIONS: dict[str, tuple[str, ...]] = {
    "tensorflow": (
        "2.3", "2.3.1", "2.3.2", "2.4", "2.4.1", "2.4.3", "2.5", "2.5.0", "2.5.1",
        "2.6", "2.6.0", "2.6.2", "2.6.3", "2.7", "2.7.1", "2.8", "2.8.0",
        "2.9", "2.9.1", "2.9.2", "2.10", "2.10.1", "2.11", "2.11.0",
    ),
    "pytorch": (
        "1.6", "1.6.0", "1.7", "1.7.1", "1.8", "1.8.0", "1.8.1", "1.9", "1.9.0", "1.9.1",
        "1.10", "1.10.0", "1.10.2", "1.11", "1.11.0", "1.12", "1.12.0", "1.12.1",
        "1.13.1", "2.0.0", "2.0.1", "2.1.0", "2.1.2", "2.2.0",
    ),
}  # fmt: skip

#: PyTorch versions whose GPU images support ``torch_distributed`` (torchrun).
TORCH_DISTRIBUTED_GPU_VERSIONS: tuple[str, ...] = (
    "1.13.1", "2.0.0", "2.0.1", "2.1.0", "2.1.2", "2.2.0", "2.3.0", "2.3.1",
    "2.4.1", "2.5.1", "2.6.0", "2.7.1", "2.8.0",
)  # fmt: skip

#: PyTorch versions whose Trainium (Neuron) images support ``torch_distributed``.
TORCH_DISTRIBUTED_TRAINIUM_VERSIONS: tuple[str, ...] = (
    "1.11", "1.11.0", "1.12", "1.12.0", "1.12.1", "1.13.1", "2.0.0",
)  # fmt: skip

#: The instance types that run a job on this machine (local mode).
LOCAL_INSTANCE_TYPES: tuple[str, ...] = ("local", "local_gpu")
#: Where a job runs: the one table the SDK, the config file and the CLI check a backend
#: against; a local instance type always runs locally, the others on one of REMOTE_BACKENDS.
BACKENDS: tuple[str, ...] = ("local", "sagemaker", "slurm")
REMOTE_BACKENDS: tuple[str, ...] = BACKENDS[1:]

#: The only distribution strategies Trainium instances accept.
TRAINIUM_STRATEGIES: tuple[str, ...] = ("torch_distributed",)

#: MultiWorkerMirroredStrategy needs TensorFlow at least this version.
MWMS_MIN_TENSORFLOW_VERSION = "2.9"

#: Image tags whose CUDA is too new for the smdistributed libraries.
SMDISTRIBUTED_UNSUPPORTED_IMAGE_TAGS: tuple[str, ...] = ("2.0.1-gpu-py310-cu121",)

#: Instance types with a single GPU: a parameter server uses all GPUs of the others only.
SINGLE_GPU_INSTANCE_TYPES: tuple[str, ...] = ("ml.p2.xlarge", "ml.p3.2xlarge")

#: Instance types the data-parallel library is built and tuned for (multi-GPU, fast network).
SMDDP_RECOMMENDED_INSTANCE_TYPES: tuple[str, ...] = (
    "ml.p3.16xlarge", "ml.p3dn.24xlarge", "ml.p4d.24xlarge", "ml.p4de.24xlarge", "local_gpu",
)  # fmt: skip

_INSTANCE_FAMILY = re.compile(r"^ml[._]([a-z\d\-]+)\.?\w*$")


def instance_family(instance_type: str | None) -> str | None:
    """The family of an ``ml.*`` instance type ("p4d" for "ml.p4d.24xlarge"), else None."""
    if not isinstance(instance_type, str):
        return None
    match = _INSTANCE_FAMILY.match(instance_type)
    return match[1] if match else None


def is_local(instance_type: str | None) -> bool:
    """True for local mode ("local" or "local_gpu")."""
    return instance_type in LOCAL_INSTANCE_TYPES


def is_gpu_instance(instance_type: str | None) -> bool:
    """True for GPU instance families (p*, g*) and "local_gpu"."""
    family = instance_family(instance_type) or ""
    return family.startswith(("p", "g")) or instance_type == "local_gpu"


def is_trainium_instance(instance_type: str | None) -> bool:
    """True for Trainium instance families (trn*)."""
    return (instance_family(instance_type) or "").startswith("trn")


def is_p5_instance(instance_type: str | None) -> bool:
    """True for ml.p5.48xlarge, where the smdistributed libraries do not run."""
    return isinstance(instance_type, str) and "p5.48xlarge" in instance_type


def is_multi_gpu_instance(instance_type: str | None) -> bool:
    """True for p-family instances with more than one GPU, and for "local_gpu"."""
    if instance_type in SINGLE_GPU_INSTANCE_TYPES:
        return False
    return instance_type == "local_gpu" or (instance_family(instance_type) or "").startswith("p")


def is_python3(py_version: str | None) -> bool:
    """True for "py3", "py39", "py310", ...: the libraries need Python 3."""
    return isinstance(py_version, str) and "py3" in py_version


def smddp_versions(framework: str) -> tuple[str, ...]:
    """The framework versions the data-parallel library supports (empty for others)."""
    return SMDDP_SUPPORTED_VERSIONS.get(framework, ())


def smddp_supports(framework: str, framework_version: str, py_version: str | None = None) -> bool:
    """Whether the data-parallel library supports this exact framework version string
    (and, when given, this Python version: any py3)."""
    if py_version is not None and not is_python3(py_version):
        return False
    return framework_version in smddp_versions(framework)


def torch_distributed_versions(instance_type: str | None) -> tuple[str, ...] | None:
    """PyTorch versions supporting ``torch_distributed`` on this instance type.

    None when ``torch_distributed`` does not run there at all (CPU instances, "local").
    """
    if is_gpu_instance(instance_type):
        return TORCH_DISTRIBUTED_GPU_VERSIONS
    if is_trainium_instance(instance_type):
        return TORCH_DISTRIBUTED_TRAINIUM_VERSIONS
    return None


def mwms_supports(tensorflow_version: str) -> bool:
    """Whether MultiWorkerMirroredStrategy works with this TensorFlow version."""
    return release(tensorflow_version) >= release(MWMS_MIN_TENSORFLOW_VERSION)


def smdistributed_supports_image(image_uri: str | None) -> bool:
    """False for images whose CUDA is too new for the smdistributed libraries."""
    return not any(tag in (image_uri or "") for tag in SMDISTRIBUTED_UNSUPPORTED_IMAGE_TAGS)


def framework_profiling_deprecated(framework: str, framework_version: str) -> bool:
    """Framework profiling collects nothing from PyTorch 2.0 and TensorFlow 2.12 on."""
    threshold = {"pytorch": "2.0", "tensorflow": "2.12"}.get(framework)
    return threshold is not None and release(framework_version) >= release(threshold)


def suggest_version(framework_version: str, supported: tuple[str, ...]) -> str | None:
    """The supported version the user most likely meant ("1.13" -> "1.13.1"), or None.

    A short version matches the newest supported patch release of the same minor version.
    """
    prefix = framework_version.rstrip(".") + "."
    candidates = [v for v in supported if v.startswith(prefix)]
    if not candidates:
        return None
    return max(candidates, key=release)
