"""Which training images the endpoint runs: Shoal's own (built locally or pushed to ECR) and
the AWS deep-learning-container training images on ECR, recognised by repository and tag;
anything else is refused with a ValidationException naming the URI."""

from __future__ import annotations

import pytest
from shoal import image_uris
from shoal.server.api_errors import ValidationException
from shoal.server.images import TrainingImage, recognise

DLC = "763104351884.dkr.ecr.us-west-2.amazonaws.com"


@pytest.mark.parametrize("uri, expected", [
    (f"{DLC}/pytorch-training:2.0.1-cpu-py310",
     TrainingImage("pytorch", "2.0.1", "cpu", "py310", "dlc")),
    (f"{DLC}/tensorflow-training:2.13-gpu-py310",
     TrainingImage("tensorflow", "2.13", "gpu", "py310", "dlc")),
    (f"{DLC}/pytorch-training:2.0.1-gpu-py310-cu118-ubuntu20.04-sagemaker",
     TrainingImage("pytorch", "2.0.1", "gpu", "py310", "dlc")),
    (f"{DLC}/tensorflow-training:2.13.0-cpu-py310-ubuntu20.04-sagemaker",
     TrainingImage("tensorflow", "2.13.0", "cpu", "py310", "dlc")),
])
def test_deep_learning_container_images_are_recognised(uri, expected):
    assert recognise(uri) == expected


def test_shoals_local_build_is_recognised():
    name = image_uris.local_image_name("pytorch", "1.13.1", "py39", "local")
    assert "/" not in name  # as a local build tags it: no registry
    assert recognise(name) == TrainingImage("pytorch", "1.13.1", "cpu", "py39", "shoal")


def test_shoals_image_on_ecr_is_recognised():
    uri = image_uris.shoal_image_uri("pytorch", "1.13.1", "py39", "ml.m5.xlarge",
                                     "111122223333", "us-east-1")
    assert uri.startswith("111122223333.dkr.ecr.us-east-1.amazonaws.com/")
    image = recognise(uri)
    assert (image.framework, image.version, image.processor, image.python, image.source) == (
        "pytorch", "1.13.1", "cpu", "py39", "shoal")


def test_shoals_gpu_image_is_a_gpu_image():
    uri = image_uris.shoal_image_uri("pytorch", "1.13.1", "py39", "ml.p3.2xlarge",
                                     "111122223333", "us-east-1")
    assert recognise(uri).processor == "gpu"


@pytest.mark.parametrize("uri", [
    "111122223333.dkr.ecr.us-east-1.amazonaws.com/my-algo:latest",   # a custom algorithm
    "docker.io/pytorch-training:2.0.1-cpu-py310",                     # DLC names: only on ECR
    "pytorch-training:2.0.1-cpu-py310",                               # nor without a registry
    f"{DLC}/pytorch-inference:2.0.1-cpu-py310",                       # not a training image
    f"{DLC}/pytorch-training:latest",                                 # a tag without a version
    f"{DLC}/mxnet-training:1.9.0-cpu-py38",                           # another framework
    f"{DLC}/pytorch-training",                                        # no tag
])
def test_other_images_are_refused_with_their_name(uri):
    with pytest.raises(ValidationException) as caught:
        recognise(uri)
    assert repr(uri) in caught.value.message
    assert caught.value.code == "ValidationException"


@pytest.mark.parametrize("uri", ["", None])
def test_no_image_is_refused(uri):
    with pytest.raises(ValidationException) as caught:
        recognise(uri)
    assert f"training image {uri!r}" in caught.value.message
