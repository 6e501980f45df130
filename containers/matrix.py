"""The version matrix of Shoal's training images (``matrix.yaml``) and the
image names derived from it, shared by the SDK's default image URIs and the
image build."""

from __future__ import annotations

import functools
import re
from pathlib import Path

import attrs
import yaml

MATRIX_FILE = Path(__file__).with_name("matrix.yaml")
PROCESSORS = ("gpu", "cpu")
SCOPES = ("training", "inference")  # an image that trains (``train``) or serves (``serve``)


@attrs.frozen
class ImageSpec:
    """One entry of the matrix: a framework version and its CUDA 11 base."""

    framework: str
    framework_version: str
    py_version: str
    cuda: str
    cuda_tag: str
    gpu_base: str
    cpu_base: str
    python: str
    nccl: str
    # None: the matrix-wide ``toolchain`` version applies (see ``toolchain()``).
    openmpi: str | None = None
    efa: str | None = None
    aws_ofi_nccl: str | None = None

    def repository(self, scope: str = "training") -> str:
        if scope not in SCOPES:
            raise ValueError(f"'scope' must be in {SCOPES!r} (got {scope!r})")
        return _matrix()["repository"].format(framework=self.framework, scope=scope)

    def tag(self, processor: str) -> str:
        if processor not in PROCESSORS:
            raise ValueError(f"'processor' must be in {PROCESSORS!r} (got {processor!r})")
        return _matrix()["tag"].format(
            framework_version=self.framework_version, processor=processor,
            py_version=self.py_version,
        )

    def toolchain(self) -> dict[str, str]:
        """Open MPI, EFA installer and aws-ofi-nccl versions: the entry's own, else the matrix's."""
        defaults = _matrix()["toolchain"]
        own = {"openmpi": self.openmpi, "efa": self.efa, "aws_ofi_nccl": self.aws_ofi_nccl}
        return {key: own[key] or defaults[key] for key in own}


@functools.lru_cache(maxsize=1)
def _matrix() -> dict:
    return yaml.safe_load(MATRIX_FILE.read_text())


def specs(framework: str | None = None) -> list[ImageSpec]:
    """Every matrix entry, or those of one framework."""
    out = []
    for name, entries in _matrix()["images"].items():
        if framework in (None, name):
            out.extend(ImageSpec(framework=name, **entry) for entry in entries)
    return out


def find(framework: str, framework_version: str, py_version: str | None = None) -> ImageSpec | None:
    """The entry for a framework version, None when absent. A version without its patch
    ("1.12") is the newest patch release of that minor version in the matrix ("1.12.1"),
    as the SageMaker SDK's version aliases resolve it."""
    entries = specs(framework)
    exact = [spec for spec in entries if spec.framework_version == framework_version]
    if not exact:
        same_minor = [spec for spec in entries if minor(spec.framework_version) == framework_version]
        newest = max((spec.framework_version for spec in same_minor), key=release, default=None)
        exact = [spec for spec in same_minor if spec.framework_version == newest]
    return next((spec for spec in exact if py_version in (None, spec.py_version)), None)


def minor(version: str) -> str:
    """"1.12.1" -> "1.12"."""
    return ".".join(version.split(".")[:2])


def release(version: str) -> tuple[int, ...]:
    """A release version as a tuple of ints, for ordering releases: "2.10.1" ->
    (2, 10, 1); it ends at the first part that does not start with digits, and a
    part's suffix is dropped ("2.0.0rc1" -> (2, 0, 0), "1.13.x" -> (1, 13))."""
    parts = []
    for piece in str(version).split("."):
        digits = re.match(r"\d+", piece)
        if not digits:
            break
        parts.append(int(digits[0]))
    return tuple(parts)


def registry_domain(region: str) -> str:
    """ECR's domain for a region's partition."""
    if region.startswith("cn-"):
        return "amazonaws.com.cn"
    if region.startswith("us-iso-"):
        return "c2s.ic.gov"
    if region.startswith("us-isob-"):
        return "sc2s.sgov.gov"
    return "amazonaws.com"


def image_uri(spec: ImageSpec, processor: str, account: str, region: str,
              scope: str = "training") -> str:
    """The ECR URI of an image in the user's account and region."""
    registry = f"{account}.dkr.ecr.{region}.{registry_domain(region)}"
    return f"{registry}/{spec.repository(scope)}:{spec.tag(processor)}"
