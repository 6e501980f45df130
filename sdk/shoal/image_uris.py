"""Training image URIs: the user's ``image_uri`` when given, otherwise Shoal's own image
for the framework version (``containers/matrix.yaml``) in the user's account and region,
GPU or CPU by instance type."""

from __future__ import annotations

import re

from shoal import frameworks
from shoal.containers import matrix
from shoal.errors import ImageError

# GPU instance families: p* (p3, p4d, p5...) and g* (g4dn, g5...).
_GPU_FAMILY = re.compile(r"^ml\.(p|g)\d")

# ``shoal-pytorch-training:2.0.1-gpu-py310`` and the Deep Learning Containers' own
# ``pytorch-training:2.0.1-gpu-py310[-cu118-ubuntu20.04-sagemaker]``.
_FRAMEWORK_IMAGE = re.compile(
    r"^(?:.+/)?(?:shoal-)?(?P<framework>pytorch|tensorflow)-training"
    r":(?P<version>\d+(?:\.\d+)*)-(?P<processor>cpu|gpu)-(?P<py>py\d+)"
)


def framework_from_image(image_uri: str | None) -> tuple[str, str, str] | None:
    """``(framework, framework_version, py_version)`` of a framework image, else None."""
    match = _FRAMEWORK_IMAGE.match(image_uri or "")
    if not match:
        return None
    return match.group("framework"), match.group("version"), match.group("py")


def processor_for(instance_type: str | None) -> str:
    """``gpu`` for p*/g* families and ``local_gpu``, ``cpu`` otherwise (``local`` included)."""
    if instance_type == "local_gpu":
        return "gpu"
    if instance_type and _GPU_FAMILY.match(instance_type):
        return "gpu"
    return "cpu"


def supported_versions(framework: str) -> list[str]:
    return [f"{s.framework_version} ({s.py_version})" for s in matrix.specs(framework)]


def find_spec(framework: str, framework_version: str | None, py_version: str | None):
    """The matrix entry for a framework version, or ``ImageError`` listing the supported ones."""
    spec = matrix.find(framework, framework_version, py_version) if framework_version else None
    if spec is None:
        wanted = f"{framework} {framework_version}" + (f" {py_version}" if py_version else "")
        raise ImageError(
            f"no Shoal image for {wanted}; supported: "
            f"{', '.join(supported_versions(framework)) or 'none'} (or pass image_uri=)")
    return spec


def local_image_name(framework: str, framework_version: str | None, py_version: str | None,
                     instance_type: str | None) -> str:
    """The image as a local build tags it (no registry): local mode needs no AWS account."""
    spec = find_spec(framework, framework_version, py_version)
    return f"{spec.repository()}:{spec.tag(processor_for(instance_type))}"


def shoal_image_uri(framework: str, framework_version: str | None, py_version: str | None,
                    instance_type: str | None, account: str, region: str) -> str:
    """Shoal's training image for a framework version; ``ImageError`` lists the supported ones."""
    spec = find_spec(framework, framework_version, py_version)
    return matrix.image_uri(spec, processor_for(instance_type), account, region)


def training_image_uri(framework: str | None, framework_version: str | None,
                       py_version: str | None, instance_type: str | None, *,
                       image_uri: str | None = None, account=None, region: str | None = None) -> str:
    """``image_uri`` wins; otherwise Shoal's image. ``account`` may be a callable, asked only
    when the default image is needed."""
    if image_uri:
        return image_uri
    if framework is None:
        raise ImageError("image_uri is required for a generic Estimator")
    if instance_type in ("local", "local_gpu"):
        return local_image_name(framework, framework_version, py_version, instance_type)
    account = account() if callable(account) else account
    return shoal_image_uri(framework, framework_version, py_version, instance_type, account, region)


def inference_image_uri(training_image: str) -> str:
    """The serving image beside a training image: Shoal names its images
    ``shoal-<framework>-training`` and ``shoal-<framework>-inference`` with the same tag; any
    other image (a custom one) serves as is, as SDK v2 reuses a custom training image."""
    if framework_from_image(training_image) and "-training:" in training_image:
        return training_image.replace("-training:", "-inference:", 1)
    return training_image


def version_table() -> str:
    """The README's table of framework versions: one row per matrix entry, with its CUDA 11
    stack and the distributions the SDK accepts for it (the same rules the estimators apply)."""
    rows = ["| Framework | Version | Python | CUDA (GPU image) | NCCL | smdistributed "
            "dataparallel | torch_distributed / MWMS |",
            "|---|---|---|---|---|---|---|"]
    for spec in matrix.specs():
        smddp = frameworks.smddp_supports(spec.framework, spec.framework_version)
        if spec.framework == "pytorch":
            launcher = spec.framework_version in frameworks.TORCH_DISTRIBUTED_GPU_VERSIONS
        else:
            launcher = frameworks.mwms_supports(spec.framework_version)
        rows.append(f"| {spec.framework} | {spec.framework_version} | {spec.py_version} | "
                    f"{spec.cuda} ({spec.cuda_tag}) | {spec.nccl} | {'yes' if smddp else 'no'} | "
                    f"{'yes' if launcher else 'no'} |")
    return "\n".join(rows) + "\n"
