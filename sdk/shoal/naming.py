"""Names Shoal derives the way the SageMaker Python SDK v2 does: training job names
(``<base>-YYYY-MM-DD-HH-MM-SS-mmm``, UTC, within 63 characters), the base name taken
from an image URI, the default bucket, S3 path joins and the location of the staged
source archive (``sagemaker_submit_directory``)."""

from __future__ import annotations

import re
import time

from shoal import limits

ARCHIVE_NAME = "sourcedir.tar.gz"
_TIMESTAMPED = re.compile(r"^(.+)-(\d{4}-\d{2}-\d{2}-\d{2}-\d{2}-\d{2}-\d{3}|\d{6}-\d{4})")


def timestamp(moment: float | None = None) -> str:
    """``YYYY-MM-DD-HH-MM-SS-mmm`` in UTC."""
    moment = time.time() if moment is None else moment
    millis = int(round(moment * 1000)) % 1000
    return time.strftime("%Y-%m-%d-%H-%M-%S", time.gmtime(moment)) + f"-{millis:03d}"


def name_from_base(base: str, max_length: int = limits.JOB_NAME_MAX,
                   moment: float | None = None) -> str:
    """``<base>-<timestamp>``, the base cut so the whole fits in ``max_length``."""
    stamp = timestamp(moment)
    return f"{base[: max_length - len(stamp) - 1]}-{stamp}"


def base_from_name(name: str) -> str:
    """The base of a name made by :func:`name_from_base` (the name itself otherwise)."""
    match = _TIMESTAMPED.match(name)
    return match.group(1) if match else name


def base_name_from_image(image_uri: str) -> str:
    """The repository's last path part: ``.../shoal-pytorch-training:1.13.1-gpu-py39``
    -> ``shoal-pytorch-training``."""
    match = re.match(r"^(.+/)?([^:/]+)(:[^:]+)?$", image_uri)
    return match.group(2) if match else image_uri


def default_bucket_name(region: str, account: str) -> str:
    return f"sagemaker-{region}-{account}"


def s3_join(*parts: str | None, end_slash: bool = False) -> str:
    """Join S3 path parts with single slashes, keeping an ``s3://`` scheme intact.

    ``s3_join("s3://b/", "job", "model")`` -> ``s3://b/job/model``.
    """
    kept = [p for p in parts if p]
    scheme = ""
    if kept and kept[0].startswith("s3://"):
        scheme, kept[0] = "s3://", kept[0][len("s3://"):]
    body = "/".join(p.strip("/") for p in kept if p.strip("/"))
    if end_slash and (body or scheme):
        body += "/"
    return scheme + body


def parse_s3_uri(uri: str) -> tuple[str, str]:
    """``s3://bucket/a/b`` -> ``("bucket", "a/b")``."""
    bucket, _, key = uri[len("s3://"):].partition("/")
    return bucket, key


def source_archive_uri(job_name: str, *, code_location: str | None, output_path: str) -> str:
    """Where v2 puts ``sourcedir.tar.gz``: under ``code_location``'s bucket and prefix,
    else at the root of ``output_path``'s bucket (its prefix is not used):
    ``s3://<bucket>/[<prefix>/]<job>/source/sourcedir.tar.gz``."""
    if code_location:
        bucket, prefix = parse_s3_uri(code_location)
    else:
        bucket, prefix = parse_s3_uri(output_path)[0], ""
    return s3_join(f"s3://{bucket}", prefix, job_name, "source", ARCHIVE_NAME)
