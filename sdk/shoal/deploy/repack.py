"""The model archive an inference container reads: the trained model with the code beside it.

SDK v2 repacks a framework model: the training ``model.tar.gz`` extracted, the inference
code (``source_dir``, or the entry point alone; ``dependencies`` under ``code/lib``) put in
``code/`` (replacing one already there), tarred again and written to a new place, never over
the user's archive. Extraction uses tarfile's ``data`` filter.
"""

from __future__ import annotations

import os
import shutil
import tarfile
import tempfile
from pathlib import Path


def fill_code(code_dir: Path, entry_point: str | None, source_dir: str | None,
              dependencies=()) -> None:
    if code_dir.exists():
        shutil.rmtree(code_dir)
    if source_dir:
        source = Path(source_dir)
        if source.is_file() and source.name.endswith((".tar.gz", ".tgz")):
            code_dir.mkdir(parents=True)
            with tarfile.open(source) as tar:
                tar.extractall(code_dir, filter="data")
        else:
            shutil.copytree(source, code_dir, ignore=shutil.ignore_patterns("__pycache__"))
    else:
        code_dir.mkdir(parents=True)
        if entry_point:
            shutil.copy2(entry_point, code_dir / os.path.basename(entry_point))
    for dependency in dependencies or ():
        target = code_dir / "lib" / os.path.basename(os.path.normpath(dependency))
        target.parent.mkdir(parents=True, exist_ok=True)
        if os.path.isdir(dependency):
            shutil.copytree(dependency, target)
        else:
            shutil.copy2(dependency, target)


def repack(model_archive: Path | None, out: Path, *, entry_point: str | None,
           source_dir: str | None, dependencies=()) -> Path:
    """Write ``out``: ``model_archive``'s files plus ``code/``."""
    with tempfile.TemporaryDirectory(prefix="shoal-repack-") as tmp:
        root = Path(tmp) / "model"
        root.mkdir()
        if model_archive is not None:
            with tarfile.open(model_archive) as tar:
                tar.extractall(root, filter="data")
        fill_code(root / "code", entry_point, source_dir, dependencies)
        out.parent.mkdir(parents=True, exist_ok=True)
        partial = out.with_name(out.name + ".partial")
        with tarfile.open(partial, "w:gz") as tar:
            for item in sorted(root.iterdir()):
                tar.add(item, arcname=item.name)
        os.replace(partial, out)
    return out
