"""Image builds: which builder to use (the Docker engine when one answers, else
buildah), the exact command lines (pure), and running them (I/O)."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import attrs
from shoal.containers import context, render
from shoal.errors import BuildError

BUILDERS = ("docker", "buildah")


def choose_storage_driver(filesystems: str, is_root: bool) -> str:
    """overlay when the kernel has it and we are root (fast, shares layers), else vfs
    (a full copy per layer, but works anywhere). ``filesystems``: /proc/filesystems."""
    kernel_has_overlay = any(line.split()[-1:] == ["overlay"] for line in filesystems.splitlines())
    return "overlay" if kernel_has_overlay and is_root else "vfs"


def detect_storage_driver() -> str:
    """buildah's own STORAGE_DRIVER when set, else what this machine supports."""
    if os.environ.get("STORAGE_DRIVER") in ("overlay", "vfs"):
        return os.environ["STORAGE_DRIVER"]
    try:
        filesystems = Path("/proc/filesystems").read_text()
    except OSError:
        filesystems = ""
    return choose_storage_driver(filesystems, os.geteuid() == 0)


@attrs.frozen
class Buildah:
    """How buildah runs here: chroot isolation works as root inside an unprivileged
    container; every buildah command on one image store must use the same driver and root."""

    storage_driver: str = attrs.field(
        factory=detect_storage_driver, validator=attrs.validators.in_(("overlay", "vfs")))
    isolation: str = "chroot"
    root: str | None = None  # a separate image store (tests), else buildah's default

    def global_args(self) -> list[str]:
        args = ["buildah", "--storage-driver", self.storage_driver]
        if self.root:
            args += ["--root", self.root]
        return args


def choose_builder(docker_answers: bool, buildah_path: str | None) -> str:
    """'docker' when an engine answers `docker info`, else 'buildah' when installed."""
    if docker_answers:
        return "docker"
    if buildah_path:
        return "buildah"
    raise BuildError("no image builder: no Docker engine answers and buildah is not installed")


def docker_answers() -> bool:
    """True when the docker CLI exists and its engine answers."""
    if shutil.which("docker") is None:
        return False
    try:
        done = subprocess.run(["docker", "info"], capture_output=True, timeout=20, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


def detect_builder() -> str:
    return choose_builder(docker_answers(), shutil.which("buildah"))


def build_command(builder: str, context_dir: Path, tag: str, *,
                  buildah: Buildah | None = None, target: str | None = "final") -> list[str]:
    """The argv that builds ``context_dir``'s Dockerfile (up to stage ``target``) into ``tag``."""
    ctx = str(context_dir)
    dockerfile = str(Path(context_dir) / "Dockerfile")
    stage = ["--target", target] if target else []
    if builder == "docker":
        return ["docker", "build", *stage, "--file", dockerfile, "--tag", tag, ctx]
    if builder == "buildah":
        settings = buildah or Buildah()
        return [*settings.global_args(), "bud", "--isolation", settings.isolation,
                "--layers", "--pull=false", *stage, "--file", dockerfile, "--tag", tag, ctx]
    raise BuildError(f"'builder' must be in {BUILDERS!r} (got {builder!r})")


def run(argv: list[str], *, stdin: str | None = None) -> None:
    """Run a builder command, streaming its output; a failure is a BuildError."""
    try:
        done = subprocess.run(argv, input=stdin, text=True, check=False)
    except OSError as error:
        raise BuildError(f"cannot run {argv[0]}: {error}") from error
    if done.returncode != 0:
        raise BuildError(f"{' '.join(argv[:3])} ... failed with exit status {done.returncode}")


def build_image(options: render.BuildOptions, *, source_root: Path | None = None,
                builder: str | None = None, buildah: Buildah | None = None,
                tag: str | None = None, keep_context: Path | None = None) -> str:
    """Render, write the context, build; returns the local image name."""
    builder = builder or detect_builder()
    tag = tag or options.local_name
    source_root = source_root or context.default_source_root()
    setup_cfg = (Path(source_root) / "setup.cfg").read_text()
    context.check_python(options.python_version, setup_cfg)
    # The label names the version being built, not the one this process runs.
    options = attrs.evolve(options, shoal_version=context.source_version(setup_cfg)
                           or options.shoal_version)
    dockerfile = render.render_dockerfile(options)
    with tempfile.TemporaryDirectory(prefix="shoal-image-") as scratch:
        ctx = context.write_context(keep_context or Path(scratch) / "context",
                                    dockerfile, source_root, options.ca_certificates)
        run(build_command(builder, ctx, tag, buildah=buildah))
    return tag
