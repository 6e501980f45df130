"""S3 uploads: boto3's transfer manager, a byte progress bar, and bucket set-up.

Uploads go through ``s3transfer`` (multipart above the threshold, concurrent parts,
retries). A progress bar is drawn on a terminal or in a notebook and nothing is drawn
otherwise (CI logs, pipes). Buckets that Shoal picks itself are checked with
``ExpectedBucketOwner`` so that a bucket squatting on the predictable default name is
never written to.
"""

from __future__ import annotations

import os
from pathlib import Path

from boto3.s3.transfer import TransferConfig
from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TextColumn,
    TransferSpeedColumn,
)

from shoal.aws_errors import error_code, translated
from shoal.errors import PermissionError_


def encryption_args(kms_key: str | None) -> dict:
    """Server-side encryption: the KMS key when one is configured, else AES256."""
    if kms_key:
        return {"ServerSideEncryption": "aws:kms", "SSEKMSKeyId": kms_key}
    return {"ServerSideEncryption": "AES256"}


def create_bucket_args(bucket: str, region: str | None) -> dict:
    """CreateBucket's arguments; us-east-1 is the one region without a LocationConstraint."""
    args: dict = {"Bucket": bucket}
    if region and region != "us-east-1":
        args["CreateBucketConfiguration"] = {"LocationConstraint": region}
    return args


def ensure_bucket(s3_client, bucket: str, *, region: str | None, expected_owner: str) -> None:
    """Make sure ``bucket`` exists and belongs to ``expected_owner``, creating it if missing.

    A bucket of that name owned by someone else raises ``PermissionError_``.
    """
    try:
        with translated(f"HeadBucket {bucket}"):
            s3_client.head_bucket(Bucket=bucket, ExpectedBucketOwner=expected_owner)
        return
    except PermissionError_ as exc:
        raise PermissionError_(
            f"bucket {bucket!r} exists but is not owned by account {expected_owner} "
            "or is not readable with these credentials"
        ) from exc
    except Exception as exc:
        if error_code(exc) not in {"404", "NoSuchBucket", "NotFound"}:
            raise
    try:
        with translated(f"CreateBucket {bucket}"):
            s3_client.create_bucket(**create_bucket_args(bucket, region))
    except Exception as exc:
        code = error_code(exc)
        if code == "BucketAlreadyExists":
            raise PermissionError_(
                f"bucket {bucket!r} was just created by another account; choose another bucket"
            ) from exc
        if code != "BucketAlreadyOwnedByYou":
            raise
    with translated(f"HeadBucket {bucket}"):
        s3_client.head_bucket(Bucket=bucket, ExpectedBucketOwner=expected_owner)


def wants_progress(console: Console | None = None) -> bool:
    """Draw a bar on a terminal or in a notebook, never into a pipe or a log file."""
    console = console or Console(stderr=True)
    return bool(console.is_terminal or console.is_jupyter)


def _progress_bar(console: Console | None = None) -> Progress:
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        console=console or Console(stderr=True),
        transient=False,
    )


def upload_file(
    s3_client,
    path: str | os.PathLike,
    bucket: str,
    key: str,
    *,
    extra_args: dict | None = None,
    config: TransferConfig | None = None,
    progress: bool | None = None,
) -> None:
    """Upload one file through the transfer manager.

    ``progress``: True draws a bar, False never does, None decides by the output.
    """
    path = Path(path)
    kwargs = {
        "Filename": str(path),
        "Bucket": bucket,
        "Key": key,
        "ExtraArgs": dict(extra_args or {}),
        "Config": config or TransferConfig(),
    }
    if progress is None:
        progress = wants_progress()
    with translated(f"upload to s3://{bucket}/{key}"):
        if not progress:
            s3_client.upload_file(**kwargs)
            return
        with _progress_bar() as bar:
            task = bar.add_task(f"s3://{bucket}/{key}", total=path.stat().st_size)
            s3_client.upload_file(
                **kwargs, Callback=lambda sent: bar.update(task, advance=sent)
            )
