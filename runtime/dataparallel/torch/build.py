"""Build and load the c10d backend extension (``csrc/*.cpp``) against the installed torch.

The extension is compiled just in time with ``torch.utils.cpp_extension.load`` and linked to
the collective core's shared library (``shoal.dataparallel.core.link_flags()``), so that a
process using both the torch backend and ``shoal.dataparallel.core`` has one core state. Builds are cached in a
directory keyed by the torch version and a digest of every source and core header, under
``SHOAL_EXTENSION_DIR`` or ``~/.cache/shoal/torch_ext``. Ranks starting together take an
exclusive file lock around the build: one compiles, the others wait and then load its result.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import threading
from collections.abc import Iterable, Mapping
from contextlib import contextmanager
from pathlib import Path

EXTENSION_NAME = "shoal_c10d"
SOURCES_DIR = Path(__file__).resolve().parent / "csrc"
CFLAGS = ("-O3",)

_loaded = None
_loaded_lock = threading.Lock()


def source_files(sources_dir: Path = SOURCES_DIR) -> list[Path]:
    """The extension's C++ translation units, in a stable order."""
    return sorted(sources_dir.glob("*.cpp"))


def header_files(include_dir: Path) -> list[Path]:
    """The core's public headers the extension compiles against."""
    return sorted((include_dir / "shoal").glob("*.h"))


def source_digest(files: Iterable[Path], flags: Iterable[str] = CFLAGS) -> str:
    """A digest of the files' names and contents and the build flags: a new digest
    means a new build directory, so a stale build is never loaded. The core library itself
    is left out: it is bound at run time by rpath, and its ABI is its headers."""
    digest = hashlib.sha256()
    for flag in flags:
        digest.update(flag.encode() + b"\0")
    for path in files:
        digest.update(path.name.encode() + b"\0")
        digest.update(Path(path).read_bytes())
        digest.update(b"\0")
    return digest.hexdigest()[:16]


def cache_root(environ: Mapping[str, str] = os.environ) -> Path:
    """Where builds are cached: ``SHOAL_EXTENSION_DIR``, else ``~/.cache/shoal/torch_ext``."""
    configured = environ.get("SHOAL_EXTENSION_DIR")
    if configured:
        return Path(configured).expanduser()
    return Path(environ.get("HOME", "~")).expanduser() / ".cache" / "shoal" / "torch_ext"


def build_directory(root: Path, torch_version: str, digest: str) -> Path:
    """The build directory for one torch version and one source digest."""
    safe_version = torch_version.replace("+", "_").replace("/", "_")
    return root / f"torch-{safe_version}" / digest


@contextmanager
def exclusive_lock(directory: Path):
    """An exclusive flock on ``directory/.lock``: released by the kernel if the holder dies,
    so a crashed build never leaves the other ranks waiting on a stale lock file."""
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / ".lock", "a+") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def load_extension(verbose: bool = False):
    """The compiled extension module, built on first use (or loaded from the cache)."""
    global _loaded
    with _loaded_lock:
        if _loaded is not None:
            return _loaded
        _loaded = _build_and_load(verbose)
        return _loaded


def _build_and_load(verbose: bool):
    import torch
    from shoal.dataparallel import core
    from torch.utils import cpp_extension

    include_dir = Path(core.include_dir())
    ldflags = list(core.link_flags())
    sources = source_files()
    own_headers = sorted(SOURCES_DIR.glob("*.h"))
    digest = source_digest([*sources, *own_headers, *header_files(include_dir)],
                           flags=(*CFLAGS, *ldflags))
    directory = build_directory(cache_root(), torch.__version__, digest)
    with exclusive_lock(directory), _explained(directory):
        return cpp_extension.load(
            name=EXTENSION_NAME,
            sources=[str(path) for path in sources],
            extra_cflags=list(CFLAGS),
            extra_include_paths=[str(include_dir)],
            extra_ldflags=ldflags,
            build_directory=str(directory),
            verbose=verbose,
        )


@contextmanager
def _explained(directory: Path):
    """Build failures as Shoal's RuntimeFailure, saying where the build ran."""
    from shoal.errors import RuntimeFailure

    try:
        yield
    except (RuntimeError, OSError, ImportError) as error:
        raise RuntimeFailure(
            f"building Shoal's c10d extension in {directory} failed (a C++ compiler and the "
            f"collective core are needed; SHOAL_EXTENSION_DIR moves the cache): {error}"
        ) from error
