"""Fetching the job's code into ``code/`` and installing its dependencies.

``sagemaker_submit_directory`` is an ``s3://`` URI of a tarball (downloaded with boto3,
honouring ``AWS_ENDPOINT_URL_S3`` and, when set, ``SHOAL_S3_EXPECTED_BUCKET_OWNER``), a
local directory, or a local tarball. Nothing is fetched when ``code/`` is already not
empty (the image or a previous host put the code there). Tarballs go through
:func:`shoal.launcher.extract.safe_extract`.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Callable, Mapping
from urllib.parse import urlparse

from shoal.errors import LaunchError, StagingError
from shoal.launcher.extract import safe_extract

log = logging.getLogger(__name__)


def s3_client(environ: Mapping[str, str] = os.environ):
    """A boto3 S3 client for the job's region and endpoint."""
    import boto3

    endpoint = environ.get("AWS_ENDPOINT_URL_S3") or environ.get("S3_ENDPOINT_URL") or None
    region = environ.get("AWS_REGION") or environ.get("SAGEMAKER_REGION") or None
    return boto3.client("s3", region_name=region, endpoint_url=endpoint)


def download_s3(uri: str, dst: str, client, expected_owner: str | None = None) -> None:
    parsed = urlparse(uri)
    bucket, key = parsed.netloc, parsed.path.lstrip("/")
    if not bucket or not key:
        raise StagingError(f"not an s3://bucket/key URI: {uri!r}")
    extra = {"ExpectedBucketOwner": expected_owner} if expected_owner else None
    client.download_file(bucket, key, dst, ExtraArgs=extra)


def fetch_code(
    uri: str | None,
    code_dir: str,
    *,
    client_factory: Callable[[], object] | None = None,
    environ: Mapping[str, str] = os.environ,
) -> bool:
    """Put the code at ``uri`` into ``code_dir``; False when skipped."""
    os.makedirs(code_dir, exist_ok=True)
    if not uri or os.listdir(code_dir):
        log.info("code directory %s is already populated; not fetching", code_dir)
        return False
    if uri.startswith("s3://"):
        client = (client_factory or (lambda: s3_client(environ)))()
        with tempfile.TemporaryDirectory() as tmp:
            dst = os.path.join(tmp, "sourcedir.tar.gz")
            download_s3(uri, dst, client, environ.get("SHOAL_S3_EXPECTED_BUCKET_OWNER"))
            safe_extract(dst, code_dir)
    elif os.path.isdir(uri):
        if os.path.realpath(uri) != os.path.realpath(code_dir):
            shutil.copytree(uri, code_dir, dirs_exist_ok=True, symlinks=True)
    elif os.path.isfile(uri) and tarfile.is_tarfile(uri):
        safe_extract(uri, code_dir)
    elif os.path.isfile(uri):
        shutil.copy2(uri, code_dir)
    else:
        raise StagingError(f"sagemaker_submit_directory {uri!r} does not exist")
    return True


def install_commands(code_dir: str, python: str = sys.executable) -> list[list[str]]:
    """pip commands for ``requirements.txt`` and for a package with ``setup.py`` (pure)."""
    commands = []
    if os.path.exists(os.path.join(code_dir, "requirements.txt")):
        commands.append([python, "-m", "pip", "install", "-r", "requirements.txt"])
    if os.path.exists(os.path.join(code_dir, "setup.py")):
        commands.append([python, "-m", "pip", "install", "."])
    return commands


def install_dependencies(code_dir: str, python: str = sys.executable) -> None:
    for argv in install_commands(code_dir, python):
        log.info("installing: %s", " ".join(argv))
        done = subprocess.run(argv, cwd=code_dir, capture_output=True, text=True)
        sys.stdout.write(done.stdout)
        sys.stderr.write(done.stderr)
        if done.returncode:
            tail = "\n".join(done.stderr.strip().splitlines()[-5:])
            raise LaunchError(
                f"{' '.join(argv[2:])} failed with exit code {done.returncode}: {tail}"
            )
