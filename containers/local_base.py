"""A Debian base image made on this machine (debootstrap + buildah), for building and
testing Shoal's CPU images where no registry can be pulled from."""

from __future__ import annotations

import datetime
import hashlib
import os
import subprocess
import tarfile
import tempfile
from pathlib import Path

from shoal.containers import builder as builders

DEFAULT_MIRROR = "http://deb.debian.org/debian"


def debootstrap_command(suite: str, rootfs: Path, mirror: str = DEFAULT_MIRROR) -> list[str]:
    """The argv that installs a minimal Debian ``suite`` into ``rootfs``."""
    return ["debootstrap", "--variant=minbase", suite, str(rootfs), mirror]


# What Debian's own images set: a scratch image has no PATH of its own.
BASE_DOCKERFILE = """FROM scratch
ADD rootfs.tar /
ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
CMD ["/bin/bash"]
"""


def base_name(suite: str, day: datetime.date) -> str:
    """The cached base's name: one per suite, month and recipe, so it is remade monthly
    (security updates) and whenever the recipe changes."""
    recipe = hashlib.sha256(BASE_DOCKERFILE.encode()).hexdigest()[:8]
    return f"localhost/shoal-debian:{suite}-{day:%Y%m}-{recipe}"


def image_exists(name: str, buildah: builders.Buildah) -> bool:
    done = subprocess.run([*buildah.global_args(), "inspect", "--type", "image", name],
                          capture_output=True, check=False)
    return done.returncode == 0


def make_local_base(name: str, *, suite: str = "bookworm", buildah: builders.Buildah,
                    mirror: str = DEFAULT_MIRROR, workdir: Path | None = None) -> str:
    """Build ``name`` (e.g. ``localhost/shoal-test-base:bookworm``) unless it exists."""
    if image_exists(name, buildah):
        return name
    with tempfile.TemporaryDirectory(prefix="shoal-base-", dir=workdir) as scratch:
        rootfs, ctx = Path(scratch) / "rootfs", Path(scratch) / "context"
        builders.run(debootstrap_command(suite, rootfs, mirror))
        ctx.mkdir()
        # Numeric owners as debootstrap made them; the archive is the image's only layer.
        with tarfile.open(ctx / "rootfs.tar", "w") as archive:
            for entry in sorted(os.listdir(rootfs)):
                archive.add(rootfs / entry, arcname=entry)
        (ctx / "Dockerfile").write_text(BASE_DOCKERFILE)
        builders.run(builders.build_command("buildah", ctx, name, buildah=buildah, target=None))
    return name
