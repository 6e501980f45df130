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


class _Reply:
    status, data, headers = 200, b"[1]", {"Content-Type": "application/json"}


class _Pool:
    def __init__(self):
        self.posts = []

    def request(self, method, url, **_):
        self.posts.append(url)
        return _Reply()


def test_the_invoke_path_rechecks_the_server_each_second_and_sees_deletes_at_once(
        sm, monkeypatch):
    import psutil
    from shoal.local import endpoints, state

    me = psutil.Process()
    path = sm._file("endpoint", "ep")
    path.parent.mkdir(parents=True)
    record = {"EndpointName": "ep", "EndpointStatus": "InService", "ShoalPid": me.pid,
              "ShoalCreateTime": me.create_time(), "ShoalPort": 1, "ShoalVariant": "AllTraffic"}
    state.write(path, record)
    pool, looked_up, clock = _Pool(), [], [100.0]
    real_find = endpoints.process.find
    monkeypatch.setattr(endpoints, "_http", lambda: pool)
    monkeypatch.setattr(endpoints.process, "find",
                        lambda *a: looked_up.append(a) or real_find(*a))
    monkeypatch.setattr(endpoints.time, "monotonic", lambda: clock[0])
    for _ in range(50):
        assert sm.invoke_endpoint(EndpointName="ep", Body=b"[1]")["Body"].read() == b"[1]"
    assert len(pool.posts) == 50 and len(looked_up) == 1  # one liveness check, not fifty
    clock[0] += endpoints.LIVENESS_SECONDS
    sm.invoke_endpoint(EndpointName="ep", Body=b"[1]")
    assert len(looked_up) == 2  # a second on: the process is asked again
    state.write(path, {**record, "EndpointStatus": "Updating"})  # a changed record: read at once
    with pytest.raises(ClientError, match="not found"):
        sm.invoke_endpoint(EndpointName="ep", Body=b"[1]")
    state.write(path, record)
    sm.invoke_endpoint(EndpointName="ep", Body=b"[1]")
    path.unlink()  # DeleteEndpoint from another process: no request reaches the old port
    with pytest.raises(ClientError, match="Endpoint ep of account 000000000000 not found"):
        sm.invoke_endpoint(EndpointName="ep", Body=b"[1]")
    assert len(pool.posts) == 52


def test_a_container_that_does_not_answer_in_time_is_the_runtimes_time_out(sm, monkeypatch):
    import psutil
    import urllib3
    from shoal.local import endpoints, state

    me = psutil.Process()
    path = sm._file("endpoint", "slow")
    path.parent.mkdir(parents=True)
    state.write(path, {"EndpointName": "slow", "EndpointStatus": "InService", "ShoalPid": me.pid,
                       "ShoalCreateTime": me.create_time(), "ShoalPort": 1,
                       "ShoalVariant": "AllTraffic"})
    seen = {}

    class Stuck:
        def request(self, method, url, timeout=None, **_):
            seen["read"] = timeout.read_timeout
            raise urllib3.exceptions.ReadTimeoutError(None, url, "read timed out")

    monkeypatch.setattr(endpoints, "_http", lambda: Stuck())
    with pytest.raises(ClientError) as failed:
        sm.invoke_endpoint(EndpointName="slow", Body=b"[1]")
    assert seen["read"] == endpoints.INVOKE_TIMEOUT == 60.0  # the runtime's wait
    response = failed.value.response
    assert response["Error"]["Code"] == "ModelError"
    assert response["OriginalMessage"].startswith(
        "Your invocation timed out while waiting for a response from container primary")
