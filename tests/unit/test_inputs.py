"""Training inputs: v2's channel dicts and the API's limits on them."""

import pytest
from shoal.errors import InputError
from shoal.inputs import (
    FileInput,
    FileSystemInput,
    ShuffleConfig,
    TrainingInput,
    input_config,
    lone_input_mode,
    parse_inputs,
)


def test_training_input_defaults_to_fully_replicated():
    assert TrainingInput("s3://b/p").config == {"DataSource": {"S3DataSource": {
        "S3DataType": "S3Prefix", "S3Uri": "s3://b/p", "S3DataDistributionType": "FullyReplicated"}}}


def test_training_input_all_fields():
    config = TrainingInput("s3://b/m", distribution="ShardedByS3Key", compression="Gzip",
                           content_type="text/csv", record_wrapping="RecordIO",
                           s3_data_type="ManifestFile", instance_groups=["g"],
                           input_mode="FastFile", attribute_names=["a"],
                           shuffle_config=ShuffleConfig(7)).config
    assert config == {
        "DataSource": {"S3DataSource": {
            "S3DataType": "ManifestFile", "S3Uri": "s3://b/m",
            "S3DataDistributionType": "ShardedByS3Key", "InstanceGroupNames": ["g"],
            "AttributeNames": ["a"]}},
        "CompressionType": "Gzip", "ContentType": "text/csv", "RecordWrapperType": "RecordIO",
        "InputMode": "FastFile", "ShuffleConfig": {"Seed": 7}}


def test_file_system_input():
    assert FileSystemInput("fs-0123abcd", "EFS", "/x", "rw", content_type="t").config == {
        "DataSource": {"FileSystemDataSource": {
            "FileSystemId": "fs-0123abcd", "FileSystemType": "EFS", "DirectoryPath": "/x",
            "FileSystemAccessMode": "rw"}}, "ContentType": "t"}


@pytest.mark.parametrize("make, message", [
    (lambda: TrainingInput("/local/path"), "'s3_data' must be an S3 URI"),
    (lambda: TrainingInput("s3://b/p", distribution="Sharded"), "'distribution' must be in"),
    (lambda: TrainingInput("s3://b/p", compression="zip"), "'compression' must be in"),
    (lambda: TrainingInput("s3://b/p", record_wrapping="Avro"), "'record_wrapping' must be in"),
    (lambda: TrainingInput("s3://b/p", s3_data_type="Prefix"), "'s3_data_type' must be in"),
    (lambda: TrainingInput("s3://b/p", input_mode="Stream"), "'input_mode' must be in"),
    (lambda: TrainingInput("s3://b/p", instance_groups=list("abcdef")),
     "'instance_groups' must have at most 5 entries"),
    (lambda: TrainingInput("s3://b/p", attribute_names=["a"] * 17),
     "'attribute_names' must have at most 16 entries"),
    (lambda: TrainingInput("s3://b/p", target_attribute_name="label"),
     "'target_attribute_name' is not accepted by the CreateTrainingJob API"),
    (lambda: ShuffleConfig("x"), "'seed' must be an int"),
    (lambda: FileSystemInput("fs-1", "EFS", "/x"), "'file_system_id' must match regex"),
    (lambda: FileSystemInput("fs-0123abcd", "NFS", "/x"), "'file_system_type' must be in"),
    (lambda: FileSystemInput("fs-0123abcd", "EFS", "/x", "rx"),
     "'file_system_access_mode' must be in"),
    (lambda: parse_inputs("hdfs://x"), "'inputs['training']' must be an S3 or file URI"),
    (lambda: parse_inputs({"a": 3}), "'inputs['a']' must be a URI, TrainingInput"),
    (lambda: input_config({"bad name": "s3://b/p"}), "'channel name' must match regex"),
    (lambda: input_config({f"c{i}": "s3://b/p" for i in range(21)}),
     "'inputs' must have at most 20 channels"),
    (lambda: input_config({"model": "s3://b/p"}, model_uri="s3://m/model.tar.gz"),
     "'model_channel_name' must not repeat a channel of inputs (got 'model')"),
])
def test_input_limits(make, message):
    with pytest.raises(InputError) as caught:
        make()
    assert message in str(caught.value)


def test_input_config_channels_and_model_channel():
    channels = input_config({"train": "s3://b/t", "local": "file:///d"},
                            model_uri="s3://m/model.tar.gz", model_channel_name="pre")
    assert [c["ChannelName"] for c in channels] == ["train", "local", "pre"]
    assert channels[1]["DataSource"] == {"FileDataSource": {
        "FileDataDistributionType": "FullyReplicated", "FileUri": "file:///d"}}
    assert channels[2]["ContentType"] == "application/x-sagemaker-model"
    assert channels[2]["InputMode"] == "File"
    assert input_config(None) is None


def test_lone_input_mode_only_for_a_single_training_input():
    assert lone_input_mode(TrainingInput("s3://b/t", input_mode="Pipe")) == "Pipe"
    assert lone_input_mode({"t": TrainingInput("s3://b/t", input_mode="Pipe")}) is None
    assert isinstance(parse_inputs("file:///x")["training"], FileInput)
