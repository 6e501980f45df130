"""The endpoint calls of ``shoal serve``: SageMaker's model, endpoint configuration and endpoint
operations, and sagemaker-runtime's InvokeEndpoint, over ``shoal.local.endpoints``.

The SageMaker operations answer in JSON 1.1 like the training calls (``ClientError`` codes
of ``LocalEndpoints`` become the same ``__type``). InvokeEndpoint is rest-json on its own
path, ``POST /endpoints/<name>/invocations``: the container's bytes and content type pass
verbatim; errors carry ``x-amzn-ErrorType`` and a JSON body with the error's fields
(``ModelError``'s ``OriginalStatusCode``, ``OriginalMessage``, ``LogStreamArn``).
"""

from __future__ import annotations

import json
from pathlib import Path

from botocore.exceptions import ClientError

from shoal.local.endpoints import LocalEndpoints

from .api_errors import ApiError

OPERATIONS = ("CreateModel", "DescribeModel", "DeleteModel", "ListModels",
              "CreateEndpointConfig", "DescribeEndpointConfig", "DeleteEndpointConfig",
              "CreateEndpoint", "DescribeEndpoint", "DeleteEndpoint", "ListEndpoints")


class ClientApiError(ApiError):
    """A ``ClientError`` of ``LocalEndpoints`` as the API's answer."""

    def __init__(self, error: ClientError):
        info = error.response["Error"]
        super().__init__(info["Message"])
        self.code = info["Code"]
        self.status = error.response["ResponseMetadata"]["HTTPStatusCode"]


def _snake(name: str) -> str:
    return "".join(f"_{c.lower()}" if c.isupper() else c for c in name).lstrip("_")


class EndpointsApi:
    def __init__(self, root: Path | None = None, region: str = "us-east-1"):
        self.local = LocalEndpoints(root, region)

    def __getattr__(self, operation: str):
        if operation not in OPERATIONS:
            raise AttributeError(operation)
        method = getattr(self.local, _snake(operation))

        def call(params: dict) -> dict:
            try:
                return method(**params)
            except ClientError as error:
                raise ClientApiError(error) from None
        return call

    def invoke(self, name: str, body: bytes, headers: dict[str, str]) -> tuple[int, bytes, dict]:
        """One InvokeEndpoint -> (status, body, headers)."""
        lower = {k.lower(): v for k, v in headers.items()}
        try:
            out = self.local.invoke_endpoint(
                EndpointName=name, Body=body, ContentType=lower.get("content-type"),
                Accept=lower.get("accept"),
                CustomAttributes=lower.get("x-amzn-sagemaker-custom-attributes"))
        except ClientError as error:
            response = error.response
            fields = {k: v for k, v in response.items()
                      if k not in ("Error", "ResponseMetadata")}
            payload = {"message": response["Error"]["Message"], **fields}
            return (response["ResponseMetadata"]["HTTPStatusCode"],
                    json.dumps(payload).encode(),
                    {"x-amzn-ErrorType": response["Error"]["Code"],
                     "content-type": "application/json"})
        reply = {"content-type": out["ContentType"],
                 "x-Amzn-Invoked-Production-Variant": out["InvokedProductionVariant"]}
        if out.get("CustomAttributes"):
            reply["X-Amzn-SageMaker-Custom-Attributes"] = out["CustomAttributes"]
        return 200, out["Body"].read(), reply
