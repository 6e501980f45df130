"""The endpoint's JSON 1.1 protocol: ``parse`` names the service and operation from
X-Amz-Target and checks the body as the service does (botocore's validator, then maximums,
enums and patterns with the service's camel-case member names); ``encode`` writes timestamps
as epoch seconds and leaves out nulls."""

from __future__ import annotations

import datetime as dt
import json
import time

import pytest
from shoal.server import protocol
from shoal.server.api_errors import UnknownOperationException, ValidationException


def create_request(**changes) -> dict:
    request = {
        "TrainingJobName": "my-job-1",
        "AlgorithmSpecification": {"TrainingImage": "x", "TrainingInputMode": "File"},
        "RoleArn": "arn:aws:iam::111122223333:role/R",
        "OutputDataConfig": {"S3OutputPath": "s3://b/o"},
        "ResourceConfig": {"InstanceType": "ml.m5.xlarge", "InstanceCount": 1, "VolumeSizeInGB": 30},
        "StoppingCondition": {"MaxRuntimeInSeconds": 3600},
    }
    request.update(changes)
    return request


def body(params) -> bytes:
    return json.dumps(params).encode()


def refused(target, raw: bytes) -> ValidationException:
    with pytest.raises(ValidationException) as caught:
        protocol.parse(target, raw)
    return caught.value


def test_a_valid_create_training_job_is_parsed():
    request = create_request()
    call = protocol.parse("SageMaker.CreateTrainingJob", body(request))
    assert (call.service, call.operation) == ("sagemaker", "CreateTrainingJob")
    assert call.params == request


def test_a_logs_call_is_the_logs_service():
    call = protocol.parse("Logs_20140328.GetLogEvents",
                          body({"logGroupName": "/aws/sagemaker/TrainingJobs", "logStreamName": "j/algo-1-1"}))
    assert (call.service, call.operation) == ("logs", "GetLogEvents")


def test_an_empty_body_is_an_empty_request():
    assert protocol.parse("SageMaker.ListTrainingJobs", b"").params == {}


@pytest.mark.parametrize("target", ["Foo.ListTrainingJobs", "SageMaker", None, "",
                                    "SageMaker.NoSuchOperation", "Logs_20140328.CreateTrainingJob"])
def test_unknown_targets_are_unknown_operations(target):
    with pytest.raises(UnknownOperationException) as caught:
        protocol.parse(target, b"{}")
    assert caught.value.code == "UnknownOperationException" and caught.value.status == 400


def test_a_body_that_is_not_json_is_refused():
    error = refused("SageMaker.ListTrainingJobs", b"not json {")
    assert error.code == "ValidationException" and error.status == 400
    assert "not JSON" in error.message


@pytest.mark.parametrize("raw", [b"[1, 2]", b'"text"', b"3"])
def test_a_body_that_is_not_an_object_is_refused(raw):
    assert "JSON object" in refused("SageMaker.ListTrainingJobs", raw).message


def test_a_missing_required_member_is_botocores_report():
    request = create_request()
    del request["RoleArn"]
    error = refused("SageMaker.CreateTrainingJob", body(request))
    assert "Missing required parameter" in error.message and "RoleArn" in error.message


def test_a_member_of_the_wrong_type_is_refused():
    error = refused("SageMaker.ListTrainingJobs", body({"MaxResults": "ten"}))
    assert "MaxResults" in error.message


def test_a_bad_training_job_name_names_the_member_in_camel_case():
    error = refused("SageMaker.CreateTrainingJob", body(create_request(TrainingJobName="bad_name!")))
    assert error.message.startswith("1 validation error detected: ")
    assert "Value 'bad_name!' at 'trainingJobName'" in error.message
    assert "regular expression pattern" in error.message


def test_a_name_longer_than_the_maximum_is_refused():
    error = refused("SageMaker.CreateTrainingJob", body(create_request(TrainingJobName="a" * 64)))
    assert "'trainingJobName'" in error.message and "less than or equal to 63" in error.message


def test_a_value_above_its_maximum_is_refused():
    error = refused("SageMaker.ListTrainingJobs", body({"MaxResults": 500}))
    assert error.message == ("1 validation error detected: Value '500' at 'maxResults' failed to "
                             "satisfy constraint: Member must have value less than or equal to 100")


def test_the_maximum_itself_passes():
    assert protocol.parse("SageMaker.ListTrainingJobs", body({"MaxResults": 100})).params == {"MaxResults": 100}


def test_an_enum_violation_lists_the_allowed_values():
    error = refused("SageMaker.ListTrainingJobs", body({"SortBy": "Bogus"}))
    assert "Value 'Bogus' at 'sortBy'" in error.message
    assert "enum value set: [" in error.message and "CreationTime" in error.message


def test_errors_are_counted():
    error = refused("SageMaker.ListTrainingJobs", body({"MaxResults": 500, "SortBy": "Bogus"}))
    assert error.message.startswith("2 validation errors detected: ")
    assert "'maxResults'" in error.message and "'sortBy'" in error.message


def test_nested_members_are_named_by_their_path():
    request = create_request(ResourceConfig={"InstanceType": "ml.bogus", "InstanceCount": 1,
                                             "VolumeSizeInGB": 30})
    error = refused("SageMaker.CreateTrainingJob", body(request))
    assert "at 'resourceConfig.instanceType'" in error.message


def test_a_file_uri_passes_where_an_s3_uri_is_wanted():
    request = create_request(OutputDataConfig={"S3OutputPath": "file:///tmp/out"})
    call = protocol.parse("SageMaker.CreateTrainingJob", body(request))
    assert call.params["OutputDataConfig"]["S3OutputPath"] == "file:///tmp/out"


def test_another_scheme_fails_the_s3_pattern():
    request = create_request(OutputDataConfig={"S3OutputPath": "ftp://x"})
    error = refused("SageMaker.CreateTrainingJob", body(request))
    assert "Value 'ftp://x' at 'outputDataConfig.s3OutputPath'" in error.message


@pytest.mark.parametrize("epoch", [1_700_000_000, 1_700_000_000.5])
def test_epoch_number_timestamps_pass_and_stay_numbers(epoch):
    call = protocol.parse("SageMaker.ListTrainingJobs", body({"CreationTimeAfter": epoch}))
    assert call.params == {"CreationTimeAfter": epoch}


def test_a_timestamp_that_is_not_a_time_is_refused():
    assert "CreationTimeAfter" in refused("SageMaker.ListTrainingJobs",
                                          body({"CreationTimeAfter": "yesterday"})).message


def test_encode_writes_aware_datetimes_as_epoch_seconds():
    at = dt.datetime(2024, 1, 2, 3, 4, 5, 250_000, tzinfo=dt.timezone.utc)
    shifted = at.astimezone(dt.timezone(dt.timedelta(hours=5)))
    out = json.loads(protocol.encode({"CreationTime": at, "Other": shifted}))
    assert out == {"CreationTime": 1704164645.25, "Other": 1704164645.25}


@pytest.fixture(params=["UTC0", "EST5", "IST-5:30"])  # POSIX zones: no tz database needed
def local_zone(request, monkeypatch):
    monkeypatch.setenv("TZ", request.param)
    time.tzset()
    yield request.param
    monkeypatch.undo()
    time.tzset()


def test_encode_reads_naive_datetimes_as_utc_whatever_the_local_zone(local_zone):
    assert (time.timezone != 0) == (local_zone != "UTC0")
    out = json.loads(protocol.encode({"T": dt.datetime(2024, 1, 2, 3, 4, 5)}))
    assert out == {"T": 1704164645}


def test_encode_drops_nulls_at_every_depth():
    out = json.loads(protocol.encode({"A": None, "B": {"C": None, "D": 1},
                                      "E": [{"F": None, "G": "x"}], "H": 0, "I": ""}))
    assert out == {"B": {"D": 1}, "E": [{"G": "x"}], "H": 0, "I": ""}


def test_encode_refuses_what_json_cannot_hold():
    with pytest.raises(TypeError):
        protocol.encode({"X": object()})
