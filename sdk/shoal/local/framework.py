"""The framework a local job runs with: this machine's, not the image's.

A local job runs the script with this machine's Python and whatever torch or TensorFlow is
installed here; the image the request names, and so the ``framework_version`` it was built
for, is not used. :func:`framework_note` says so once when the two differ in major.minor.
The installed version is read from the distribution's metadata: importing torch or
TensorFlow to ask would cost seconds.
"""

from __future__ import annotations

import re
from importlib import metadata

# The distributions that provide each framework, in the order they are looked for.
DISTRIBUTIONS = {"pytorch": ("torch",),
                 "tensorflow": ("tensorflow", "tensorflow-cpu", "tensorflow-gpu")}
MODULES = {"pytorch": "torch", "tensorflow": "tensorflow"}
WHY = "local mode uses this machine's Python, not the image"


def installed_version(framework: str) -> str | None:
    """The version of ``framework`` installed for this Python, or None."""
    for name in DISTRIBUTIONS[framework]:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return None


def major_minor(version: str) -> tuple[int, ...]:
    """``(2, 13)`` for ``2.13.0+cpu``: what decides whether a script's APIs match."""
    return tuple(int(part) for part in re.findall(r"\d+", version)[:2])


def version_note(framework: str, declared: str, installed: str | None) -> str | None:
    """What to tell about running ``declared`` on ``installed``; None when they agree."""
    module = MODULES[framework]
    if installed is None:
        return (f"framework_version {declared} asked for; {module} is not installed on this "
                f"machine ({WHY})")
    if major_minor(installed) == major_minor(declared):
        return None
    return f"framework_version {declared} asked for; this machine runs {module} {installed} ({WHY})"


def framework_note(request: dict) -> str | None:
    """The note for a request whose image names a framework version (Shoal's images and the
    Deep Learning Containers); None for any other image."""
    from shoal.image_uris import framework_from_image

    found = framework_from_image(request.get("AlgorithmSpecification", {}).get("TrainingImage"))
    if found is None:
        return None
    framework, declared, _ = found
    return version_note(framework, declared, installed_version(framework))
