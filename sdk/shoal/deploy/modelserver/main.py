"""``serve``: the model server's process tree.

    python -m shoal.deploy.modelserver [--model-dir DIR] [--host H] [--port P]

The settings are the inference toolkit's environment: ``SAGEMAKER_PROGRAM``,
``SAGEMAKER_BIND_TO_PORT`` (8080), ``SAGEMAKER_MODEL_SERVER_WORKERS`` (default: one per CPU
core, at most 4, or one per GPU), ``SAGEMAKER_MODEL_SERVER_TIMEOUT`` (60 s),
``SAGEMAKER_MAX_PAYLOAD_IN_MB`` (6), ``SAGEMAKER_STARTUP_TIMEOUT`` (600 s) and the model in
``$SAGEMAKER_BASE_DIR/model`` (``/opt/ml/model``); ``SHOAL_MODEL_SERVER_FRAMEWORK``
(``pytorch`` or ``tensorflow``, set by the inference images) picks the contract. The parent binds the port once and starts
the workers on it (each a uvicorn server on the shared socket, its own model); it never
imports the framework. It exits 1 with the reason on stderr (and in ``--failure-file``) when
a worker cannot load the model; a worker that dies later is replaced.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time

import attrs

from .app import Settings

log = logging.getLogger("shoal.modelserver")
DEFAULT_PORT = 8080
MAX_DEFAULT_WORKERS = 4


def _positive(instance, attribute, value):
    if value <= 0:
        raise ValueError(f"'{attribute.name}' must be > 0 (got {value!r})")


@attrs.frozen
class ServerConfig:
    """The server's settings, parsed once from the environment and the command line."""

    model_dir: str
    host: str = "0.0.0.0"
    port: int = attrs.field(default=DEFAULT_PORT, validator=attrs.validators.and_(
        attrs.validators.ge(0), attrs.validators.le(65535)))
    workers: int = attrs.field(default=1, validator=_positive)
    timeout: float = attrs.field(default=60.0, validator=_positive)
    startup_timeout: float = attrs.field(default=600.0, validator=_positive)
    max_payload: int = attrs.field(default=6 * 1024 * 1024, validator=_positive)
    program: str | None = None
    framework: str = attrs.field(default="pytorch", validator=attrs.validators.in_(
        ("pytorch", "tensorflow")))

    @classmethod
    def from_env(cls, environ, model_dir=None, host=None, port=None) -> ServerConfig:
        def number(name, kind, default):
            raw = environ.get(name)
            if raw in (None, ""):
                return default
            try:
                return kind(raw)
            except ValueError:
                raise ValueError(f"'{name}' must be a number (got {raw!r})") from None

        base = environ.get("SAGEMAKER_BASE_DIR") or "/opt/ml"
        return cls(
            model_dir=str(model_dir or os.path.join(base, "model")),
            host=host or "0.0.0.0",
            port=port if port is not None else number("SAGEMAKER_BIND_TO_PORT", int,
                                                      DEFAULT_PORT),
            workers=number("SAGEMAKER_MODEL_SERVER_WORKERS", int, default_workers()),
            timeout=number("SAGEMAKER_MODEL_SERVER_TIMEOUT", float, 60.0),
            startup_timeout=number("SAGEMAKER_STARTUP_TIMEOUT", float, 600.0),
            max_payload=int(number("SAGEMAKER_MAX_PAYLOAD_IN_MB", float, 6) * 1024 * 1024),
            program=environ.get("SAGEMAKER_PROGRAM") or None,
            framework=environ.get("SHOAL_MODEL_SERVER_FRAMEWORK") or "pytorch")

    def worker_settings(self, port: int | None = None) -> Settings:
        return Settings(self.model_dir, self.program, self.timeout, self.max_payload,
                        framework=self.framework, port=port)


def default_workers() -> int:
    """One worker per GPU, else per core up to four (each holds its own model)."""
    try:
        import pynvml

        pynvml.nvmlInit()
        gpus = pynvml.nvmlDeviceGetCount()
        if gpus:
            return gpus
    except Exception:  # no driver, no GPU: a CPU host
        pass
    return max(1, min(MAX_DEFAULT_WORKERS, os.cpu_count() or 1))


def bind(host: str, port: int, backlog: int = 1024) -> socket.socket:
    """A listening TCP socket (``shoal serve`` binds its port with it too)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    # accepted connections inherit it: an answer's headers and body are two writes, and
    # with Nagle's algorithm the body waits for the client's delayed ACK (40 ms a call)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.bind((host, port))
    sock.listen(backlog)
    return sock


class Supervisor:
    """The workers on one listening socket: started, awaited, replaced, stopped."""

    def __init__(self, config: ServerConfig, sock: socket.socket):
        self.config, self.sock = config, sock
        self.workers: list[tuple[subprocess.Popen, int]] = []
        self.stopping = False

    def spawn(self) -> tuple[subprocess.Popen, int]:
        read, write = os.pipe()
        env = dict(os.environ, SHOAL_MODELSERVER_FD=str(self.sock.fileno()),
                   SHOAL_MODELSERVER_STATUS_FD=str(write),
                   SHOAL_MODELSERVER_SETTINGS=json.dumps(
                       attrs.asdict(self.config.worker_settings(self.sock.getsockname()[1]))))
        proc = subprocess.Popen([sys.executable, "-m", "shoal.deploy.modelserver.worker"],
                                env=env, pass_fds=(self.sock.fileno(), write))
        os.close(write)
        return proc, read

    def start(self) -> str | None:
        """Start every worker; None once all loaded the model, else the first reason."""
        self.workers = [self.spawn() for _ in range(self.config.workers)]
        deadline = time.monotonic() + self.config.startup_timeout
        for proc, read in self.workers:
            reason = read_status(read, proc, deadline)
            if reason is not None:
                return reason
        return None

    def watch(self) -> None:
        while not self.stopping:
            for i, (proc, read) in enumerate(self.workers):
                if proc.poll() is not None and not self.stopping:
                    os.close(read)
                    log.warning("model server worker %d exited (%s); starting another",
                                proc.pid, proc.returncode)
                    self.workers[i] = fresh = self.spawn()
                    reason = read_status(fresh[1], fresh[0],
                                         time.monotonic() + self.config.startup_timeout)
                    if reason is not None:
                        log.error("the replacement worker failed: %s", reason)
            time.sleep(0.2)

    def stop(self, *_) -> None:
        self.stopping = True
        for proc, _read in self.workers:
            if proc.poll() is None:
                proc.terminate()
        for proc, _read in self.workers:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()


def read_status(fd: int, proc: subprocess.Popen, deadline: float) -> str | None:
    """A worker's first line on its status pipe: ``ready`` -> None, ``failed REASON``."""
    import select

    buffered = b""
    while b"\n" not in buffered:
        left = deadline - time.monotonic()
        if left <= 0:
            proc.kill()
            return "the model server did not load the model within SAGEMAKER_STARTUP_TIMEOUT"
        ready, _, _ = select.select([fd], [], [], min(left, 1.0))
        if ready:
            chunk = os.read(fd, 65536)
            if not chunk:
                proc.wait()
                return f"a model server worker exited ({proc.returncode}) before it was ready"
            buffered += chunk
    line = buffered.split(b"\n", 1)[0].decode("utf-8", "replace")
    return None if line == "ready" else line.removeprefix("failed ")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="Serve a model (the SageMaker inference "
                                                 "container's contract).")
    parser.add_argument("command", nargs="?", choices=("serve",), help="as `docker run IMAGE serve`")
    parser.add_argument("--model-dir")
    parser.add_argument("--host")
    parser.add_argument("--port", type=int)
    parser.add_argument("--failure-file", help="Write the reason here when the model fails to "
                                               "load (as /opt/ml/output/failure for training).")
    parser.add_argument("--ready-file", help="Create this file once every worker is ready.")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s: "
                                                   "%(message)s")
    try:
        config = ServerConfig.from_env(os.environ, args.model_dir, args.host, args.port)
    except ValueError as error:
        print(f"serve: {error}", file=sys.stderr)
        return 2
    sock = bind(config.host, config.port)
    sock.set_inheritable(True)  # the workers accept on it
    supervisor = Supervisor(config, sock)
    signal.signal(signal.SIGTERM, supervisor.stop)
    signal.signal(signal.SIGINT, supervisor.stop)
    reason = supervisor.start()
    if reason is not None:
        print(f"serve: the model failed to load: {reason}", file=sys.stderr)
        if args.failure_file:
            with open(args.failure_file, "w", encoding="utf-8") as handle:
                handle.write(reason)
        supervisor.stop()
        return 1
    host, port = sock.getsockname()[:2]
    if args.ready_file:
        with open(args.ready_file, "w", encoding="utf-8") as handle:
            handle.write(f"{host}:{port}\n")
    log.info("serving %s on http://%s:%d with %d worker(s)", config.model_dir, host, port,
             config.workers)
    supervisor.watch()
    return 0
