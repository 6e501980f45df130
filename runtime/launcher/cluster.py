"""Coordinating the hosts of a multi-host MPI job.

On SageMaker every host runs ``train``. Workers fetch the code, start sshd and report to
the master; the master (first sorted host) starts sshd, waits until every worker's sshd
accepts TCP connections on port 22 and every worker has reported ready
(``SHOAL_WORKER_TIMEOUT``, default 3600 s), then runs mpirun, which reaches the workers
over ssh with the image's keys. The status channel is one TCP port on the master
(``SHOAL_STATUS_PORT``, default 7594):

* a worker connects (retrying until the master is up) and sends one JSON line,
  ``{"host": "algo-2", "ready": true}``, or ``"ready": false`` with a ``message`` when it
  could not start (then the master does not run mpirun and the job fails everywhere);
* when mpirun has ended the master answers every worker with one JSON line
  ``{"exit_code": N, "message": "<the failure text>"}``; the worker writes the same
  ``output/success`` or ``output/failure`` and exits with the same code, so a failed job
  fails on every host (the toolkit's workers exit 0 when the job failed);
* a connection lost before the answer means the master died: the worker fails too.

The master keeps answering for ``SHOAL_STATUS_LINGER`` seconds (default 60) after the job
so that late workers learn the outcome. Only readiness and the outcome travel; nothing a
peer sends is executed or written anywhere.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Iterator, Sequence

import attrs
from shoal.errors import LaunchError

log = logging.getLogger(__name__)

SSHD = "/usr/sbin/sshd"
STATUS_PORT = 7594


@attrs.frozen
class JobStatus:
    exit_code: int
    message: str = ""

    def to_line(self) -> bytes:
        return (json.dumps({"exit_code": self.exit_code, "message": self.message}) + "\n").encode()

    @classmethod
    def from_line(cls, line: bytes) -> JobStatus:
        data = json.loads(line.decode("utf-8"))
        return cls(int(data["exit_code"]), str(data.get("message", "")))


def sshd_running() -> bool:
    """Whether an sshd serves this host: port 22 answers on its own loopback. (An sshd
    process seen on the machine is not enough: hosts that share a PID namespace, such as
    containers run with chroot isolation, each need their own on their own network.)"""
    return can_connect("127.0.0.1", 22, timeout=0.5)


def start_sshd(sshd: str = SSHD) -> subprocess.Popen | None:
    """Start sshd in the foreground mode (its own process) unless one serves this host."""
    if sshd_running():
        return None
    if not os.path.exists(sshd):
        raise LaunchError(f"{sshd} not found: multi-host MPI jobs need openssh-server")
    if shutil.which("ssh-keygen") and not any(
        n.startswith("ssh_host_") for n in os.listdir("/etc/ssh") if os.path.isdir("/etc/ssh")
    ):
        subprocess.run(["ssh-keygen", "-A"], check=False, capture_output=True)
    os.makedirs("/run/sshd", exist_ok=True)
    return subprocess.Popen([sshd, "-D"])


def can_connect(host: str, port: int, timeout: float = 2.0) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


FIRST_RETRY = 0.02
MAX_RETRY = 1.0


def backoff(first: float = FIRST_RETRY, cap: float = MAX_RETRY) -> Iterator[float]:
    """Retry delays: ``first``, doubling up to ``cap`` (pure).

    Hosts usually come up within a fraction of a second of each other: short first
    retries keep start-up fast, the cap keeps a long wait from busy-polling.
    """
    delay = first
    while True:
        yield min(delay, cap)
        delay *= 2


def wait_for_ports(hosts: Sequence[str], port: int = 22, timeout: float = 3600.0,
                   interval: float = FIRST_RETRY) -> None:  # fmt: skip
    """Block until every host accepts connections on ``port``, or raise LaunchError.

    ``interval`` is the first retry delay; later ones double (:func:`backoff`).
    """
    deadline = time.monotonic() + timeout
    for host in hosts:
        delays = backoff(interval)
        while not can_connect(host, port):
            if time.monotonic() > deadline:
                raise LaunchError(f"host {host} did not open port {port} within {timeout:.0f}s")
            time.sleep(next(delays))
        log.info("host %s is reachable on port %d", host, port)


class StatusServer:
    """The master's side: knows which workers are ready; sends them the job's outcome."""

    def __init__(self, port: int = STATUS_PORT, bind: str = "") -> None:
        self._sock = socket.create_server((bind, port))
        self._sock.settimeout(0.5)
        self._status: JobStatus | None = None
        self._ready = threading.Event()
        self._closing = threading.Event()
        self._cond = threading.Condition()
        self._connected: set[str] = set()
        self._acked: set[str] = set()
        self._worker_failure: tuple[str, str] | None = None
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    @property
    def port(self) -> int:
        return self._sock.getsockname()[1]

    def _accept(self) -> None:
        while not self._closing.is_set():
            try:
                conn, _ = self._sock.accept()
            except (TimeoutError, socket.timeout):
                continue
            except OSError:
                return
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _answer(self, conn: socket.socket) -> None:
        with conn:
            try:
                conn.settimeout(30)
                hello = _parse_hello(conn.makefile("rb").readline(4096))
                name = hello["host"]
                with self._cond:
                    self._connected.add(name)
                    if not hello["ready"] and self._worker_failure is None:
                        self._worker_failure = (name, hello["message"])
                    self._cond.notify_all()
                conn.settimeout(None)
                self._ready.wait()
                conn.sendall(self._status.to_line())
                conn.recv(16)  # the worker closes after reading: the acknowledgement
            except OSError:
                return
            with self._cond:
                self._acked.add(name)
                self._cond.notify_all()

    def wait_for_workers(self, hosts: Sequence[str], timeout: float) -> None:
        """Block until every host in ``hosts`` has connected, or raise LaunchError."""
        with self._cond:
            done = self._cond.wait_for(
                lambda: set(hosts) <= self._connected or self._worker_failure, timeout
            )
            if self._worker_failure:
                host, message = self._worker_failure
                raise LaunchError(f"host {host} could not start: {message}")
            if not done:
                missing = sorted(set(hosts) - self._connected)
                raise LaunchError(f"workers {missing} did not report ready within {timeout:.0f}s")

    def publish(self, status: JobStatus) -> None:
        self._status = status
        self._ready.set()

    def close(self, hosts: Sequence[str] = (), linger: float = 0.0) -> None:
        """Wait up to ``linger`` seconds for ``hosts`` to receive the outcome, then close."""
        with self._cond:
            self._cond.wait_for(lambda: set(hosts) <= self._acked, linger)
        self._closing.set()
        self._sock.close()
        self._thread.join(timeout=2)


def _parse_hello(line: bytes) -> dict:
    try:
        data = json.loads(line.decode("utf-8", "replace"))
        return {"host": str(data["host"]), "ready": bool(data.get("ready", True)),
                "message": str(data.get("message", ""))[:1024]}  # fmt: skip
    except (ValueError, KeyError, TypeError, AttributeError):
        return {"host": line.decode("utf-8", "replace").strip()[:256], "ready": True, "message": ""}


def wait_for_outcome(master: str, port: int = STATUS_PORT, connect_timeout: float = 3600.0,
                     interval: float = FIRST_RETRY, me: str = "",
                     failed: str | None = None) -> JobStatus:  # fmt: skip
    """The worker's side: report to the master, block until it sends the outcome.

    ``failed`` reports that this worker could not start (with that message). ``interval``
    is the first delay between connection attempts; later ones double (:func:`backoff`).
    """
    deadline = time.monotonic() + connect_timeout
    delays = backoff(interval)
    while True:
        try:
            conn = socket.create_connection((master, port), timeout=5)
            break
        except OSError:
            if time.monotonic() > deadline:
                return JobStatus(1, f"could not reach the master {master}:{port}")
            time.sleep(next(delays))
    with conn:
        hello = {"host": me or "worker", "ready": failed is None, "message": failed or ""}
        conn.sendall(json.dumps(hello).encode() + b"\n")
        conn.settimeout(None)
        data = b""
        while not data.endswith(b"\n"):
            chunk = conn.recv(65536)
            if not chunk:
                return JobStatus(1, f"lost contact with the master {master} before the job ended")
            data += chunk
    return JobStatus.from_line(data)
