"""Safe extraction of the job's source archive into ``code/``.

Every member is checked before anything is written, and the archive is refused as a whole
(``StagingError``) when one member could land outside the destination: absolute names,
``..`` components, symlinks or hardlinks whose target escapes, members reached through a
symlink of the same archive, and device or FIFO nodes. The extraction itself then runs with
tarfile's ``data`` filter as a second line of defence (it also drops setuid bits).
"""

from __future__ import annotations

import os
import posixpath
import tarfile

from shoal.errors import StagingError


def _refuse(archive: str, member: tarfile.TarInfo, why: str) -> StagingError:
    return StagingError(f"refusing source archive {archive}: member {member.name!r} {why}")


def _escapes(path: str) -> bool:
    """True when a normalised archive-relative path leaves the archive root."""
    return path == ".." or path.startswith("../") or posixpath.isabs(path)


def _check_member(archive: str, member: tarfile.TarInfo, links: set[str]) -> None:
    name = member.name
    if posixpath.isabs(name) or (os.name == "nt" and ":" in name):
        raise _refuse(archive, member, "has an absolute path")
    if ".." in name.split("/"):
        raise _refuse(archive, member, "has a '..' component")
    norm = posixpath.normpath(name)
    if _escapes(norm):
        raise _refuse(archive, member, "resolves outside the destination")
    parts = norm.split("/")
    for i in range(1, len(parts)):
        if "/".join(parts[:i]) in links:
            raise _refuse(archive, member, "is reached through a symlink in the archive")
    if member.ischr() or member.isblk() or member.isfifo():
        raise _refuse(archive, member, "is a device or FIFO node")
    if member.issym():
        if posixpath.isabs(member.linkname):
            raise _refuse(archive, member, f"is a symlink to an absolute path {member.linkname!r}")
        target = posixpath.normpath(posixpath.join(posixpath.dirname(norm), member.linkname))
        if _escapes(target):
            raise _refuse(archive, member, f"is a symlink escaping to {member.linkname!r}")
        links.add(norm)
    elif member.islnk():
        target = posixpath.normpath(member.linkname)
        if posixpath.isabs(member.linkname) or _escapes(target):
            raise _refuse(archive, member, f"is a hardlink escaping to {member.linkname!r}")
    elif not (member.isfile() or member.isdir()):
        raise _refuse(archive, member, "is not a regular file, directory or link")


def check_archive(archive: str) -> list[tarfile.TarInfo]:
    """Every member of ``archive``, after checking that none can escape."""
    try:
        with tarfile.open(archive, mode="r:*") as tar:
            members = tar.getmembers()
    except (tarfile.TarError, OSError) as e:
        raise StagingError(f"cannot read source archive {archive}: {e}") from None
    links: set[str] = set()
    for member in members:
        _check_member(archive, member, links)
    return members


def safe_extract(archive: str, dest: str) -> None:
    """Extract ``archive`` into ``dest`` or refuse it whole, writing nothing."""
    check_archive(archive)
    os.makedirs(dest, exist_ok=True)
    with tarfile.open(archive, mode="r:*") as tar:
        try:
            tar.extractall(dest, filter="data")
        except tarfile.FilterError as e:
            raise StagingError(f"refusing source archive {archive}: {e}") from None
