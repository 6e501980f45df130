"""Models: a trained artifact with the image and code that serve it, and its ``deploy()``.

``Model.deploy`` makes the three requests of ``requests`` and sends them to the clients of
``clients.endpoint_clients``: boto3's for SageMaker, ``LocalEndpoints`` for
``instance_type="local"``. A framework model (``PyTorchModel``) repacks its artifact with
its code first (``repack``): to ``s3://<default bucket>/<model name>/model.tar.gz`` for
SageMaker (KMS server-side encryption, as SDK v2), or beside the trained artifact locally.
Its environment is SDK v2's: ``SAGEMAKER_PROGRAM``, ``SAGEMAKER_SUBMIT_DIRECTORY``
(``/opt/ml/model/code``), ``SAGEMAKER_CONTAINER_LOG_LEVEL``, ``SAGEMAKER_REGION`` and
``SAGEMAKER_MODEL_SERVER_WORKERS`` when ``model_server_workers`` is set.
"""

from __future__ import annotations

import logging
import os
import tempfile
import time
from pathlib import Path

from shoal import image_uris, naming
from shoal.errors import EndpointError, ValidationError

from . import requests
from .clients import endpoint_clients, is_local
from .predictor import Predictor, PyTorchPredictor

log = logging.getLogger("shoal.deploy")
CODE_DIR = "/opt/ml/model/code"
POLL_SECONDS = {True: 0.2, False: 15.0}  # local endpoint, SageMaker endpoint


class Model:
    """A model for any image (SDK v2's ``sagemaker.model.Model``)."""

    def __init__(self, image_uri=None, model_data=None, role=None, predictor_cls=None,
                 env=None, name=None, sagemaker_session=None, entry_point=None,
                 source_dir=None, dependencies=None, container_log_level=logging.INFO,
                 vpc_config=None, enable_network_isolation=False):
        self.image_uri, self.model_data, self.role = image_uri, model_data, role
        self.predictor_cls = predictor_cls or Predictor
        self.env = dict(env or {})
        self.name = name
        self.sagemaker_session = sagemaker_session
        self.entry_point, self.source_dir = entry_point, source_dir
        self.dependencies = list(dependencies or [])
        self.container_log_level = container_log_level
        self.vpc_config, self.enable_network_isolation = vpc_config, enable_network_isolation
        self.endpoint_name: str | None = None
        self._clients = None

    # -- what a framework model specialises ------------------------------------------
    def serving_image_uri(self, instance_type: str) -> str:
        if not self.image_uri:
            raise ValidationError("'image_uri' is required for a Model without a framework")
        return self.image_uri

    def _base_name(self, image: str) -> str:
        return naming.base_name_from_image(image)

    def prepare_container_def(self, instance_type: str, model_name: str) -> dict:
        """The container of the CreateModel request (a framework model repacks first)."""
        return requests.container_def(self.serving_image_uri(instance_type), self.model_data,
                                      self.env)

    # -- deploy ----------------------------------------------------------------------
    def _session(self, instance_type):
        if self.sagemaker_session is None:
            from shoal.session import Session

            self.sagemaker_session = Session(local_mode=is_local(instance_type, None))
        return self.sagemaker_session

    def deploy(self, initial_instance_count=None, instance_type=None, serializer=None,
               deserializer=None, endpoint_name=None, tags=None, kms_key=None, wait=True,
               model_name=None, **ignored):
        """Create the model, its endpoint configuration and its endpoint; return a predictor
        once it is InService (``wait=False``: at once)."""
        if not instance_type or not initial_instance_count:
            raise ValidationError("deploy() needs instance_type and initial_instance_count "
                                  f"(got {instance_type!r}, {initial_instance_count!r})")
        if ignored:
            log.warning("deploy(): not used by Shoal: %s", ", ".join(sorted(ignored)))
        session = self._session(instance_type)
        sm, runtime = self._clients = endpoint_clients(instance_type, session)
        image = self.serving_image_uri(instance_type)
        self.name = model_name or self.name or naming.name_from_base(self._base_name(image))
        container = self.prepare_container_def(instance_type, self.name)
        sm.create_model(**requests.create_model(
            self.name, self._role(session, instance_type), container, tags=tags,
            vpc_config=self.vpc_config, enable_network_isolation=self.enable_network_isolation))
        name = endpoint_name or naming.name_from_base(self.name)
        sm.create_endpoint_config(**requests.create_endpoint_config(
            name, self.name, instance_type, initial_instance_count, tags=tags, kms_key=kms_key))
        sm.create_endpoint(**requests.create_endpoint(name, name, tags=tags))
        self.endpoint_name = name
        if wait:
            wait_for_endpoint(sm, name, POLL_SECONDS[is_local(instance_type, session)])
        return self.predictor_cls(name, session, serializer=serializer,
                                  deserializer=deserializer, clients=(sm, runtime))

    def _role(self, session, instance_type) -> str | None:
        if self.role is None or is_local(instance_type, session):
            return self.role
        return session.expand_role(self.role)

    def delete_model(self) -> None:
        if self.name is None or self._clients is None:
            raise ValidationError("no model was created: call deploy() first")
        self._clients[0].delete_model(ModelName=self.name)


def wait_for_endpoint(client, name: str, poll: float, timeout: float = 3600.0) -> dict:
    """Poll DescribeEndpoint while Creating/Updating; ``EndpointError`` unless InService."""
    deadline = time.monotonic() + timeout
    while True:
        described = client.describe_endpoint(EndpointName=name)
        status = described["EndpointStatus"]
        if status not in ("Creating", "Updating"):
            break
        if time.monotonic() > deadline:
            raise EndpointError(name, status, f"still {status} after {timeout:.0f} s")
        time.sleep(poll)
    if status != "InService":
        raise EndpointError(name, status, described.get("FailureReason"))
    return described


class FrameworkModel(Model):
    """A framework image serving the user's inference code (repacked with the model)."""

    _framework_name: str = ""

    def __init__(self, model_data, image_uri=None, role=None, entry_point=None,
                 source_dir=None, predictor_cls=None, env=None, framework_version=None,
                 py_version=None, model_server_workers=None, **kwargs):
        super().__init__(image_uri=image_uri, model_data=model_data, role=role,
                         predictor_cls=predictor_cls, env=env, entry_point=entry_point,
                         source_dir=source_dir, **kwargs)
        self.framework_version, self.py_version = framework_version, py_version
        self.model_server_workers = model_server_workers

    def serving_image_uri(self, instance_type: str) -> str:
        if self.image_uri:
            return self.image_uri
        session = self._session(instance_type)
        training = image_uris.training_image_uri(
            self._framework_name, self.framework_version, self.py_version, instance_type,
            account=session.account_id, region=session.region)
        return image_uris.inference_image_uri(training)

    def _script_env(self, instance_type: str) -> dict:
        session = self._session(instance_type)
        env = {"SAGEMAKER_PROGRAM": os.path.basename(self.entry_point or ""),
               "SAGEMAKER_SUBMIT_DIRECTORY": CODE_DIR,
               "SAGEMAKER_CONTAINER_LOG_LEVEL": str(self.container_log_level),
               "SAGEMAKER_REGION": session.region}
        if not self.entry_point:
            del env["SAGEMAKER_PROGRAM"]
        if self.model_server_workers:
            env["SAGEMAKER_MODEL_SERVER_WORKERS"] = str(int(self.model_server_workers))
        return {**env, **self.env}

    def prepare_container_def(self, instance_type: str, model_name: str) -> dict:
        url = self.model_data
        if self.entry_point or self.source_dir or self.dependencies:
            url = self._repack(instance_type, model_name)
        return requests.container_def(self.serving_image_uri(instance_type), url,
                                      self._script_env(instance_type))

    def _repack(self, instance_type: str, model_name: str) -> str:
        from shoal.local import storage

        from .repack import repack

        session = self._session(instance_type)
        with tempfile.TemporaryDirectory(prefix="shoal-model-") as tmp:
            archive = self._local_copy(self.model_data, Path(tmp) / "in", session)
            source = self._local_copy(self.source_dir, Path(tmp) / "src", session) \
                if self.source_dir and storage.is_s3(self.source_dir) else self.source_dir
            entry = self.entry_point
            if source and entry and not os.path.isabs(entry):
                entry = os.path.join(str(source), entry)
            if is_local(instance_type, session):
                out = Path(storage.file_path(self.model_data)).parent.parent / model_name
                return (repack(archive, out / "model.tar.gz", entry_point=entry,
                               source_dir=source, dependencies=self.dependencies)).as_uri()
            packed = repack(archive, Path(tmp) / "model.tar.gz", entry_point=entry,
                            source_dir=source, dependencies=self.dependencies)
            return self._upload(session, packed, model_name)

    @staticmethod
    def _upload(session, packed: Path, model_name: str) -> str:
        """To the default bucket (created if missing, every call with the owner check), KMS
        server-side encryption as v2 asks for it."""
        from shoal import transfer

        bucket, owner = session.default_bucket(), session.account_id()
        key = f"{model_name}/model.tar.gz"
        transfer.ensure_bucket(session.s3_client, bucket, region=session.region,
                               expected_owner=owner)
        transfer.upload_file(session.s3_client, packed, bucket, key, extra_args={
            "ServerSideEncryption": "aws:kms", "ExpectedBucketOwner": owner})
        return f"s3://{bucket}/{key}"

    @staticmethod
    def _local_copy(uri: str | None, dest: Path, session) -> Path | None:
        from shoal.local import storage

        if not uri:
            return None
        if not storage.is_s3(uri):
            return Path(storage.file_path(uri))
        bucket, key = naming.parse_s3_uri(uri)
        dest.mkdir(parents=True, exist_ok=True)
        target = dest / key.rsplit("/", 1)[-1]
        session.s3_client.download_file(bucket, key, str(target))
        return target


class PyTorchModel(FrameworkModel):
    """A PyTorch model served by Shoal's PyTorch inference image (the toolkit's handlers)."""

    _framework_name = "pytorch"

    def __init__(self, model_data, role=None, entry_point=None, framework_version=None,
                 py_version=None, predictor_cls=PyTorchPredictor, **kwargs):
        super().__init__(model_data, role=role, entry_point=entry_point,
                         framework_version=framework_version, py_version=py_version,
                         predictor_cls=predictor_cls, **kwargs)


class TensorFlowModel(FrameworkModel):
    """A TensorFlow SavedModel served as TensorFlow Serving's container serves it: the
    trained archive as is (no repack) unless an ``entry_point`` (``inference.py`` with
    ``input_handler``/``output_handler``) joins it."""

    _framework_name = "tensorflow"

    def __init__(self, model_data, role=None, entry_point=None, framework_version=None,
                 predictor_cls=None, **kwargs):
        from .predictor import TensorFlowPredictor

        kwargs.pop("py_version", None)  # v2's TensorFlow serving images have no Python tag
        super().__init__(model_data, role=role, entry_point=entry_point,
                         framework_version=framework_version,
                         predictor_cls=predictor_cls or TensorFlowPredictor, **kwargs)

    def serving_image_uri(self, instance_type: str) -> str:
        if self.image_uri:
            return self.image_uri
        session = self._session(instance_type)
        from shoal.containers import matrix

        spec = matrix.find("tensorflow", self.framework_version)
        py = spec.py_version if spec else None
        training = image_uris.training_image_uri(
            "tensorflow", self.framework_version, py, instance_type,
            account=session.account_id, region=session.region)
        return image_uris.inference_image_uri(training)

    def _script_env(self, instance_type: str) -> dict:
        if self.entry_point:
            return super()._script_env(instance_type)
        return {"SAGEMAKER_TFS_NGINX_LOGLEVEL": "info", **self.env}
