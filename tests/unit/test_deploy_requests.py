"""The deploy's requests: SDK v2's bodies for CreateModel, CreateEndpointConfig, CreateEndpoint."""

from __future__ import annotations

from shoal.deploy import requests


def test_the_three_requests_have_v2s_shape():
    container = requests.container_def("img:1", "s3://b/m/model.tar.gz",
                                       {"SAGEMAKER_PROGRAM": "train.py", "N": 2})
    assert container == {"Image": "img:1", "ModelDataUrl": "s3://b/m/model.tar.gz",
                         "Environment": {"SAGEMAKER_PROGRAM": "train.py", "N": "2"}}
    assert requests.create_model("m", "arn:role", container) == {
        "ModelName": "m", "ExecutionRoleArn": "arn:role", "PrimaryContainer": container}
    assert requests.create_endpoint_config("e", "m", "ml.m5.xlarge", 1) == {
        "EndpointConfigName": "e", "ProductionVariants": [{
            "VariantName": "AllTraffic", "ModelName": "m", "InitialVariantWeight": 1,
            "InitialInstanceCount": 1, "InstanceType": "ml.m5.xlarge"}]}
    assert requests.create_endpoint("e", "e") == {"EndpointName": "e",
                                                  "EndpointConfigName": "e", "Tags": []}


def test_optional_keys_appear_only_when_set():
    container = requests.container_def("img", None)
    assert "ModelDataUrl" not in container
    tags = [{"Key": "team", "Value": "ml"}]
    model = requests.create_model("m", None, container, tags=tags, enable_network_isolation=True,
                                  vpc_config={"Subnets": ["s"], "SecurityGroupIds": ["g"]})
    assert "ExecutionRoleArn" not in model and model["Tags"] == tags
    assert model["EnableNetworkIsolation"] is True and model["VpcConfig"]["Subnets"] == ["s"]
    config = requests.create_endpoint_config("e", "m", "local", 2, tags=tags, kms_key="k")
    assert config["Tags"] == tags and config["KmsKeyId"] == "k"
    assert requests.create_endpoint("e", "c", tags=tags)["Tags"] == tags
