"""Local endpoints' records and errors, as the SageMaker API words them (no server started)."""

from __future__ import annotations

import pytest
from botocore.exceptions import ClientError
from shoal.local.endpoints import LocalEndpoints, model_error


@pytest.fixture
def sm(tmp_path):
    return LocalEndpoints(tmp_path, region="eu-west-1")


def code_and_message(info) -> tuple[str, str]:
    return info.value.response["Error"]["Code"], info.value.response["Error"]["Message"]


def test_models_and_configs_are_stored_listed_and_deleted(sm, tmp_path):
    url = (tmp_path / "m.tar.gz")
    url.write_bytes(b"")
    arn = sm.create_model(ModelName="My-Model", ExecutionRoleArn="arn:r",
                          PrimaryContainer={"Image": "i", "ModelDataUrl": url.as_uri()})
    assert arn == {"ModelArn": "arn:aws:sagemaker:eu-west-1:000000000000:model/my-model"}
    described = sm.describe_model(ModelName="My-Model")
    assert described["PrimaryContainer"]["Image"] == "i" and described["CreationTime"].tzinfo
    assert [m["ModelName"] for m in sm.list_models(NameContains="Model")["Models"]] == [
        "My-Model"]
    config = sm.create_endpoint_config(EndpointConfigName="c", ProductionVariants=[
        {"VariantName": "AllTraffic", "ModelName": "My-Model", "InitialVariantWeight": 1}])
    assert config["EndpointConfigArn"].endswith(":endpoint-config/c")
    weight = sm.describe_endpoint_config(EndpointConfigName="c")["ProductionVariants"][0]
    assert weight["InitialVariantWeight"] == 1.0 and isinstance(weight["InitialVariantWeight"],
                                                                float)
    assert sm.delete_endpoint_config(EndpointConfigName="c") == {}
    assert sm.delete_model(ModelName="My-Model") == {}
    assert sm.list_models()["Models"] == []


def test_unknown_and_duplicate_names_get_the_services_messages(sm, tmp_path):
    with pytest.raises(ClientError) as info:
        sm.describe_endpoint(EndpointName="nope")
    assert code_and_message(info) == (
        "ValidationException",
        'Could not find endpoint "arn:aws:sagemaker:eu-west-1:000000000000:endpoint/nope".')
    with pytest.raises(ClientError, match='Could not find endpoint configuration ".*/nope"'):
        sm.create_endpoint(EndpointName="e", EndpointConfigName="nope")
    with pytest.raises(ClientError, match="Could not find model data at file:///absent"):
        sm.create_model(ModelName="m", PrimaryContainer={"Image": "i",
                                                         "ModelDataUrl": "file:///absent.tar.gz"})
    sm.create_model(ModelName="m", PrimaryContainer={"Image": "i"})
    with pytest.raises(ClientError, match='Cannot create already existing model ".*model/m"'):
        sm.create_model(ModelName="m", PrimaryContainer={"Image": "i"})
    sm.create_endpoint_config(EndpointConfigName="c", ProductionVariants=[
        {"VariantName": "AllTraffic", "ModelName": "gone"}])
    with pytest.raises(ClientError, match='Could not find model ".*model/gone"'):
        sm.create_endpoint(EndpointName="e", EndpointConfigName="c")
    with pytest.raises(ClientError) as info:
        sm.invoke_endpoint(EndpointName="e", Body=b"[]")
    assert code_and_message(info) == ("ValidationError",
                                      "Endpoint e of account 000000000000 not found.")


def test_a_container_error_is_a_424_model_error_with_the_original_fields():
    error = model_error(503, "busy", "ep", "arn:stream", "us-east-1")
    response = error.response
    assert response["ResponseMetadata"]["HTTPStatusCode"] == 424
    assert response["Error"]["Code"] == "ModelError"
    assert response["Error"]["Message"].startswith(
        'Received server error (503) from primary with message "busy". See https://us-east-1.')
    assert (response["OriginalStatusCode"], response["OriginalMessage"],
            response["LogStreamArn"]) == (503, "busy", "arn:stream")
    assert model_error(404, "x", "ep", "s", "r").response["Error"]["Message"].startswith(
        "Received client error (404)")
