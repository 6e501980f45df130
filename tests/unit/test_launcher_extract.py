"""Every tar escape vector is refused as a whole, with nothing written anywhere."""

import io
import os
import tarfile

import pytest
from shoal.errors import StagingError
from shoal.launcher.extract import check_archive, safe_extract


def _add(tar, name, *, type_=tarfile.REGTYPE, data=b"x", linkname="", mode=0o644):
    info = tarfile.TarInfo(name)
    info.type, info.linkname, info.mode = type_, linkname, mode
    info.size = len(data) if type_ == tarfile.REGTYPE else 0
    tar.addfile(info, io.BytesIO(data) if type_ == tarfile.REGTYPE else None)


def make_archive(path, members, compression="gz"):
    with tarfile.open(path, f"w:{compression}") as tar:
        _add(tar, "train.py", data=b"print('ok')\n")
        for name, kwargs in members:
            _add(tar, name, **kwargs)
    return str(path)


ESCAPES = {
    "absolute path": [("/tmp/shoal-escape-abs", {})],
    "dotdot": [("../escape.txt", {})],
    "nested dotdot": [("sub/../../escape.txt", {})],
    "symlink to absolute": [("link", {"type_": tarfile.SYMTYPE, "linkname": "/etc/passwd"})],
    "symlink upwards": [("sub/link", {"type_": tarfile.SYMTYPE, "linkname": "../../outside"})],
    "write through symlink": [
        ("d", {"type_": tarfile.SYMTYPE, "linkname": "."}),
        ("d/escape.txt", {}),
    ],
    "hardlink to absolute": [("hl", {"type_": tarfile.LNKTYPE, "linkname": "/etc/passwd"})],
    "hardlink upwards": [("hl", {"type_": tarfile.LNKTYPE, "linkname": "../outside.txt"})],
    "char device": [("dev", {"type_": tarfile.CHRTYPE})],
    "block device": [("blk", {"type_": tarfile.BLKTYPE})],
    "fifo": [("fifo", {"type_": tarfile.FIFOTYPE})],
}


def _all_files(root):
    return sorted(os.path.relpath(os.path.join(d, f), root)
                  for d, dirs, files in os.walk(root) for f in files + dirs)  # fmt: skip


@pytest.mark.parametrize("vector", sorted(ESCAPES))
def test_escape_vectors_are_refused_whole(tmp_path, vector):
    archive = make_archive(tmp_path / "src.tar.gz", ESCAPES[vector])
    dest = tmp_path / "job" / "code"
    before = _all_files(tmp_path)
    with pytest.raises(StagingError, match="refusing source archive"):
        safe_extract(archive, str(dest))
    # Nothing was written: not the good member, not the bad one, nowhere.
    assert _all_files(tmp_path) == before
    assert not os.path.exists("/tmp/shoal-escape-abs")


def test_message_names_the_member(tmp_path):
    archive = make_archive(tmp_path / "a.tar.gz", ESCAPES["dotdot"])
    with pytest.raises(StagingError, match=r"member '\.\./escape\.txt' has a '\.\.' component"):
        check_archive(archive)


def test_good_archive_with_internal_links_extracts(tmp_path):
    archive = make_archive(tmp_path / "ok.tar", [
        ("pkg/__init__.py", {"data": b""}),
        ("pkg/alias.py", {"type_": tarfile.SYMTYPE, "linkname": "__init__.py"}),
        ("copy.py", {"type_": tarfile.LNKTYPE, "linkname": "train.py"}),
        ("run.sh", {"data": b"#!/bin/sh\n", "mode": 0o4755}),
    ], compression="")  # fmt: skip
    dest = tmp_path / "code"
    safe_extract(archive, str(dest))
    assert (dest / "train.py").read_text() == "print('ok')\n"
    assert (dest / "copy.py").read_text() == "print('ok')\n"
    assert os.readlink(dest / "pkg" / "alias.py") == "__init__.py"
    assert not os.stat(dest / "run.sh").st_mode & 0o4000  # the data filter drops setuid


def test_not_an_archive(tmp_path):
    bad = tmp_path / "x.tar.gz"
    bad.write_bytes(b"not a tar")
    with pytest.raises(StagingError, match="cannot read source archive"):
        safe_extract(str(bad), str(tmp_path / "code"))
