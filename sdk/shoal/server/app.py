"""The endpoint: one Starlette route (``POST /``) that checks the signature when the endpoint
requires one, parses the call (``protocol``), runs it (``TrainingJobs`` for the training
calls of ``SageMaker.*``, ``EndpointsApi`` for its model and endpoint calls, ``LogsApi`` for
``Logs_20140328.*``, ``CloudWatchApi`` for ``GraniteServiceVersion20100801.*``) and answers
in the protocol's shape; and sagemaker-runtime's ``POST /endpoints/<name>/invocations`` on
the same port, under the same signature rule (an endpoint runs user code); served by uvicorn.

Reads (describe, list, logs: a few small local files, a fraction of a millisecond) run on
the event loop itself: handing each to a thread costs more than the call, and under load
dozens of pool threads queue for the interpreter lock with the loop behind them (the load
benchmark's p99 inside the endpoint went from seconds to milliseconds). Calls that start
or signal a job's processes run in Starlette's thread pool. There is no rate limit: a local
burst is never throttled.
"""

from __future__ import annotations

import ipaddress
import logging
import socket
import time
import uuid
from pathlib import Path

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from shoal.deploy.modelserver.main import bind as listening_socket
from shoal.local import layout

from . import protocol
from .api_errors import ApiError, UnknownOperationException
from .cloudwatch import CloudWatchApi
from .endpoints_api import OPERATIONS as ENDPOINT_OPERATIONS
from .endpoints_api import EndpointsApi
from .logs_api import LogsApi
from .signing import Verifier
from .training_jobs import TrainingJobs

log = logging.getLogger("shoal.server")
CONTENT_TYPE = "application/x-amz-json-1.1"
CONTENT_TYPE_1_0 = "application/x-amz-json-1.0"
SERVED = {
    "sagemaker": ("CreateTrainingJob", "DescribeTrainingJob", "StopTrainingJob",
                  "ListTrainingJobs", "AddTags", "ListTags", "DeleteTags",
                  *ENDPOINT_OPERATIONS),
    "logs": ("DescribeLogStreams", "GetLogEvents", "FilterLogEvents"),
    "cloudwatch": ("GetMetricStatistics", "ListMetrics", "GetMetricData"),
}


class Endpoint:
    """The APIs over one local root, with an optional signature check."""

    def __init__(self, root: Path | None = None, region: str = "us-east-1",
                 verifier: Verifier | None = None):
        root = Path(root) if root else layout.local_root()
        self.handlers = {"sagemaker": TrainingJobs(root, region), "logs": LogsApi(root, region),
                         "cloudwatch": CloudWatchApi(root, region)}
        self.endpoints = EndpointsApi(root, region)
        self.verifier = verifier

    def invoke(self, method: str, url: str, headers: dict[str, str], body: bytes,
               name: str) -> tuple[int, bytes, dict]:
        """sagemaker-runtime's InvokeEndpoint (rest-json) -> (status, body, headers)."""
        try:
            if self.verifier is not None:
                self.verifier.verify(method, url, headers, body)
        except ApiError as error:
            return error.status, protocol.encode(error.body()), {
                "x-amzn-ErrorType": error.code, "content-type": "application/json"}
        return self.endpoints.invoke(name, body, headers)

    def handle(self, method: str, url: str, headers: dict[str, str], body: bytes) -> tuple[int, bytes]:
        """One request -> (HTTP status, JSON body); never raises."""
        try:
            if self.verifier is not None:
                self.verifier.verify(method, url, headers, body)
            if method != "POST":
                raise UnknownOperationException("this endpoint serves POST / only")
            target = next((v for k, v in headers.items() if k.lower() == "x-amz-target"), None)
            call = protocol.parse(target, body)
            if call.operation not in SERVED[call.service]:
                raise UnknownOperationException(
                    f"{call.operation} is not served by Shoal's endpoint (it serves "
                    f"{', '.join(SERVED[call.service])})")
            handler = self.handlers[call.service]
            if call.service == "sagemaker" and call.operation in ENDPOINT_OPERATIONS:
                handler = self.endpoints
            output = getattr(handler, call.operation)(call.params)
            return 200, protocol.encode(output)
        except ApiError as error:
            if error.status >= 500:
                log.error("%s", error.message)
            return error.status, protocol.encode(error.body())
        except Exception:  # a bug: logged here, never its traceback in the answer
            log.exception("internal failure")
            return 500, protocol.encode({"__type": "InternalFailure",
                                         "message": "The request processing has failed because "
                                                    "of an unknown error."})


def create_app(endpoint: Endpoint) -> Starlette:
    async def serve(request: Request) -> Response:
        began = time.perf_counter()
        body = await request.body()
        args = (request.method, str(request.url), dict(request.headers), body)
        if _slow(args[2]):
            status, payload = await run_in_threadpool(endpoint.handle, *args)
        else:  # a read of small local files: inline, no thread hand-off (see the module's doc)
            status, payload = endpoint.handle(*args)
        # the endpoint's own time, for clients that tell it from the network's and their own
        timing = f"app;dur={(time.perf_counter() - began) * 1e3:.2f}"
        return Response(payload, status_code=status, media_type=_content_type(args[2]),
                        headers={"x-amzn-RequestId": str(uuid.uuid4()), "Server-Timing": timing})

    async def invoke(request: Request) -> Response:
        body = await request.body()
        status, payload, headers = await run_in_threadpool(
            endpoint.invoke, request.method, str(request.url), dict(request.headers), body,
            request.path_params["name"])
        return Response(payload, status_code=status,
                        headers={"x-amzn-RequestId": str(uuid.uuid4()), **headers})

    return Starlette(routes=[Route("/", serve, methods=["POST", "GET"]),
                             Route("/endpoints/{name}/invocations", invoke, methods=["POST"])])


# Calls that start or signal processes, or write a job: run in the thread pool.
SLOW_TARGETS = frozenset({"SageMaker.CreateTrainingJob", "SageMaker.StopTrainingJob",
                          "SageMaker.CreateEndpoint", "SageMaker.DeleteEndpoint"})


def _content_type(headers: dict[str, str]) -> str:
    """CloudWatch speaks JSON 1.0, the others JSON 1.1."""
    target = headers.get("x-amz-target") or ""
    return CONTENT_TYPE_1_0 if target.startswith("GraniteServiceVersion20100801.") else CONTENT_TYPE


def _slow(headers: dict[str, str]) -> bool:
    return headers.get("x-amz-target") in SLOW_TARGETS


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def bind(host: str, port: int) -> socket.socket:
    return listening_socket(host, port, backlog=512)


def url_of(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def serve_forever(endpoint: Endpoint, sock: socket.socket, access_log: bool = False) -> None:
    import uvicorn

    config = uvicorn.Config(create_app(endpoint), log_level="warning", access_log=access_log,
                            lifespan="off")
    uvicorn.Server(config).run(sockets=[sock])
