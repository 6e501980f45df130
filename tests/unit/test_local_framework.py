"""The note a local job prints when this machine's framework is not the one it asked for."""

from importlib import metadata

import pytest
from shoal.local import framework

WHY = "(local mode uses this machine's Python, not the image)"


def request(image):
    return {"AlgorithmSpecification": {"TrainingImage": image, "TrainingInputMode": "File"}}


@pytest.mark.parametrize("declared, installed, expected", [
    ("1.13.1", "2.13.0+cpu",
     f"framework_version 1.13.1 asked for; this machine runs torch 2.13.0+cpu {WHY}"),
    ("2.0", "2.13.0", f"framework_version 2.0 asked for; this machine runs torch 2.13.0 {WHY}"),
    ("2.13.1", "2.13.0+cpu", None),
    ("2.13", "2.13.0", None),
    ("1.13.1", None, f"framework_version 1.13.1 asked for; torch is not installed on this "
                     f"machine {WHY}"),
])
def test_a_note_when_major_minor_differ_or_the_framework_is_missing(declared, installed,
                                                                     expected):
    assert framework.version_note("pytorch", declared, installed) == expected


def test_tensorflow_is_named_as_its_module():
    assert framework.version_note("tensorflow", "2.11.0", "2.15.1") == (
        f"framework_version 2.11.0 asked for; this machine runs tensorflow 2.15.1 {WHY}")


def test_the_installed_version_comes_from_metadata(monkeypatch):
    versions = {"torch": "2.13.0+cpu", "tensorflow-cpu": "2.15.1"}

    def version(name):
        if name not in versions:
            raise metadata.PackageNotFoundError(name)
        return versions[name]

    monkeypatch.setattr(framework.metadata, "version", version)
    assert framework.installed_version("pytorch") == "2.13.0+cpu"
    assert framework.installed_version("tensorflow") == "2.15.1"
    versions.clear()
    assert framework.installed_version("pytorch") is None


def test_the_declared_version_is_read_from_the_image(monkeypatch):
    monkeypatch.setattr(framework, "installed_version", {"pytorch": "2.13.0"}.get)
    assert framework.framework_note(request("shoal-pytorch-training:1.13.1-cpu-py39")) == (
        f"framework_version 1.13.1 asked for; this machine runs torch 2.13.0 {WHY}")
    dlc = ("763104351884.dkr.ecr.us-west-2.amazonaws.com/pytorch-training:"
           "2.13.0-gpu-py310-cu118-ubuntu20.04-sagemaker")
    assert framework.framework_note(request(dlc)) is None
    assert framework.framework_note(request("111122223333.dkr.ecr.us-west-2.amazonaws.com/"
                                            "my-algorithm:latest")) is None
