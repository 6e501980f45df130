"""S3 transfer: multipart round trip, progress, bucket set-up, encryption arguments."""

import hashlib
import os

import boto3
import pytest
from boto3.s3.transfer import TransferConfig
from botocore.exceptions import ClientError
from moto import mock_aws
from rich.console import Console
from shoal import staging, transfer
from shoal.errors import CredentialsError, PermissionError_

REGION = "us-west-2"
ACCOUNT = "123456789012"
MB = 1024 * 1024


def test_encryption_args():
    assert transfer.encryption_args(None) == {"ServerSideEncryption": "AES256"}
    assert transfer.encryption_args("alias/k") == {
        "ServerSideEncryption": "aws:kms",
        "SSEKMSKeyId": "alias/k",
    }


def test_create_bucket_args():
    assert transfer.create_bucket_args("b", "us-east-1") == {"Bucket": "b"}
    assert transfer.create_bucket_args("b", "eu-west-1") == {
        "Bucket": "b",
        "CreateBucketConfiguration": {"LocationConstraint": "eu-west-1"},
    }


@mock_aws
def test_multipart_source_tree_round_trips(tmp_path):
    """A source tree above the (lowered) multipart threshold goes up in parts."""
    code = tmp_path / "code"
    code.mkdir()
    (code / "train.py").write_text("print(1)\n")
    (code / "weights.bin").write_bytes(os.urandom(12 * MB))  # random: gzip cannot shrink it
    s3 = boto3.client("s3", region_name=REGION)
    parts = []
    s3.meta.events.register(
        "provide-client-params.s3.UploadPart", lambda params, **_: parts.append(params)
    )
    config = TransferConfig(multipart_threshold=5 * MB, multipart_chunksize=5 * MB)
    staged = staging.stage_code(
        s3,
        bucket="shoal-mp",
        key="j/source/sourcedir.tar.gz",
        entry_point="train.py",
        source_dir=str(code),
        expected_owner=ACCOUNT,
        region=REGION,
        transfer_config=config,
        progress=False,
    )
    assert len(parts) >= 3
    assert all(p["ExpectedBucketOwner"] == ACCOUNT for p in parts)
    local = staging.write_archive(staging.collect_members("train.py", str(code)), tmp_path / "l")
    body = s3.get_object(Bucket="shoal-mp", Key="j/source/sourcedir.tar.gz")["Body"].read()
    assert hashlib.sha256(body).digest() == hashlib.sha256(local.read_bytes()).digest()
    assert staged.s3_uri == "s3://shoal-mp/j/source/sourcedir.tar.gz"


@mock_aws
def test_progress_bar_counts_every_byte(tmp_path, monkeypatch):
    path = tmp_path / "blob"
    path.write_bytes(b"x" * (3 * MB + 5))
    s3 = boto3.client("s3", region_name=REGION)
    s3.create_bucket(Bucket="progress-bucket", CreateBucketConfiguration={"LocationConstraint": REGION})
    advanced = []
    real_update = transfer.Progress.update

    def spy(self, task, **kw):
        advanced.append(kw.get("advance", 0))
        return real_update(self, task, **kw)

    monkeypatch.setattr(transfer.Progress, "update", spy)
    config = TransferConfig(multipart_threshold=MB, multipart_chunksize=MB)
    transfer.upload_file(s3, path, "progress-bucket", "k", config=config, progress=True)
    assert sum(advanced) == path.stat().st_size


def test_no_progress_into_a_pipe(tmp_path):
    console = Console(file=open(os.devnull, "w"), force_terminal=False, force_jupyter=False)
    assert transfer.wants_progress(console) is False
    assert transfer.wants_progress(Console(force_terminal=True)) is True


@mock_aws
def test_ensure_bucket_us_east_1_and_idempotent():
    s3 = boto3.client("s3", region_name="us-east-1")
    transfer.ensure_bucket(s3, "east", region="us-east-1", expected_owner=ACCOUNT)
    transfer.ensure_bucket(s3, "east", region="us-east-1", expected_owner=ACCOUNT)
    assert "east" in [b["Name"] for b in s3.list_buckets()["Buckets"]]


@mock_aws
def test_ensure_bucket_taken_by_another_account():
    s3 = boto3.client("s3", region_name=REGION)

    def answer(params, model, **_):
        if model.name == "HeadBucket":
            raise ClientError({"Error": {"Code": "404", "Message": "Not Found"}}, "HeadBucket")
        raise ClientError({"Error": {"Code": "BucketAlreadyExists", "Message": "taken"}}, "Create")

    s3.meta.events.register("provide-client-params.s3.*", answer)
    with pytest.raises(PermissionError_, match="another account"):
        transfer.ensure_bucket(s3, "taken", region=REGION, expected_owner=ACCOUNT)


@mock_aws
def test_upload_errors_are_translated(tmp_path):
    path = tmp_path / "f"
    path.write_text("x")
    s3 = boto3.client("s3", region_name=REGION)

    def expired(**_):
        raise ClientError({"Error": {"Code": "ExpiredToken", "Message": "expired"}}, "PutObject")

    s3.meta.events.register("provide-client-params.s3.PutObject", expired)
    with pytest.raises(CredentialsError, match="ExpiredToken"):
        transfer.upload_file(s3, path, "b", "k", progress=False)
