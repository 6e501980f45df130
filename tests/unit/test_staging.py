"""Staging: archive layout, ignores, symlink checks, reproducibility, and the upload."""

import gzip
import io
import os
import tarfile

import boto3
import pytest
from moto import mock_aws
from shoal import staging
from shoal.errors import PermissionError_, StagingError

REGION = "us-west-2"
ACCOUNT = "123456789012"  # moto's default account


def make_tree(root, files):
    for rel, content in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content)
    return root


@pytest.fixture
def code(tmp_path):
    return make_tree(
        tmp_path / "code",
        {
            "train.py": "print('train')\n",
            "lib/model.py": "X = 1\n",
            "lib/__pycache__/model.cpython-311.pyc": "junk",
            ".git/HEAD": "ref: refs/heads/main\n",
            ".ipynb_checkpoints/train-checkpoint.py": "old",
            ".venv/lib/site.py": "venv",
            "env2/pyvenv.cfg": "home = /usr/bin\n",
            "env2/lib/x.py": "venv",
            ".env": "SECRET=1\n",
            "requirements.txt": "numpy\n",
        },
    )


def names(tar_bytes):
    with tarfile.open(fileobj=io.BytesIO(tar_bytes), mode="r:gz") as tar:
        return sorted(tar.getnames())


def test_layout_source_dir_at_root_with_default_ignores(code):
    members = staging.collect_members("train.py", str(code))
    assert [m.arcname for m in members] == [
        "lib",
        "lib/model.py",
        "requirements.txt",
        "train.py",
    ]


def test_without_source_dir_only_the_entry_point(code):
    members = staging.collect_members(str(code / "lib" / "model.py"))
    assert [m.arcname for m in members] == ["model.py"]


def test_dependencies_land_under_their_basename(code, tmp_path):
    dep = make_tree(tmp_path / "mylib", {"__init__.py": "", "core.py": "Y = 2\n"})
    single = tmp_path / "helper.py"
    single.write_text("Z = 3\n")
    members = staging.collect_members("train.py", str(code), [str(dep), str(single)])
    arcnames = [m.arcname for m in members]
    assert "mylib/core.py" in arcnames
    assert "mylib/__init__.py" in arcnames
    assert "helper.py" in arcnames
    assert "train.py" in arcnames


def test_custom_ignore_replaces_defaults(code):
    members = staging.collect_members("train.py", str(code), ignore=("*.txt", "lib/"))
    arcnames = [m.arcname for m in members]
    assert "requirements.txt" not in arcnames
    assert "lib/model.py" not in arcnames
    assert ".git/HEAD" in arcnames  # defaults no longer apply
    assert not any(a.startswith("env2") for a in arcnames)  # pyvenv.cfg dirs always skipped


def test_path_pattern_matches_from_root(code):
    members = staging.collect_members("train.py", str(code), ignore=("lib/*.py",))
    assert "lib/model.py" not in [m.arcname for m in members]


def test_symlink_leaving_source_dir_is_refused(code, tmp_path):
    outside = tmp_path / "secret.txt"
    outside.write_text("secret")
    os.symlink(outside, code / "link.txt")
    with pytest.raises(StagingError, match="points outside"):
        staging.collect_members("train.py", str(code))


def test_symlinked_directory_escape_is_refused(code, tmp_path):
    (tmp_path / "elsewhere").mkdir()
    os.symlink(tmp_path / "elsewhere", code / "lib" / "far")
    with pytest.raises(StagingError, match="points outside"):
        staging.collect_members("train.py", str(code))


def test_symlink_inside_source_dir_is_archived_as_content(code):
    os.symlink(code / "lib" / "model.py", code / "alias.py")
    members = staging.collect_members("train.py", str(code))
    tar_path = staging.write_archive(members, code.parent / "a.tar.gz")
    with tarfile.open(tar_path) as tar:
        info = tar.getmember("alias.py")
        assert info.isfile()
        assert tar.extractfile(info).read() == b"X = 1\n"


def test_symlink_loop_is_refused(code):
    os.symlink(code, code / "lib" / "loop")
    with pytest.raises(StagingError, match="loop"):
        staging.collect_members("train.py", str(code))


def test_entry_point_must_exist_inside_source_dir(code):
    with pytest.raises(StagingError, match="not found"):
        staging.collect_members("missing.py", str(code))
    with pytest.raises(StagingError, match="relative"):
        staging.collect_members("../train.py", str(code))
    with pytest.raises(StagingError, match="not a file"):
        staging.collect_members(str(code / "nope.py"))


def test_ignored_entry_point_is_an_error(code):
    with pytest.raises(StagingError, match="excluded"):
        staging.collect_members("train.py", str(code), ignore=("train.py",))


def test_duplicate_arcnames_are_refused(code, tmp_path):
    other = make_tree(tmp_path / "x" / "lib", {"a.py": ""})
    with pytest.raises(StagingError, match="two files"):
        staging.collect_members("train.py", str(code), [str(other)])


def test_archive_is_reproducible_and_normalised(code, tmp_path):
    first = staging.write_archive(staging.collect_members("train.py", str(code)), tmp_path / "1")
    os.utime(code / "train.py", (1_700_000_000, 1_700_000_000))
    (code / "lib" / "model.py").chmod(0o600)
    second = staging.write_archive(staging.collect_members("train.py", str(code)), tmp_path / "2")
    data = first.read_bytes()
    assert data == second.read_bytes()
    assert data[4:8] == b"\0\0\0\0"  # gzip header mtime
    with tarfile.open(first) as tar:
        for info in tar.getmembers():
            assert (info.uid, info.gid, info.uname, info.gname) == (0, 0, "", "")
            assert info.mtime == staging.FIXED_MTIME
        assert tar.getmember("lib/model.py").mode == 0o644
        assert tar.getmember("lib").mode == 0o755


def test_executable_bit_survives(code, tmp_path):
    (code / "run.sh").write_text("#!/bin/sh\n")
    (code / "run.sh").chmod(0o700)
    path = staging.write_archive(staging.collect_members("train.py", str(code)), tmp_path / "a")
    with tarfile.open(path) as tar:
        assert tar.getmember("run.sh").mode == 0o755


def test_archive_changes_when_content_changes(code, tmp_path):
    first = staging.write_archive(staging.collect_members("train.py", str(code)), tmp_path / "1")
    (code / "train.py").write_text("print('changed')\n")
    second = staging.write_archive(staging.collect_members("train.py", str(code)), tmp_path / "2")
    assert first.read_bytes() != second.read_bytes()


def test_code_destination_rules():
    def default():
        return "shoal-us-west-2-123"

    assert staging.code_destination(
        "job-1", code_location="s3://cb/some/prefix/", output_path="s3://ob/out", default_bucket=default
    ) == ("cb", "some/prefix/job-1/source/sourcedir.tar.gz", False)
    assert staging.code_destination(
        "job-1", code_location=None, output_path="s3://ob/out/x", default_bucket=default
    ) == ("ob", "job-1/source/sourcedir.tar.gz", False)
    assert staging.code_destination(
        "job-1", code_location=None, output_path=None, default_bucket=default
    ) == ("shoal-us-west-2-123", "job-1/source/sourcedir.tar.gz", True)


def test_upload_args():
    assert staging.upload_args(None, ACCOUNT) == {
        "ServerSideEncryption": "AES256",
        "ExpectedBucketOwner": ACCOUNT,
    }
    assert staging.upload_args("arn:aws:kms:k", None) == {
        "ServerSideEncryption": "aws:kms",
        "SSEKMSKeyId": "arn:aws:kms:k",
    }


def test_s3_source_dir_is_used_as_is():
    staged = staging.stage_code(
        None,  # no client: nothing may be uploaded
        bucket="b",
        key="k",
        entry_point="train.py",
        source_dir="s3://code-bucket/prev/source/sourcedir.tar.gz",
    )
    assert staged == staging.StagedCode("s3://code-bucket/prev/source/sourcedir.tar.gz", "train.py")


@mock_aws
def test_stage_code_creates_bucket_and_uploads(code):
    s3 = boto3.client("s3", region_name=REGION)
    seen = []
    s3.meta.events.register(
        "provide-client-params.s3.*",
        lambda params, model, **_: seen.append((model.name, dict(params))),
    )
    staged = staging.stage_code(
        s3,
        bucket="shoal-default",
        key="job-1/source/sourcedir.tar.gz",
        entry_point="train.py",
        source_dir=str(code),
        expected_owner=ACCOUNT,
        region=REGION,
        progress=False,
    )
    staging_calls = list(seen)
    assert staged.s3_uri == "s3://shoal-default/job-1/source/sourcedir.tar.gz"
    assert staged.script_name == "train.py"
    location = s3.get_bucket_location(Bucket="shoal-default")["LocationConstraint"]
    assert location == REGION
    obj = s3.get_object(Bucket="shoal-default", Key="job-1/source/sourcedir.tar.gz")
    assert obj["ServerSideEncryption"] == "AES256"
    assert names(obj["Body"].read()) == ["lib", "lib/model.py", "requirements.txt", "train.py"]
    bucket_calls = [(op, p) for op, p in staging_calls if p.get("Bucket") == "shoal-default"]
    ops = [op for op, _ in bucket_calls]
    assert "CreateBucket" in ops and "PutObject" in ops
    for op, params in bucket_calls:
        if op != "CreateBucket":  # CreateBucket has no such parameter
            assert params.get("ExpectedBucketOwner") == ACCOUNT, op


@mock_aws
def test_bucket_of_another_owner_is_refused(code):
    s3 = boto3.client("s3", region_name=REGION)
    s3.create_bucket(Bucket="squatted", CreateBucketConfiguration={"LocationConstraint": REGION})

    def deny(params, **_):  # moto ignores ExpectedBucketOwner: answer as S3 would
        if params.get("ExpectedBucketOwner") not in (None, "999999999999"):
            from botocore.exceptions import ClientError

            raise ClientError({"Error": {"Code": "403", "Message": "Forbidden"}}, "HeadBucket")

    s3.meta.events.register("provide-client-params.s3.HeadBucket", deny)
    with pytest.raises(PermissionError_, match="not owned by account"):
        staging.stage_code(
            s3,
            bucket="squatted",
            key="k/sourcedir.tar.gz",
            entry_point="train.py",
            source_dir=str(code),
            expected_owner=ACCOUNT,
            region=REGION,
            progress=False,
        )


def test_gzip_header_has_no_file_name(code, tmp_path):
    path = staging.write_archive(staging.collect_members("train.py", str(code)), tmp_path / "a")
    raw = path.read_bytes()
    flags = raw[3]
    assert flags & 0x08 == 0  # FNAME not set
    assert gzip.decompress(raw)  # and it is a valid gzip stream


def test_code_kms_key_follows_v2():
    assert staging.code_kms_key("ob", "s3://ob/out", "k", None) == "k"
    assert staging.code_kms_key("cb", "s3://ob/out", "k", "s3://cb/p") is None
    assert staging.code_kms_key("ob", "s3://ob/out", "k", "s3://ob/code") == "k"
    assert staging.code_kms_key("ob", "s3://ob/out", None, None) is None


@mock_aws
def test_stage_for_job_uses_the_default_bucket_with_owner_check(code):
    from shoal.session import Session

    session = Session(boto_session=boto3.Session(region_name=REGION))
    owners = []
    session.s3_client.meta.events.register(
        "provide-client-params.s3.*",
        lambda params, model, **_: owners.append((model.name, params.get("ExpectedBucketOwner"))),
    )
    staged = staging.stage_for_job(
        session, "job-9", entry_point="train.py", source_dir=str(code), progress=False
    )
    bucket = f"sagemaker-{REGION}-{ACCOUNT}"
    assert staged.s3_uri == f"s3://{bucket}/job-9/source/sourcedir.tar.gz"
    assert [op for op, owner in owners if owner != ACCOUNT] == ["CreateBucket"]
    head = session.s3_client.head_object(Bucket=bucket, Key="job-9/source/sourcedir.tar.gz")
    assert head["ServerSideEncryption"] == "AES256"


@mock_aws
def test_stage_for_job_in_a_user_bucket_with_kms(code):
    from shoal.session import Session

    session = Session(boto_session=boto3.Session(region_name=REGION))
    s3 = session.s3_client
    s3.create_bucket(Bucket="user-out", CreateBucketConfiguration={"LocationConstraint": REGION})
    key_id = boto3.client("kms", region_name=REGION).create_key()["KeyMetadata"]["KeyId"]
    calls = []
    s3.meta.events.register(
        "provide-client-params.s3.*", lambda params, model, **_: calls.append((model.name, dict(params)))
    )
    staged = staging.stage_for_job(
        session,
        "job-10",
        entry_point="train.py",
        source_dir=str(code),
        output_path="s3://user-out/results",
        output_kms_key=key_id,
        progress=False,
    )
    assert staged.s3_uri == "s3://user-out/job-10/source/sourcedir.tar.gz"
    assert [op for op, _ in calls] == ["PutObject"]  # a user's bucket: no head/create
    assert "ExpectedBucketOwner" not in calls[0][1]
    head = s3.head_object(Bucket="user-out", Key="job-10/source/sourcedir.tar.gz")
    assert head["ServerSideEncryption"] == "aws:kms"


def test_aws_credentials_directory_is_ignored(code):
    (code / ".aws").mkdir()
    (code / ".aws" / "credentials").write_text("[default]\n")
    assert not any(m.arcname.startswith(".aws") for m in staging.collect_members("train.py", str(code)))


def test_shoalignore_adds_patterns_and_negation_takes_one_back(code):
    (code / "data.csv").write_text("1,2\n")
    (code / ".shoalignore").write_text("# local data\n*.csv\n\n!.env\n")
    arcnames = [m.arcname for m in staging.collect_members("train.py", str(code))]
    assert "data.csv" not in arcnames
    assert ".env" in arcnames  # re-included
    assert ".git/HEAD" not in arcnames  # the defaults still apply


def test_last_matching_pattern_wins():
    from pathlib import PurePosixPath

    rel = PurePosixPath("conf/keep.yaml")
    assert staging._matches(rel, False, ("*.yaml",))
    assert not staging._matches(rel, False, ("*.yaml", "!keep.yaml"))
    assert staging._matches(rel, False, ("!keep.yaml", "*.yaml"))
    assert not staging._matches(PurePosixPath("build"), False, ("build/",))  # dirs only


def test_a_missing_entry_point_is_named_with_the_nearest_file(code, monkeypatch):
    from shoal.errors import SourceCodeError, ValidationError

    with pytest.raises(SourceCodeError) as caught:
        staging.check_code_paths("trian.py", str(code))
    assert isinstance(caught.value, ValidationError)
    assert str(caught.value) == (f"'entry_point' names no file: 'trian.py' not found in "
                                 f"source_dir '{code}' (did you mean 'train.py'?)")
    with pytest.raises(SourceCodeError, match=r"'lib/modle\.py' not found .*'lib/model\.py'"):
        staging.check_code_paths("lib/modle.py", str(code))
    with pytest.raises(SourceCodeError, match="'entry_point' names no file: 'lib' is a directory"):
        staging.check_code_paths("lib", str(code))
    monkeypatch.chdir(code.parent)  # without source_dir the entry point is a path of its own
    with pytest.raises(SourceCodeError, match=r"'code/trian\.py' not found \(relative to "
                                              r".*\) \(did you mean 'code/train\.py'\?\)"):
        staging.check_code_paths("code/trian.py", None)


def test_a_source_dir_that_is_no_directory_is_named(code, monkeypatch):
    from shoal.errors import SourceCodeError

    with pytest.raises(SourceCodeError, match=f"^'source_dir' is not a directory: "
                                              f"'{code.parent}/nocode'$"):
        staging.check_code_paths("train.py", str(code.parent / "nocode"))
    monkeypatch.chdir(code)
    with pytest.raises(SourceCodeError, match=r"'source_dir' is not a directory: 'train\.py' "
                                              r"\(relative to "):
        staging.check_code_paths("x.py", "train.py")  # a file, as v2 refuses it


@pytest.mark.parametrize("entry_point, source_dir", [
    ("train.py", "code"),
    ("lib/model.py", "code"),  # relative to source_dir, in a subdirectory
    ("./train.py", "code"),
    ("{code}/train.py", "code"),  # v2 joins an absolute path to nothing
    ("code/train.py", None),  # without source_dir: a path from the working directory
    ("{code}/train.py", None),
    ("missing.py", "s3://bucket/prefix/sourcedir.tar.gz"),  # an archive: taken as is
    ("missing.py", "S3://bucket/sourcedir.tar.gz"),
    (None, None),
])
def test_what_sagemaker_v2_takes_is_taken(code, monkeypatch, entry_point, source_dir):
    monkeypatch.chdir(code.parent)
    entry_point = entry_point and entry_point.format(code=code)
    staging.check_code_paths(entry_point, source_dir)


@pytest.mark.parametrize("entry_point, source_dir", [
    ("train.py", "code"), ("lib/model.py", "code"), ("trian.py", "code"), ("lib", "code"),
    ("train.py", "nocode"), ("x.py", "code/train.py"), ("code/train.py", "."),
])
def test_a_local_source_dir_is_refused_where_sagemaker_v2_refuses_it(code, monkeypatch,
                                                                    entry_point, source_dir):
    from shoal.errors import SourceCodeError

    fw_utils = pytest.importorskip("sagemaker.fw_utils")
    monkeypatch.chdir(code.parent)
    try:
        fw_utils.validate_source_dir(entry_point, source_dir)
        v2_refuses = False
    except ValueError:
        v2_refuses = True
    try:
        staging.check_code_paths(entry_point, source_dir)
        refused = False
    except SourceCodeError:
        refused = True
    assert refused == v2_refuses
