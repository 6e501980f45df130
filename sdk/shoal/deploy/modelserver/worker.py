"""One model server worker: uvicorn on the socket its supervisor (``main``) bound."""

from __future__ import annotations

import json
import logging
import os
import socket
import sys

import uvicorn

from .app import Settings, create_app


def main() -> int:
    settings = Settings(**json.loads(os.environ["SHOAL_MODELSERVER_SETTINGS"]))
    sock = socket.socket(fileno=int(os.environ["SHOAL_MODELSERVER_FD"]))
    status = os.fdopen(int(os.environ["SHOAL_MODELSERVER_STATUS_FD"]), "w", buffering=1)

    def ready():
        status.write("ready\n")

    def failed(reason: str):
        status.write("failed " + reason.replace("\n", " ")[:4000] + "\n")

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s: "
                                                   "%(message)s")
    app = create_app(settings, on_ready=ready, on_failure=failed)
    server = uvicorn.Server(uvicorn.Config(app, lifespan="on", log_level="warning",
                                           access_log=False, timeout_graceful_shutdown=5))
    server.run(sockets=[sock])
    return 0 if server.started else 1


if __name__ == "__main__":
    sys.exit(main())
