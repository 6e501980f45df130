"""The build context of a Shoal image: the rendered Dockerfile, a ``.dockerignore`` and
``src/``, a filtered copy of the repository from which the image builds Shoal's wheels.

Only an allow-list of top-level entries is copied, and inside them hidden files, build
output, compiled objects, symlinks and anything named like a credential are left out, so
no secret, VCS data or host path can reach the image.
"""

from __future__ import annotations

import configparser
import fnmatch
import os
import re
import shutil
from pathlib import Path

from shoal.errors import BuildError

# What building the `shoal` distribution needs, and nothing else.
SOURCE_ENTRIES = (
    "setup.py", "setup.cfg", "pyproject.toml", "MANIFEST.in", "README.md", "LICENSE",
    "sdk", "runtime", "containers",
)
# Never copied, at any depth (matched against each file or directory name).
EXCLUDED_NAMES = (
    ".*",  # .git, .venv, .aws, .ssh, .env, .pytest_cache, editor files
    "__pycache__", "*.pyc", "*.pyo", "*.so", "*.o", "*.a", "*.egg-info", "build", "dist",
    "credentials", "*.pem", "*.key", "*.p12", "*.pfx", "id_rsa*", "id_dsa*", "id_ecdsa*",
    "id_ed25519*", "*.kdbx", "*.tfstate",
)
DOCKERIGNORE = "\n".join([
    "# Defence in depth: the context holds only the Dockerfile and src/ already.",
    "**/.git", "**/.venv", "**/.aws", "**/.ssh", "**/.env", "**/__pycache__", "**/*.pyc",
    "**/*.egg-info", "**/build", "**/dist", "**/*.pem", "**/*.key", "**/credentials", "",
])


def is_excluded(name: str) -> bool:
    """True for a file or directory name that must not enter the context."""
    return any(fnmatch.fnmatch(name, pattern) for pattern in EXCLUDED_NAMES)


def source_files(source_root: Path) -> list[Path]:
    """The repository files copied into ``src/``, relative to the root, sorted."""
    root = Path(source_root)
    found: list[Path] = []
    for entry in SOURCE_ENTRIES:
        top = root / entry
        if top.is_symlink() or not top.exists():
            continue
        if top.is_file():
            found.append(Path(entry))
            continue
        for dirpath, dirnames, filenames in os.walk(top):
            here = Path(dirpath)
            # Pruned in place so os.walk never descends into excluded or linked directories.
            dirnames[:] = sorted(d for d in dirnames
                                 if not is_excluded(d) and not (here / d).is_symlink())
            for name in sorted(filenames):
                path = here / name
                if not is_excluded(name) and not path.is_symlink() and path.is_file():
                    found.append(path.relative_to(root))
    return sorted(found)


def requirements(setup_cfg: str, extras: tuple[str, ...] = ("mpi",)) -> str:
    """Shoal's dependencies (``install_requires`` and the ``extras``) as a requirements file:
    the image builds and installs them in layers of their own, cached until they change."""
    config = configparser.ConfigParser()
    config.read_string(setup_cfg)
    lines = config.get("options", "install_requires", fallback="").splitlines()
    for extra in extras:
        lines += config.get("options.extras_require", extra, fallback="").splitlines()
    return "".join(f"{line.strip()}\n" for line in lines if line.strip())


def source_version(setup_cfg: str) -> str | None:
    """The version the source tree declares (``[metadata] version``)."""
    config = configparser.ConfigParser()
    config.read_string(setup_cfg)
    return config.get("metadata", "version", fallback=None)


def minimum_python(setup_cfg: str) -> tuple[int, int] | None:
    """The lowest Python ``python_requires`` (``>=X.Y``) admits, None when it says none."""
    config = configparser.ConfigParser()
    config.read_string(setup_cfg)
    found = re.search(r">=\s*(\d+)\.(\d+)", config.get("options", "python_requires", fallback=""))
    return (int(found.group(1)), int(found.group(2))) if found else None


def check_python(python: str, setup_cfg: str) -> None:
    """Refuse, before any build step, an image Python that Shoal itself does not support
    ("3", the distribution's own, is left to pip)."""
    floor = minimum_python(setup_cfg)
    parts = tuple(int(p) for p in python.split("."))
    if floor and len(parts) == 2 and parts < floor:
        raise BuildError(f"Shoal needs Python >= {floor[0]}.{floor[1]}; this image's Python is "
                         f"{python} (pass --python with a newer one available on the base)")


def write_context(dest: Path, dockerfile: str, source_root: Path,
                  ca_certificates: tuple[Path, ...] = ()) -> Path:
    """Write the context into ``dest`` (created, must be empty) and return it; extra CA
    certificates go to ``certs/`` under their own names."""
    dest = Path(dest)
    if dest.exists() and any(dest.iterdir()):
        raise BuildError(f"build context directory {dest} is not empty")
    files = source_files(source_root)
    if Path("setup.py") not in files or Path("setup.cfg") not in files:
        raise BuildError(f"{source_root} is not a Shoal source tree (no setup.py, setup.cfg)")
    dest.mkdir(parents=True, exist_ok=True)
    (dest / "Dockerfile").write_text(dockerfile)
    (dest / ".dockerignore").write_text(DOCKERIGNORE)
    (dest / "requirements.txt").write_text(
        requirements((Path(source_root) / "setup.cfg").read_text()))
    if ca_certificates:
        (dest / "certs").mkdir()
    for cert in ca_certificates:
        shutil.copyfile(cert, dest / "certs" / Path(cert).name)
    for rel in files:
        target = dest / "src" / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(Path(source_root) / rel, target)
        shutil.copymode(Path(source_root) / rel, target)
    return dest


def default_source_root() -> Path:
    """The repository this package was installed from (an editable install's checkout)."""
    root = Path(__file__).resolve().parent.parent
    if not (root / "setup.py").is_file():
        raise BuildError(
            f"no Shoal source tree at {root}: pass --source pointing at a checkout of Shoal")
    return root
