"""The endpoint: one Starlette route (``POST /``) that checks the signature when the endpoint
requires one, parses the call (``protocol``), runs it (``TrainingJobs`` for ``SageMaker.*``,
``LogsApi`` for ``Logs_20140328.*``) and answers in the protocol's shape; served by uvicorn.

Operations run in Starlette's thread pool (they read job files and start supervisors), so
polling clients never wait on one another. There is no rate limit: a local burst is never
throttled.
"""

from __future__ import annotations

import ipaddress
import logging
import socket
import uuid
from pathlib import Path

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from shoal.local import layout

from . import protocol
from .api_errors import ApiError, UnknownOperationException
from .logs_api import LogsApi
from .signing import Verifier
from .training_jobs import TrainingJobs

log = logging.getLogger("shoal.server")
CONTENT_TYPE = "application/x-amz-json-1.1"
SERVED = {
    "sagemaker": ("CreateTrainingJob", "DescribeTrainingJob", "StopTrainingJob",
                  "ListTrainingJobs", "AddTags", "ListTags", "DeleteTags"),
    "logs": ("DescribeLogStreams", "GetLogEvents", "FilterLogEvents"),
}


class Endpoint:
    """The APIs over one local root, with an optional signature check."""

    def __init__(self, root: Path | None = None, region: str = "us-east-1",
                 verifier: Verifier | None = None):
        root = Path(root) if root else layout.local_root()
        self.handlers = {"sagemaker": TrainingJobs(root, region), "logs": LogsApi(root, region)}
        self.verifier = verifier

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
            output = getattr(self.handlers[call.service], call.operation)(call.params)
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
        body = await request.body()
        status, payload = await run_in_threadpool(
            endpoint.handle, request.method, str(request.url), dict(request.headers), body)
        return Response(payload, status_code=status, media_type=CONTENT_TYPE,
                        headers={"x-amzn-RequestId": str(uuid.uuid4())})

    return Starlette(routes=[Route("/", serve, methods=["POST", "GET"])])


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(512)
    return sock


def url_of(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def serve_forever(endpoint: Endpoint, sock: socket.socket, access_log: bool = False) -> None:
    import uvicorn

    config = uvicorn.Config(create_app(endpoint), log_level="warning", access_log=access_log,
                            lifespan="off")
    uvicorn.Server(config).run(sockets=[sock])
