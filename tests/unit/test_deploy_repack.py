"""Repacking a model with its code: code/ replaced, dependencies under code/lib, never in place."""

from __future__ import annotations

import io
import tarfile

import pytest
from shoal.deploy import repack


def archive(path, files: dict[str, bytes]):
    with tarfile.open(path, "w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def members(path) -> dict[str, bytes]:
    with tarfile.open(path) as tar:
        return {m.name: tar.extractfile(m).read() for m in tar if m.isfile()}


def test_the_model_gets_the_source_dir_as_code_and_the_dependencies_in_lib(tmp_path):
    trained = archive(tmp_path / "model.tar.gz", {"model.pt": b"weights",
                                                  "code/stale.py": b"old"})
    src = tmp_path / "src"
    src.mkdir()
    (src / "inference.py").write_text("def model_fn(d): pass\n")
    (src / "__pycache__").mkdir()
    (src / "__pycache__" / "x.pyc").write_bytes(b"")
    dep = tmp_path / "mylib"
    dep.mkdir()
    (dep / "util.py").write_text("X = 1\n")
    out = repack.repack(trained, tmp_path / "out" / "model.tar.gz", entry_point="inference.py",
                        source_dir=str(src), dependencies=[str(dep)])
    assert members(out) == {"model.pt": b"weights", "code/inference.py": b"def model_fn(d): pass\n",
                            "code/lib/mylib/util.py": b"X = 1\n"}
    assert members(trained)["code/stale.py"] == b"old"  # the user's archive is untouched


def test_an_entry_point_alone_and_a_source_tarball(tmp_path):
    trained = archive(tmp_path / "model.tar.gz", {"model.pt": b"w"})
    script = tmp_path / "serve.py"
    script.write_text("pass\n")
    out = repack.repack(trained, tmp_path / "a.tar.gz", entry_point=str(script), source_dir=None)
    assert set(members(out)) == {"model.pt", "code/serve.py"}
    sources = archive(tmp_path / "sourcedir.tar.gz", {"train.py": b"t", "pkg/m.py": b"m"})
    out = repack.repack(trained, tmp_path / "b.tar.gz", entry_point="train.py",
                        source_dir=str(sources))
    assert set(members(out)) == {"model.pt", "code/train.py", "code/pkg/m.py"}


def test_a_model_archive_escaping_its_folder_is_refused(tmp_path):
    evil = archive(tmp_path / "evil.tar.gz", {"../escape.txt": b"x"})
    with pytest.raises(tarfile.FilterError):
        repack.repack(evil, tmp_path / "out.tar.gz", entry_point=None, source_dir=None)
    assert not (tmp_path / "escape.txt").exists()
