"""Predictors: one endpoint's ``predict``, ``delete_endpoint`` and ``delete_model``.

``predict(data)`` is one InvokeEndpoint: ``ContentType`` from the serializer, ``Accept``
the deserializer's types joined by ``", "``, the response read by the deserializer with
its ``ContentType``. The clients are the session's (boto3's ``sagemaker`` and
``sagemaker-runtime``) or, for a local endpoint, ``shoal.local.endpoints.LocalEndpoints``
for both: the same calls either way.
"""

from __future__ import annotations

from .serializers import (
    BytesDeserializer,
    IdentitySerializer,
    JSONDeserializer,
    JSONSerializer,
    NumpyDeserializer,
    NumpySerializer,
)


class Predictor:
    """Requests to one endpoint (SDK v2's ``sagemaker.predictor.Predictor``)."""

    def __init__(self, endpoint_name: str, sagemaker_session=None, serializer=None,
                 deserializer=None, clients=None):
        from .clients import endpoint_clients

        self.endpoint_name = endpoint_name
        self.sagemaker_session = sagemaker_session
        self.serializer = serializer or self.default_serializer()
        self.deserializer = deserializer or self.default_deserializer()
        self.sagemaker_client, self.runtime_client = clients or endpoint_clients(
            None, sagemaker_session)
        self._config_name: str | None = None
        self._model_names: list[str] | None = None

    def default_serializer(self):
        return IdentitySerializer()

    def default_deserializer(self):
        return BytesDeserializer()

    @property
    def content_type(self) -> str:
        return self.serializer.CONTENT_TYPE

    @property
    def accept(self) -> tuple[str, ...]:
        return self.deserializer.ACCEPT

    def predict(self, data, initial_args: dict | None = None, target_model=None,
                target_variant=None, inference_id=None, custom_attributes=None):
        args = dict(initial_args or {})
        args.setdefault("EndpointName", self.endpoint_name)
        args.setdefault("ContentType", self.content_type)
        args.setdefault("Accept", ", ".join(self.accept))
        for key, value in (("TargetModel", target_model), ("TargetVariant", target_variant),
                           ("InferenceId", inference_id), ("CustomAttributes", custom_attributes)):
            if value is not None:
                args[key] = value
        args["Body"] = self.serializer.serialize(data)
        response = self.runtime_client.invoke_endpoint(**args)
        return self.deserializer.deserialize(
            response["Body"], response.get("ContentType", "application/octet-stream"))

    def _endpoint_config_name(self) -> str:
        if self._config_name is None:
            described = self.sagemaker_client.describe_endpoint(EndpointName=self.endpoint_name)
            self._config_name = described["EndpointConfigName"]
        return self._config_name

    def _models(self) -> list[str]:
        if self._model_names is None:
            config = self.sagemaker_client.describe_endpoint_config(
                EndpointConfigName=self._endpoint_config_name())
            self._model_names = [v["ModelName"] for v in config["ProductionVariants"]]
        return self._model_names

    def delete_endpoint(self, delete_endpoint_config: bool = True) -> None:
        """The endpoint (its server stopped) and, by default, its configuration. The
        configuration's models are remembered first, so ``delete_model()`` may follow."""
        if delete_endpoint_config:
            self._models()
            self.sagemaker_client.delete_endpoint_config(
                EndpointConfigName=self._endpoint_config_name())
        self.sagemaker_client.delete_endpoint(EndpointName=self.endpoint_name)

    def delete_model(self) -> None:
        """The models behind the endpoint's configuration."""
        for name in self._models():
            self.sagemaker_client.delete_model(ModelName=name)


class PyTorchPredictor(Predictor):
    """numpy in, numpy out (``application/x-npy`` both ways)."""

    def default_serializer(self):
        return NumpySerializer()

    def default_deserializer(self):
        return NumpyDeserializer()


class TensorFlowPredictor(Predictor):
    """JSON in, JSON out; the serving container wraps a bare list as ``{"instances": ...}``."""

    def default_serializer(self):
        return JSONSerializer()

    def default_deserializer(self):
        return JSONDeserializer()
