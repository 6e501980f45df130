"""Which training images the endpoint runs: Shoal's own and the AWS deep-learning-container
training images for PyTorch and TensorFlow, recognised by repository and tag. Such a job runs
with this machine's Python and Shoal's launcher, as local mode does; any other image (a
custom algorithm) cannot, and is refused with its name."""

from __future__ import annotations

import re

import attrs

from .api_errors import ValidationException

# [registry/]repository:tag; the registry is optional (a local build has none)
_URI = re.compile(r"^(?:(?P<registry>[^/]+[.:][^/]+|localhost)/)?(?P<repository>[a-z0-9._/-]+)"
                  r":(?P<tag>[\w.-]+)$")
_SHOAL_REPOSITORY = re.compile(r"^(?:.*/)?shoal-(?P<framework>pytorch|tensorflow)-training$")
_DLC_REPOSITORY = re.compile(r"^(?P<framework>pytorch|tensorflow)-training$")
# 2.0.1-gpu-py310-cu118-ubuntu20.04-sagemaker, 2.13.0-cpu-py310-ubuntu20.04-sagemaker, 1.13.1-cpu-py39
_TAG = re.compile(r"^(?P<version>\d+(?:\.\d+){1,2})-(?P<processor>cpu|gpu)-(?P<python>py\d{2,3})"
                  r"(?:-[\w.]+)*$")


@attrs.frozen
class TrainingImage:
    framework: str      # pytorch or tensorflow
    version: str
    processor: str      # cpu or gpu
    python: str         # py310
    source: str         # shoal or dlc


def recognise(uri: str) -> TrainingImage:
    """The framework image ``uri`` names, or ValidationException naming it."""
    match = _URI.match(uri or "")
    if match:
        repository, tag = match["repository"], match["tag"]
        kind = _SHOAL_REPOSITORY.match(repository)
        source = "shoal"
        if kind is None and match["registry"] and ".dkr.ecr." in match["registry"]:
            kind, source = _DLC_REPOSITORY.match(repository.rsplit("/", 1)[-1]), "dlc"
        parts = _TAG.match(tag)
        if kind and parts:
            return TrainingImage(kind["framework"], parts["version"], parts["processor"],
                                 parts["python"], source)
    raise ValidationException(
        f"training image {uri!r} cannot run on this endpoint: it runs Shoal's images and the "
        "AWS deep-learning-container training images for PyTorch and TensorFlow "
        "(<account>.dkr.ecr.<region>.amazonaws.com/pytorch-training:<version>-cpu-py310-...)")
