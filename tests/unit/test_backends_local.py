"""Local mode's pure half: host trees and config files from a CreateTrainingJob request,
the job record's transitions, and the storage helpers for file:// and s3:// (moto)."""

import json
from pathlib import Path

import boto3
import pytest
from moto import mock_aws
from shoal.errors import InputError
from shoal.local import layout, state, storage
from shoal.local.runner import archive

REQUEST = {
    "TrainingJobName": "demo-2024-01-01-00-00-00-000",
    "AlgorithmSpecification": {"TrainingImage": "img", "TrainingInputMode": "File"},
    "RoleArn": "arn:aws:iam::111122223333:role/R",
    "HyperParameters": {"epochs": "3", "sagemaker_program": '"train.py"'},
    "InputDataConfig": [
        {"ChannelName": "train", "DataSource": {"S3DataSource": {
            "S3DataType": "S3Prefix", "S3Uri": "file:///data/train",
            "S3DataDistributionType": "FullyReplicated"}}},
        {"ChannelName": "test", "ContentType": "text/csv", "InputMode": "File",
         "DataSource": {"S3DataSource": {"S3DataType": "S3Prefix", "S3Uri": "s3://b/test"}}},
    ],
    "OutputDataConfig": {"S3OutputPath": "s3://b/out"},
    "ResourceConfig": {"InstanceType": "local", "InstanceCount": 2, "VolumeSizeInGB": 30},
    "StoppingCondition": {"MaxRuntimeInSeconds": 86400},
}


def test_hosts_and_resource_config_match_sagemaker_keys():
    assert layout.host_names(REQUEST) == ["algo-1", "algo-2"]
    config = layout.resource_config(REQUEST, "algo-2")
    assert config == {
        "current_host": "algo-2",
        "current_instance_type": "local",
        "current_group_name": "homogeneousCluster",
        "hosts": ["algo-1", "algo-2"],
        "instance_groups": [{"instance_group_name": "homogeneousCluster",
                             "instance_type": "local", "hosts": ["algo-1", "algo-2"]}],
        "network_interface_name": "lo",
    }


def test_instance_groups_number_hosts_across_groups():
    request = {**REQUEST, "ResourceConfig": {"InstanceGroups": [
        {"InstanceGroupName": "a", "InstanceType": "local", "InstanceCount": 1},
        {"InstanceGroupName": "b", "InstanceType": "local_gpu", "InstanceCount": 2},
    ]}}
    assert layout.host_names(request) == ["algo-1", "algo-2", "algo-3"]
    config = layout.resource_config(request, "algo-3")
    assert config["current_group_name"] == "b" and config["current_instance_type"] == "local_gpu"
    assert [g["hosts"] for g in config["instance_groups"]] == [["algo-1"], ["algo-2", "algo-3"]]


def test_input_data_config_and_hyperparameters():
    files = layout.config_files(REQUEST, "algo-1")
    assert files["inputdataconfig.json"] == {
        "train": {"TrainingInputMode": "File", "S3DistributionType": "FullyReplicated",
                  "RecordWrapperType": "None"},
        "test": {"TrainingInputMode": "File", "S3DistributionType": "FullyReplicated",
                 "RecordWrapperType": "None", "ContentType": "text/csv"},
    }
    assert files["hyperparameters.json"] == REQUEST["HyperParameters"]
    assert layout.channel_sources(REQUEST) == {"train": "file:///data/train", "test": "s3://b/test"}


def test_file_data_source_channels_as_sdk_v2_sends_them():
    request = {**REQUEST, "InputDataConfig": [{"ChannelName": "train", "DataSource": {
        "FileDataSource": {"FileUri": "file:///d", "FileDataDistributionType": "ShardedByS3Key"}}}]}
    assert layout.channel_sources(request) == {"train": "file:///d"}
    assert layout.input_data_config(request)["train"]["S3DistributionType"] == "ShardedByS3Key"


def test_file_system_channels_cannot_run_locally():
    request = {**REQUEST, "InputDataConfig": [{"ChannelName": "fsx", "DataSource": {
        "FileSystemDataSource": {"FileSystemId": "fs-1"}}}]}
    with pytest.raises(InputError, match="FileSystemDataSource inputs cannot run locally"):
        layout.channel_sources(request)


def test_paths_and_checkpoint_rerooting(tmp_path, monkeypatch):
    monkeypatch.setenv("SHOAL_LOCAL_ROOT", str(tmp_path))
    paths = layout.JobPaths.for_job("j")
    assert paths.job_dir == tmp_path / "j"
    assert paths.channel_dir("algo-2", "train") == tmp_path / "j/algo-2/input/data/train"
    assert paths.checkpoint_dir("algo-1") == tmp_path / "j/algo-1/checkpoints"
    assert paths.checkpoint_dir("algo-1", "/opt/ml/ckpt/x") == tmp_path / "j/algo-1/ckpt/x"
    assert paths.checkpoint_dir("algo-1", "/scratch/c") == tmp_path / "j/algo-1/scratch/c"
    assert layout.checkpoint_config(REQUEST) == (None, "/opt/ml/checkpoints")


@pytest.mark.parametrize("path", ["s3://b/out", "s3://b/out/"])
def test_artifacts_go_under_the_jobs_own_folder_on_s3(path):
    request = {**REQUEST, "OutputDataConfig": {"S3OutputPath": path}}
    assert layout.job_output(request) == "s3://b/out/demo-2024-01-01-00-00-00-000"
    assert layout.output_prefix(request) == "s3://b/out/demo-2024-01-01-00-00-00-000/output"
    assert layout.local_job_output(request) is None


@pytest.mark.parametrize("path", ["file:///tmp/o", "file:///tmp/o/", "/tmp/o"])
def test_a_file_output_path_gets_the_same_tree_as_s3(path):
    request = {**REQUEST, "OutputDataConfig": {"S3OutputPath": path}}
    assert layout.job_output(request) == "file:///tmp/o/demo-2024-01-01-00-00-00-000"
    assert layout.output_prefix(request) == "file:///tmp/o/demo-2024-01-01-00-00-00-000/output"
    assert layout.local_job_output(request) == Path("/tmp/o/demo-2024-01-01-00-00-00-000")


def test_record_transitions_are_describe_shaped(tmp_path):
    record = state.initial(REQUEST)
    assert record["TrainingJobStatus"] == "InProgress" and record["SecondaryStatus"] == "Starting"
    for status in ("Downloading", "Training", "Uploading"):
        record = state.transition(record, status)
    record = state.transition(record, "Failed")
    assert record["TrainingJobStatus"] == "Failed"
    assert [t["Status"] for t in record["SecondaryStatusTransitions"]] == [
        "Starting", "Downloading", "Training", "Uploading", "Failed"]
    assert all("EndTime" in t for t in record["SecondaryStatusTransitions"])
    assert record["TrainingEndTime"] >= record["TrainingStartTime"] >= record["CreationTime"]
    state.write(tmp_path / "job.json", record)
    again = state.read(tmp_path / "job.json")
    assert again["TrainingEndTime"] == record["TrainingEndTime"]
    assert again["HyperParameters"] == REQUEST["HyperParameters"]


def test_archive_merges_hosts_first_wins(tmp_path):
    for host, text in (("a", "from-a"), ("b", "from-b")):
        (tmp_path / host / "sub").mkdir(parents=True)
        (tmp_path / host / "model.pt").write_text(text)
        (tmp_path / host / "sub" / f"{host}.txt").write_text(host)
    import tarfile

    target = archive(tmp_path / "m.tar.gz", [tmp_path / "a", tmp_path / "b", tmp_path / "none"])
    with tarfile.open(target) as tar:
        assert sorted(tar.getnames()) == ["model.pt", "sub/a.txt", "sub/b.txt"]
        assert tar.extractfile("model.pt").read() == b"from-a"


@mock_aws
def test_s3_download_is_prefix_exact_and_upload_round_trips(tmp_path, monkeypatch):
    monkeypatch.setattr(storage, "_s3_client", None)
    s3 = boto3.client("s3", region_name="us-west-2")
    s3.create_bucket(Bucket="bkt", CreateBucketConfiguration={"LocationConstraint": "us-west-2"})
    for key in ("data/a.csv", "data/sub/b.csv", "database/no.csv", "one.csv"):
        s3.put_object(Bucket="bkt", Key=key, Body=key.encode())
    assert storage.download("s3://bkt/data", tmp_path / "d") == 2
    assert (tmp_path / "d/sub/b.csv").read_text() == "data/sub/b.csv"
    assert not (tmp_path / "d/no.csv").exists()
    assert storage.download("s3://bkt/one.csv", tmp_path / "one") == 1
    assert (tmp_path / "one/one.csv").exists()
    assert storage.upload_dir(tmp_path / "d", "s3://bkt/copy/") == 2
    body = s3.get_object(Bucket="bkt", Key="copy/sub/b.csv")["Body"].read()
    assert body == b"data/sub/b.csv"


@mock_aws
def test_s3_keys_that_escape_are_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(storage, "_s3_client", None)
    s3 = boto3.client("s3", region_name="us-west-2")
    s3.create_bucket(Bucket="bkt", CreateBucketConfiguration={"LocationConstraint": "us-west-2"})
    s3.put_object(Bucket="bkt", Key="p/../../evil", Body=b"x")
    with pytest.raises(InputError, match="outside"):
        storage.download("s3://bkt/p", tmp_path / "d")
    assert not (tmp_path / "evil").exists()


def test_file_copies(tmp_path):
    (tmp_path / "src/x").mkdir(parents=True)
    (tmp_path / "src/x/f").write_text("1")
    assert storage.download("file://" + str(tmp_path / "src"), tmp_path / "dst") == 1
    assert storage.upload_file(tmp_path / "dst/x/f", "file://" + str(tmp_path / "o/f")).endswith("o/f")
    assert json.loads((tmp_path / "o/f").read_text()) == 1
    with pytest.raises(InputError, match="does not exist"):
        storage.download(str(tmp_path / "missing"), tmp_path / "z")


def test_a_file_upload_cut_short_leaves_the_previous_file_whole(tmp_path, monkeypatch):
    import shutil

    target = tmp_path / "o" / "model.tar.gz"
    target.parent.mkdir()
    target.write_bytes(b"the model a reader may be reading")
    (tmp_path / "new").write_bytes(b"a newer model, longer than the first one")

    def copy_half(source, dest):  # a copy that dies halfway, as on a full disk or a kill
        Path(dest).write_bytes(Path(source).read_bytes()[:10])
        raise OSError("No space left on device")

    monkeypatch.setattr(shutil, "copy2", copy_half)
    with pytest.raises(OSError):
        storage.upload_file(tmp_path / "new", target.as_uri())
    assert target.read_bytes() == b"the model a reader may be reading"
    assert sorted(p.name for p in target.parent.iterdir()) == ["model.tar.gz"]


def test_submit_refuses_a_missing_file_channel_before_anything_runs(tmp_path):
    from shoal.backends.local import LocalBackend

    request = {**REQUEST, "InputDataConfig": [{"ChannelName": "train", "DataSource": {
        "FileDataSource": {"FileUri": (tmp_path / "nope").as_uri()}}}]}
    with pytest.raises(InputError, match="'train'.*does not exist on this machine"):
        LocalBackend(root=tmp_path / "jobs").submit(request)
    assert not (tmp_path / "jobs").exists()


@pytest.fixture
def no_runner(monkeypatch):
    """A submission that gets past its checks must not start a job here."""
    from shoal.local import process

    def refuse(*args):
        raise AssertionError("a job was started")

    monkeypatch.setattr(process, "spawn_runner", refuse)


def tree(path: Path) -> list[str]:
    return sorted(str(p.relative_to(path)) for p in path.rglob("*"))


@pytest.mark.parametrize("taken", [REQUEST["TrainingJobName"], REQUEST["TrainingJobName"].upper()])
def test_a_job_name_is_used_once_regardless_of_case(tmp_path, no_runner, taken):
    from shoal.backends.local import LocalBackend
    from shoal.errors import JobNameInUseError

    (tmp_path / "jobs" / taken).mkdir(parents=True)
    request = {**REQUEST, "OutputDataConfig": {"S3OutputPath": (tmp_path / "out").as_uri()}}
    with pytest.raises(JobNameInUseError, match=f"{taken!r} already exists") as caught:
        LocalBackend(root=tmp_path / "jobs").submit(request)
    assert caught.value.job_name == REQUEST["TrainingJobName"]
    assert tree(tmp_path) == ["jobs", f"jobs/{taken}"]


def test_a_name_whose_folder_another_job_left_in_the_output_path_is_refused(tmp_path, no_runner):
    from shoal.backends.local import LocalBackend
    from shoal.errors import JobNameInUseError

    folder = tmp_path / "out" / REQUEST["TrainingJobName"] / "output"
    folder.mkdir(parents=True)
    (folder / "model.tar.gz").write_bytes(b"another job's model")
    request = {**REQUEST, "OutputDataConfig": {"S3OutputPath": (tmp_path / "out").as_uri()}}
    with pytest.raises(JobNameInUseError, match="left its artifacts there"):
        LocalBackend(root=tmp_path / "jobs").submit(request)
    assert not (tmp_path / "jobs").exists()
    assert (folder / "model.tar.gz").read_bytes() == b"another job's model"


def test_submit_claims_the_jobs_folder_under_a_file_output_path(tmp_path, monkeypatch):
    from shoal.backends.local import LocalBackend
    from shoal.errors import JobNameInUseError
    from shoal.local import process

    class Started:
        pid = 1

        def create_time(self):
            return 0.0

    monkeypatch.setattr(process, "spawn_runner", lambda *args: Started())
    request = {**REQUEST, "InputDataConfig": [],
               "OutputDataConfig": {"S3OutputPath": (tmp_path / "out").as_uri()}}
    LocalBackend(root=tmp_path / "jobs").submit(request)
    assert (tmp_path / "out" / REQUEST["TrainingJobName"]).is_dir()
    # a job of the same name in another local root would write there: refused
    with pytest.raises(JobNameInUseError):
        LocalBackend(root=tmp_path / "other-jobs").submit(request)
    assert not (tmp_path / "other-jobs").exists()


def test_local_code_is_placed_as_staging_would_archive_it(tmp_path):
    from shoal.local.runner import local_code, place_code

    source = tmp_path / "src"
    (source / "pkg").mkdir(parents=True)
    (source / "train.py").write_text("print(1)\n")
    (source / "pkg" / "util.py").write_text("X = 1\n")
    (source / ".git").mkdir()
    (source / ".git" / "config").write_text("secret remote\n")
    (source / ".venv").mkdir()
    (source / ".venv" / "pyvenv.cfg").write_text("home = /usr\n")
    request = {**REQUEST, "HyperParameters": {
        "sagemaker_program": '"train.py"', "sagemaker_submit_directory": json.dumps(source.as_uri())}}
    assert local_code(request) == str(source)
    place_code(request, local_code(request), tmp_path / "code")
    placed = sorted(p.relative_to(tmp_path / "code").as_posix()
                    for p in (tmp_path / "code").rglob("*") if p.is_file())
    assert placed == ["pkg/util.py", "train.py"]
    assert local_code({**REQUEST, "HyperParameters": {
        "sagemaker_submit_directory": '"s3://b/k/sourcedir.tar.gz"'}}) is None


def test_submit_refuses_local_code_that_is_not_there(tmp_path, monkeypatch):
    from shoal.backends.local import LocalBackend
    from shoal.errors import SourceCodeError
    from shoal.local import process

    class Spawned(Exception):
        pass

    def spawn(*args):
        raise Spawned

    monkeypatch.setattr(process, "spawn_runner", spawn)
    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "train.py").write_text("print(1)\n")
    (tmp_path / "sourcedir.tar.gz").write_bytes(b"")

    def submit(directory, program):
        LocalBackend(root=tmp_path / "jobs").submit({
            **REQUEST, "InputDataConfig": [], "HyperParameters": {
                "sagemaker_program": json.dumps(program),
                "sagemaker_submit_directory": json.dumps((tmp_path / directory).as_uri())}})

    with pytest.raises(SourceCodeError) as caught:
        submit("nocode", "train.py")
    assert str(caught.value) == f"'source_dir' is not a directory: '{tmp_path}/nocode'"
    with pytest.raises(SourceCodeError) as caught:
        submit("code", "trian.py")
    assert str(caught.value) == (f"'entry_point' names no file: 'trian.py' not found in "
                                 f"source_dir '{tmp_path}/code' (did you mean 'train.py'?)")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["code", "sourcedir.tar.gz"]
    with pytest.raises(Spawned):  # an archive is the launcher's to unpack
        submit("sourcedir.tar.gz", "train.py")
