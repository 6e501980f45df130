"""The HTTP side of one model server worker: ``GET /ping`` and ``POST /invocations``.

The model is loaded (``model_fn``) in the app's startup, before the worker accepts a
connection, so ``/ping`` answers 200 from the first request it sees. A worker runs one
request at a time on one thread, as the toolkits' model servers do (user handlers need not
be thread-safe); concurrency comes from workers. A request that outlives
``SAGEMAKER_MODEL_SERVER_TIMEOUT`` is answered 500 and the worker exits after it, so that
its supervisor starts a fresh one rather than queueing behind a stuck handler.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import logging
import os
import traceback
from collections.abc import Callable

import attrs
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from . import codecs
from .handlers import Context, Handlers, default_accept

log = logging.getLogger("shoal.modelserver")


@attrs.frozen
class Settings:
    """One worker's settings (parsed from the environment by ``main``)."""

    model_dir: str
    program: str | None = None
    timeout: float = 60.0
    max_payload: int = 6 * 1024 * 1024
    device: str | None = None
    framework: str = "pytorch"  # or tensorflow: SavedModels, TensorFlow Serving's contract
    port: int | None = None  # the bound port: a TensorFlow handler's context.rest_uri


def create_app(settings: Settings, on_ready: Callable[[], None] | None = None,
               on_failure: Callable[[str], None] | None = None) -> Starlette:
    executor = concurrent.futures.ThreadPoolExecutor(max_workers=1,
                                                     thread_name_prefix="shoal-handler")
    # TensorFlow Serving's REST route has its own thread: a user's handler calls it while
    # holding the request thread
    rest_executor = concurrent.futures.ThreadPoolExecutor(max_workers=1,
                                                          thread_name_prefix="shoal-rest")
    state: dict = {"handlers": None}
    tensorflow = settings.framework == "tensorflow"

    def load():
        from .handlers import load_module

        code_dir = os.path.join(settings.model_dir, "code")
        if tensorflow:  # the TensorFlow container's module has a fixed name
            from .tfserving import TensorFlowHandlers

            return TensorFlowHandlers(load_module(code_dir, "inference.py"), settings.model_dir,
                                      rest_port=settings.port)
        module = load_module(code_dir, settings.program)
        handlers = Handlers(module, device=settings.device)
        handlers.load(settings.model_dir, Context(settings.model_dir, system_properties={
            "model_dir": settings.model_dir}))
        return handlers

    @contextlib.asynccontextmanager
    async def lifespan(app):
        loop = asyncio.get_running_loop()
        try:
            state["handlers"] = await loop.run_in_executor(executor, load)
        except BaseException as error:
            reason = f"{type(error).__name__}: {error}"
            log.error("the model could not be loaded: %s\n%s", reason, traceback.format_exc())
            if on_failure:
                on_failure(reason)
            raise
        if on_ready:
            on_ready()
        yield
        executor.shutdown(wait=False, cancel_futures=True)

    async def ping(request: Request) -> Response:
        ready = state["handlers"] is not None
        return JSONResponse({"status": "Healthy" if ready else "Unhealthy"},
                            status_code=200 if ready else 503)

    async def invocations(request: Request) -> Response:
        body = await request.body()
        if len(body) > settings.max_payload:
            return Response(f"the request body has {len(body)} bytes; the most is "
                            f"{settings.max_payload}", status_code=413)
        content_type = request.headers.get("content-type") or codecs.JSON
        accept = request.headers.get("accept")
        if not accept or accept.strip() == codecs.ANY:
            accept = default_accept()
        loop = asyncio.get_running_loop()
        if tensorflow:
            call = loop.run_in_executor(executor, state["handlers"].transform, body,
                                        dict(request.headers))
        else:
            context = Context(settings.model_dir, dict(request.headers),
                              {"model_dir": settings.model_dir})
            call = loop.run_in_executor(executor, state["handlers"].transform, body,
                                        content_type, accept, context)
        try:
            out, out_type = await asyncio.wait_for(call, settings.timeout)
        except asyncio.TimeoutError:
            log.error("a request ran past %.0f s (SAGEMAKER_MODEL_SERVER_TIMEOUT); this worker "
                      "stops for a fresh one", settings.timeout)
            loop.call_later(0.2, os._exit, 3)  # after the answer is written
            return Response(f"the handler did not answer within {settings.timeout:g} s",
                            status_code=500)
        except Exception as error:  # the toolkit's rule, see the package docstring
            status = getattr(error, "status_code", None)
            if isinstance(status, int) and 100 <= status <= 599:
                message = getattr(error, "message", None) or str(error)
                return Response(str(message), status_code=status)
            log.exception("the handler failed")
            if tensorflow:  # the TensorFlow container answers the message alone, as JSON
                return Response(json.dumps({"error": str(error)}), status_code=500,
                                headers={"content-type": "application/json"})
            return Response(f"{error}\n{traceback.format_exc()}", status_code=500)
        # verbatim: Starlette would append a charset to text/*, and clients compare exactly
        return Response(out, headers={"content-type": out_type})

    async def tfs_rest(request: Request) -> Response:
        """``/v1/models/<name>[/versions/<v>]:predict``, TensorFlow Serving's REST API."""
        target, _, method = request.path_params["target"].rpartition(":")
        name, _, version = target.partition("/versions/")
        if not tensorflow or state["handlers"] is None or not name:
            return JSONResponse({"error": "not a TensorFlow Serving model"}, status_code=404)
        body = await request.body()
        call = asyncio.get_running_loop().run_in_executor(
            rest_executor, state["handlers"].rest, name,
            int(version) if version.isdigit() else None, method, body)
        try:
            out = await asyncio.wait_for(call, settings.timeout)
        except Exception as error:
            status = getattr(error, "status_code", 500)
            message = getattr(error, "message", None) or json.dumps({"error": str(error)})
            return Response(message, status_code=status,
                            headers={"content-type": "application/json"})
        return Response(out, headers={"content-type": "application/json"})

    return Starlette(routes=[Route("/ping", ping, methods=["GET"]),
                             Route("/invocations", invocations, methods=["POST"]),
                             Route("/v1/models/{target:path}", tfs_rest, methods=["POST"])],
                     lifespan=lifespan)
