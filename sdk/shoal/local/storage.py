"""Moving a local job's data: ``file://`` paths and ``s3://`` URIs, both ways.

S3 goes through boto3's transfer manager against whatever endpoint boto3 is configured for
(``AWS_ENDPOINT_URL_S3`` / ``AWS_ENDPOINT_URL`` are honoured by boto3 itself), so a local S3
server serves local jobs as well as AWS does. Every key downloaded is checked to land inside
the destination directory.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from urllib.parse import unquote, urlparse

from ..errors import InputError

_s3_client = None


def s3_client():
    """One client per process; boto3 reads the endpoint and region from the environment."""
    global _s3_client
    if _s3_client is None:
        import boto3  # imported lazily: most local jobs never touch S3

        _s3_client = boto3.session.Session().client("s3")
    return _s3_client


def split_s3(uri: str) -> tuple[str, str]:
    parsed = urlparse(uri)
    return parsed.netloc, parsed.path.lstrip("/")


def file_path(uri: str) -> Path:
    """``file:///a/b`` or a plain path -> ``Path('/a/b')``."""
    return Path(unquote(urlparse(uri).path) if uri.startswith("file://") else uri)


def is_s3(uri: str) -> bool:
    return uri.startswith("s3://")


def _inside(dest: Path, rel: str) -> Path:
    target = (dest / rel).resolve()
    if not target.is_relative_to(dest.resolve()):
        raise InputError(f"refusing S3 key {rel!r}: it would land outside {dest}")
    return target


def download(uri: str, dest: Path) -> int:
    """Copy the object or every object under the prefix ``uri`` into ``dest``; return the count."""
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    if not is_s3(uri):
        return _copy_local(file_path(uri), dest)
    bucket, prefix = split_s3(uri)
    client = s3_client()
    count = 0
    folder = prefix if prefix.endswith("/") or not prefix else prefix + "/"
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        for obj in page.get("Contents", []):
            key = obj["Key"]
            if key.endswith("/"):
                continue
            if key == prefix:
                rel = key.rsplit("/", 1)[-1]
            elif key.startswith(folder):
                rel = key[len(folder):]
            else:
                continue  # s3://b/data must not pull s3://b/database/...
            target = _inside(dest, rel)
            target.parent.mkdir(parents=True, exist_ok=True)
            client.download_file(bucket, key, str(target))
            count += 1
    return count


def _copy_local(source: Path, dest: Path) -> int:
    if not source.exists():
        raise InputError(f"{source} does not exist")
    if source.is_file():
        shutil.copy2(source, dest / source.name)
        return 1
    shutil.copytree(source, dest, dirs_exist_ok=True, symlinks=True)
    return sum(len(files) for _, _, files in os.walk(source))


def upload_file(path: Path, uri: str) -> str:
    """Put one file at ``uri`` (``s3://bucket/key`` or a local path/``file://``); return ``uri``."""
    if is_s3(uri):
        bucket, key = split_s3(uri)
        s3_client().upload_file(str(path), bucket, key)
    else:
        target = file_path(uri)
        target.parent.mkdir(parents=True, exist_ok=True)
        # copied beside the target, then renamed: a reader never sees half a model.tar.gz
        partial = target.with_name(f".{target.name}.{os.getpid()}.partial")
        try:
            shutil.copy2(path, partial)
            os.replace(partial, target)
        finally:
            partial.unlink(missing_ok=True)
    return uri


def upload_dir(source: Path, uri: str) -> int:
    """Copy every file under ``source`` to the prefix/directory ``uri``; return the count."""
    source = Path(source)
    count = 0
    for root, _, files in os.walk(source):
        for name in files:
            path = Path(root) / name
            rel = path.relative_to(source).as_posix()
            upload_file(path, join(uri, rel))
            count += 1
    return count


def join(uri: str, *parts: str) -> str:
    return "/".join([uri.rstrip("/"), *(p.strip("/") for p in parts)])
