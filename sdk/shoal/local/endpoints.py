"""Local endpoints: models, endpoint configurations and endpoints served on this machine.

``LocalEndpoints`` answers the SageMaker calls a deploy makes (``create_model``,
``create_endpoint_config``, ``create_endpoint``, ``describe_*``, ``list_*``, ``delete_*``) and
sagemaker-runtime's ``invoke_endpoint``, with boto3's method names, arguments, response
shapes and errors (``botocore.exceptions.ClientError`` with the service's codes and texts),
so that the deploy code and ``shoal serve`` use it as they would use boto3's clients.

State lives under the local root beside the jobs: ``.models/<name>.json``,
``.endpoint-configs/<name>.json`` and ``.endpoints/<name>/`` (``endpoint.json``, the model
extracted in ``model/``, the server's ``logs.txt``, its ``ready`` and ``failure`` files). An
endpoint is one detached process tree (``shoal.local.endpoint_runner``: the model fetched
and extracted, then the model server on a loopback port); it outlives the Python process
that created it, until ``delete_endpoint``.
"""

from __future__ import annotations

import io
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import psutil
from botocore.exceptions import ClientError
from botocore.response import StreamingBody

from shoal.launcher.ports import free_port  # below the ephemeral range: no client takes it

from . import layout, process, state, storage

ACCOUNT = "000000000000"
ENDPOINT_LOG_GROUP = "/aws/sagemaker/Endpoints/"
INSTANCE_ID = "local"  # the stream is <variant>/<instance id>, as SageMaker names it
MAX_BODY = 6 * 1024 * 1024  # InvokeEndpoint's request and response limit
INVOKE_TIMEOUT = 60.0  # the runtime's wait for the container
# how long InvokeEndpoint trusts an in-service endpoint's record (unchanged on disk) before it
# checks the model server's process again: the hot path reads no file and asks no process
LIVENESS_SECONDS = 1.0
TIMED_OUT = ("Your invocation timed out while waiting for a response from container primary. "
             "Review the latency metrics for each container in Amazon CloudWatch, resolve the "
             "issue, and try again.")


def endpoint_streams_dir(root: Path, name: str) -> Path:
    """Where an endpoint's model server output lands as ``<variant>.log`` stream files."""
    return Path(root) / ".endpoints" / name / "streams"


def client_error(operation: str, code: str, message: str, status: int = 400,
                 **fields) -> ClientError:
    return ClientError({"Error": {"Code": code, "Message": message},
                        "ResponseMetadata": {"HTTPStatusCode": status}, **fields}, operation)


class LocalEndpoints:
    """The SageMaker and sagemaker-runtime calls of deploying, over a local root."""

    def __init__(self, root: Path | None = None, region: str = "us-east-1"):
        self.root = Path(root) if root else layout.local_root()
        self.region = region
        self._serving: dict[str, tuple] = {}  # name -> ((inode, mtime), checked, record)

    # -- names and records -------------------------------------------------------------
    def arn(self, kind: str, name: str) -> str:
        return f"arn:aws:sagemaker:{self.region}:{ACCOUNT}:{kind}/{name.lower()}"

    def _file(self, kind: str, name: str) -> Path:
        if kind == "endpoint":
            return self.root / ".endpoints" / name / "endpoint.json"
        return self.root / f".{kind}s" / f"{name}.json"

    @staticmethod
    def _noun(kind: str) -> str:
        """How the service's messages name a kind of resource."""
        return "endpoint configuration" if kind == "endpoint-config" else kind

    def _read(self, kind: str, name: str, operation: str) -> dict:
        path = self._file(kind, name)
        if not path.is_file():
            raise client_error(operation, "ValidationException",
                               f'Could not find {self._noun(kind)} "{self.arn(kind, name)}".')
        return state.read(path)

    def _create(self, kind: str, name: str, record: dict, operation: str) -> None:
        path = self._file(kind, name)
        if path.exists():
            raise client_error(operation, "ValidationException", f"Cannot create already "
                               f'existing {self._noun(kind)} "{self.arn(kind, name)}".')
        path.parent.mkdir(parents=True, exist_ok=True)
        state.write(path, record)

    # -- models ------------------------------------------------------------------------
    def create_model(self, ModelName, PrimaryContainer=None, ExecutionRoleArn=None,
                     Containers=None, Tags=None, **optional) -> dict:
        container = PrimaryContainer or (Containers or [None])[0]
        if not container:
            raise client_error("CreateModel", "ValidationException",
                               "a model needs PrimaryContainer (or Containers)")
        url = container.get("ModelDataUrl")
        if url and url.startswith("file://") and not storage.file_path(url).exists():
            raise client_error("CreateModel", "ValidationException",
                               f"Could not find model data at {url}.")
        record = {"ModelName": ModelName, "ModelArn": self.arn("model", ModelName),
                  "PrimaryContainer": container, "CreationTime": state.now(),
                  "ExecutionRoleArn": ExecutionRoleArn, "Tags": Tags or [], **optional}
        self._create("model", ModelName, {k: v for k, v in record.items() if v is not None},
                     "CreateModel")
        return {"ModelArn": record["ModelArn"]}

    def describe_model(self, ModelName) -> dict:
        record = self._read("model", ModelName, "DescribeModel")
        record.pop("Tags", None)
        return record

    def delete_model(self, ModelName) -> dict:
        self._read("model", ModelName, "DeleteModel")
        self._file("model", ModelName).unlink()
        return {}

    def list_models(self, NameContains=None, **_) -> dict:
        models = [state.read(p) for p in sorted((self.root / ".models").glob("*.json"))]
        return {"Models": [{k: m[k] for k in ("ModelName", "ModelArn", "CreationTime")}
                           for m in models if not NameContains or NameContains in m["ModelName"]]}

    # -- endpoint configurations -------------------------------------------------------
    def create_endpoint_config(self, EndpointConfigName, ProductionVariants, Tags=None,
                               **optional) -> dict:
        record = {"EndpointConfigName": EndpointConfigName,
                  "EndpointConfigArn": self.arn("endpoint-config", EndpointConfigName),
                  "ProductionVariants": [
                      {**v, "InitialVariantWeight": float(v.get("InitialVariantWeight", 1.0))}
                      for v in ProductionVariants],
                  "CreationTime": state.now(), **optional}
        self._create("endpoint-config", EndpointConfigName, record, "CreateEndpointConfig")
        return {"EndpointConfigArn": record["EndpointConfigArn"]}

    def describe_endpoint_config(self, EndpointConfigName) -> dict:
        return self._read("endpoint-config", EndpointConfigName, "DescribeEndpointConfig")

    def delete_endpoint_config(self, EndpointConfigName) -> dict:
        self._read("endpoint-config", EndpointConfigName, "DeleteEndpointConfig")
        self._file("endpoint-config", EndpointConfigName).unlink()
        return {}

    # -- endpoints ---------------------------------------------------------------------
    def create_endpoint(self, EndpointName, EndpointConfigName, Tags=None, **_) -> dict:
        config = self._read("endpoint-config", EndpointConfigName, "CreateEndpoint")
        variant = config["ProductionVariants"][0]
        model = self._read("model", variant["ModelName"], "CreateEndpoint")
        now = state.now()
        record = {"EndpointName": EndpointName, "EndpointArn": self.arn("endpoint", EndpointName),
                  "EndpointConfigName": EndpointConfigName, "EndpointStatus": "Creating",
                  "CreationTime": now, "LastModifiedTime": now,
                  "ShoalPort": free_port(), "ShoalVariant": variant["VariantName"],
                  "ShoalImage": model["PrimaryContainer"].get("Image", "")}
        self._create("endpoint", EndpointName, record, "CreateEndpoint")
        folder = self._file("endpoint", EndpointName).parent
        (folder / "container.json").write_text(json.dumps(model["PrimaryContainer"]))
        with open(folder / "logs.txt", "ab", buffering=0) as log:
            child = subprocess.Popen(
                [sys.executable, "-u", "-m", "shoal.local.endpoint_runner", str(folder),
                 str(record["ShoalPort"])],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True)
        proc = psutil.Process(child.pid)
        record.update(ShoalPid=proc.pid, ShoalCreateTime=proc.create_time())
        state.write(self._file("endpoint", EndpointName), record)
        return {"EndpointArn": record["EndpointArn"]}

    def _status(self, name: str, operation: str) -> dict:
        """The endpoint's record with its status brought up to date from its files."""
        path = self._file("endpoint", name)
        record = self._read("endpoint", name, operation)
        if record["EndpointStatus"] not in ("Creating", "InService") or "ShoalPid" not in record:
            return record  # ended, or its process is being started
        folder = path.parent
        alive = process.find(record["ShoalPid"], record["ShoalCreateTime"]) is not None
        if record["EndpointStatus"] == "InService":
            if alive:
                return record
            record.update(EndpointStatus="Failed", FailureReason=(
                "the model server exited while in service (the machine restarted, or its "
                f"process was killed); see {folder / 'logs.txt'}"))
        elif (folder / "ready").exists():
            record["EndpointStatus"] = "InService"
        elif (folder / "failure").exists() or not alive:
            reason = ((folder / "failure").read_text().strip() if (folder / "failure").exists()
                      else "the model server exited before it was ready")
            record.update(EndpointStatus="Failed", FailureReason=(
                f"The primary container for production variant {record['ShoalVariant']} did "
                f"not pass the ping health check: {reason}. See the endpoint's log: "
                f"{folder / 'logs.txt'}")[:1024])
        else:
            return record
        record["LastModifiedTime"] = state.now()
        state.write(path, record)
        return record

    def describe_endpoint(self, EndpointName) -> dict:
        r = self._status(EndpointName, "DescribeEndpoint")
        variant = {"VariantName": r["ShoalVariant"], "CurrentWeight": 1.0, "DesiredWeight": 1.0,
                   "CurrentInstanceCount": 1, "DesiredInstanceCount": 1,
                   "DeployedImages": [{"SpecifiedImage": r["ShoalImage"],
                                       "ResolvedImage": r["ShoalImage"],
                                       "ResolutionTime": r["CreationTime"]}]}
        out = {k: v for k, v in r.items() if not k.startswith("Shoal")}
        out["ProductionVariants"] = [variant]
        return out

    def list_endpoints(self, NameContains=None, StatusEquals=None, **_) -> dict:
        found = []
        for path in sorted((self.root / ".endpoints").glob("*/endpoint.json")):
            r = self._status(path.parent.name, "ListEndpoints")
            if (NameContains and NameContains not in r["EndpointName"]) or (
                    StatusEquals and r["EndpointStatus"] != StatusEquals):
                continue
            found.append({k: r[k] for k in ("EndpointName", "EndpointArn", "CreationTime",
                                            "LastModifiedTime", "EndpointStatus")})
        return {"Endpoints": found}

    def delete_endpoint(self, EndpointName) -> dict:
        record = self._read("endpoint", EndpointName, "DeleteEndpoint")
        proc = process.find(record["ShoalPid"], record["ShoalCreateTime"]) \
            if "ShoalPid" in record else None
        if proc is not None:
            process.terminate_tree(proc)
        shutil.rmtree(self._file("endpoint", EndpointName).parent, ignore_errors=True)
        return {}

    # -- sagemaker-runtime -------------------------------------------------------------
    def _in_service(self, name: str) -> dict:
        """The record of an endpoint that serves, or the runtime's error. A record unchanged
        on disk (its mtime) and checked within LIVENESS_SECONDS is taken as it was: a deleted
        or updated endpoint changes its file, a dead server is seen within the second."""
        path = self._file("endpoint", name)
        try:
            stat = path.stat()
            mtime = (stat.st_ino, stat.st_mtime_ns)  # each write renames a new file in
        except FileNotFoundError:
            mtime = None
        cached = self._serving.get(name)
        now = time.monotonic()
        if cached and mtime == cached[0] and now - cached[1] < LIVENESS_SECONDS:
            return cached[2]
        record = self._status(name, "InvokeEndpoint") if mtime is not None else None
        if record is None or record["EndpointStatus"] != "InService":
            self._serving.pop(name, None)
            raise client_error("InvokeEndpoint", "ValidationError",
                               f"Endpoint {name} of account {ACCOUNT} not found.")
        self._serving[name] = (mtime, now, record)
        return record

    def invoke_endpoint(self, EndpointName, Body, ContentType=None, Accept=None,
                        CustomAttributes=None, **_) -> dict:
        import urllib3

        record = self._in_service(EndpointName)
        body = Body.read() if hasattr(Body, "read") else Body
        body = body.encode("utf-8") if isinstance(body, str) else bytes(body)
        if len(body) > MAX_BODY:
            raise client_error("InvokeEndpoint", "ValidationError",
                               f"Request body of {len(body)} bytes is over the limit of "
                               f"{MAX_BODY} bytes.")
        headers = {k: v for k, v in (("Content-Type", ContentType), ("Accept", Accept),
                                     ("X-Amzn-SageMaker-Custom-Attributes", CustomAttributes))
                   if v}
        log_stream = (f"arn:aws:logs:{self.region}:{ACCOUNT}:log-group:/aws/sagemaker/Endpoints/"
                      f"{EndpointName}:log-stream:{record['ShoalVariant']}/{INSTANCE_ID}")
        try:
            reply = _http().request(
                "POST", f"http://127.0.0.1:{record['ShoalPort']}/invocations", body=body,
                headers=headers, timeout=urllib3.Timeout(connect=5, read=INVOKE_TIMEOUT),
                retries=False)
        except urllib3.exceptions.ReadTimeoutError:
            raise model_error(0, TIMED_OUT, EndpointName, log_stream, self.region) from None
        except urllib3.exceptions.HTTPError as error:
            raise model_error(0, f"the model server did not answer: {error}", EndpointName,
                              log_stream, self.region) from None
        if not 200 <= reply.status < 300:
            raise model_error(reply.status, reply.data.decode("utf-8", "replace"), EndpointName,
                              log_stream, self.region)
        out = {"Body": StreamingBody(io.BytesIO(reply.data), len(reply.data)),
               "ContentType": reply.headers.get("Content-Type", "application/octet-stream"),
               "InvokedProductionVariant": record["ShoalVariant"]}
        if reply.headers.get("X-Amzn-SageMaker-Custom-Attributes"):
            out["CustomAttributes"] = reply.headers["X-Amzn-SageMaker-Custom-Attributes"]
        return out


def model_error(status: int, message: str, endpoint: str, log_stream: str,
                region: str) -> ClientError:
    """A container's error as the runtime reports it (424 ``ModelError``)."""
    kind = "client" if 400 <= status < 500 else "server"
    text = (f'Received {kind} error ({status}) from primary with message "{message}". See '
            f"https://{region}.console.aws.amazon.com/cloudwatch/home?region={region}"
            f"#logEventViewer:group=/aws/sagemaker/Endpoints/{endpoint} in account {ACCOUNT} "
            f"for more information.")
    return client_error("InvokeEndpoint", "ModelError", text, status=424,
                        OriginalStatusCode=status, OriginalMessage=message,
                        LogStreamArn=log_stream)


_pool = None


def _http():
    global _pool
    if _pool is None:
        import urllib3

        _pool = urllib3.PoolManager(maxsize=32)
    return _pool
