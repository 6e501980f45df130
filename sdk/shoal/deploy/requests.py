"""The deploy's three requests, built as SDK v2 builds them (pure: no I/O).

A model, its endpoint configuration (one variant ``AllTraffic``, weight 1) and its endpoint;
optional keys appear only when set, except CreateEndpoint's ``Tags``, always sent.
"""

from __future__ import annotations

VARIANT = "AllTraffic"


def container_def(image: str, model_data_url: str | None, env: dict | None = None) -> dict:
    container = {"Image": image, "Environment": {str(k): str(v) for k, v in (env or {}).items()}}
    if model_data_url:
        container["ModelDataUrl"] = model_data_url
    return container


def create_model(name: str, role: str | None, container: dict, *, tags=None, vpc_config=None,
                 enable_network_isolation: bool = False) -> dict:
    request = {"ModelName": name, "ExecutionRoleArn": role, "PrimaryContainer": container}
    if role is None:
        del request["ExecutionRoleArn"]
    if tags:
        request["Tags"] = list(tags)
    if vpc_config:
        request["VpcConfig"] = vpc_config
    if enable_network_isolation:
        request["EnableNetworkIsolation"] = True
    return request


def create_endpoint_config(name: str, model_name: str, instance_type: str,
                           instance_count: int, *, tags=None, kms_key=None) -> dict:
    request = {"EndpointConfigName": name, "ProductionVariants": [{
        "VariantName": VARIANT, "ModelName": model_name, "InitialVariantWeight": 1,
        "InitialInstanceCount": instance_count, "InstanceType": instance_type}]}
    if tags:
        request["Tags"] = list(tags)
    if kms_key:
        request["KmsKeyId"] = kms_key
    return request


def create_endpoint(name: str, config_name: str, *, tags=None) -> dict:
    return {"EndpointName": name, "EndpointConfigName": config_name, "Tags": list(tags or [])}
