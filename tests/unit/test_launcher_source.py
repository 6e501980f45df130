"""Fetching code from S3 (moto), a directory or a tarball; dependency installation."""

import io
import os
import tarfile

import boto3
import pytest
from moto import mock_aws
from shoal.errors import StagingError
from shoal.launcher.source import fetch_code, install_commands


def tarball(files, escape=False):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        if escape:
            info = tarfile.TarInfo("../evil.py")
            info.size = 1
            tar.addfile(info, io.BytesIO(b"x"))
    return buf.getvalue()


@mock_aws
def test_fetch_from_s3(tmp_path):
    s3 = boto3.client("s3", region_name="us-west-2")
    s3.create_bucket(Bucket="shoal-code", CreateBucketConfiguration={"LocationConstraint": "us-west-2"})
    s3.put_object(Bucket="shoal-code", Key="job/source/sourcedir.tar.gz",
                  Body=tarball({"train.py": b"print(1)\n", "lib/util.py": b""}))  # fmt: skip
    code = tmp_path / "code"
    assert fetch_code("s3://shoal-code/job/source/sourcedir.tar.gz", str(code),
                      client_factory=lambda: s3, environ={})  # fmt: skip
    assert (code / "train.py").read_text() == "print(1)\n"
    assert (code / "lib" / "util.py").exists()


@mock_aws
def test_s3_archive_with_escape_is_refused(tmp_path):
    s3 = boto3.client("s3", region_name="us-west-2")
    s3.create_bucket(Bucket="shoal-code", CreateBucketConfiguration={"LocationConstraint": "us-west-2"})
    s3.put_object(Bucket="shoal-code", Key="src.tar.gz", Body=tarball({"a.py": b""}, escape=True))
    with pytest.raises(StagingError, match="refusing source archive"):
        fetch_code("s3://shoal-code/src.tar.gz", str(tmp_path / "code"), client_factory=lambda: s3,
                   environ={})  # fmt: skip
    assert os.listdir(tmp_path / "code") == []
    assert not (tmp_path / "evil.py").exists()


def test_s3_client_uses_the_endpoint_variable(monkeypatch):
    from shoal.launcher.source import s3_client

    client = s3_client({"AWS_ENDPOINT_URL_S3": "http://127.0.0.1:9", "AWS_REGION": "eu-west-1"})
    assert client.meta.endpoint_url == "http://127.0.0.1:9"
    assert client.meta.region_name == "eu-west-1"


def test_fetch_from_directory_and_tarball(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "train.py").write_text("x")
    assert fetch_code(str(src), str(tmp_path / "code1"))
    assert (tmp_path / "code1" / "train.py").read_text() == "x"
    archive = tmp_path / "s.tar.gz"
    archive.write_bytes(tarball({"train.py": b"y"}))
    assert fetch_code(str(archive), str(tmp_path / "code2"))
    assert (tmp_path / "code2" / "train.py").read_text() == "y"


def test_populated_code_dir_is_not_touched(tmp_path):
    code = tmp_path / "code"
    code.mkdir()
    (code / "train.py").write_text("mine")
    assert fetch_code("s3://never/used.tar.gz", str(code)) is False
    assert (code / "train.py").read_text() == "mine"


def test_missing_source_is_an_error(tmp_path):
    with pytest.raises(StagingError, match="does not exist"):
        fetch_code(str(tmp_path / "nope"), str(tmp_path / "code"))


def test_install_commands(tmp_path):
    assert install_commands(str(tmp_path), "py") == []
    (tmp_path / "requirements.txt").write_text("six\n")
    (tmp_path / "setup.py").write_text("")
    assert install_commands(str(tmp_path), "py") == [
        ["py", "-m", "pip", "install", "-r", "requirements.txt"],
        ["py", "-m", "pip", "install", "."]]
