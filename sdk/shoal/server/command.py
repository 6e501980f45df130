"""``shoal serve``: run the endpoint until interrupted; its URL is the first line it prints.

``--detach`` serves in the background instead and prints the shell's environment for it
(``eval "$(shoal serve --detach)"``). The parent binds the socket and hands it to the server,
so the port is known at once and no connection is refused while the server starts; it
returns once the server answers.
"""

from __future__ import annotations

import os
import re
import shlex
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import click

from shoal.errors import ConfigError

SECRET_ENV = "SHOAL_SERVE_SECRET_ACCESS_KEY"
PID_ENV = "SHOAL_SERVE_PID"
PLACEHOLDER_KEY = "local"  # loopback accepts any keys; clients only need some to sign with
START_TIMEOUT = 60.0
REGION = re.compile(r"[a-z]{2}(-[a-z0-9]+)+")


def _region(ctx, param, value: str) -> str:
    if not REGION.fullmatch(value):
        raise click.BadParameter(f"{value!r} is not a region name (e.g. us-east-1)")
    return value


@click.command()
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to listen on; beyond loopback, signed requests only.")
@click.option("--port", default=0, show_default=True, help="0 picks a free port.")
@click.option("--region", default="us-east-1", show_default=True, callback=_region,
              help="Region in the ARNs.")
@click.option("--access-key-id", help=f"Require SigV4 signatures with this key; its secret is "
                                      f"read from ${SECRET_ENV}.")
@click.option("--root", type=click.Path(file_okay=False),
              help="Local jobs' directory (default $SHOAL_LOCAL_ROOT or ~/.shoal/local).")
@click.option("--access-log", is_flag=True, help="Log every request to stderr.")
@click.option("--detach", is_flag=True,
              help=f"Serve in the background and print the shell's environment for it: "
                   f'eval "$(shoal serve --detach)"; stop it with kill ${PID_ENV}.')
@click.option("--listen-fd", type=int, hidden=True)  # a detached server's socket
def serve(host, port, region, access_key_id, root, access_log, detach, listen_fd):
    """Serve the SageMaker, CloudWatch Logs and CloudWatch (training metrics) APIs for training
    jobs run on this machine.

    Point clients at it: AWS_ENDPOINT_URL_SAGEMAKER=<url> AWS_ENDPOINT_URL_CLOUDWATCH_LOGS=<url>
    AWS_ENDPOINT_URL_CLOUDWATCH=<url> AWS_ENDPOINT_URL_SAGEMAKER_RUNTIME=<url>.
    """
    from .app import Endpoint, bind, serve_forever, url_of

    verifier = _verifier(host, access_key_id)
    sock = socket.socket(fileno=listen_fd) if listen_fd is not None else bind(host, port)
    if detach:
        url, pid, log = _start_detached(sock, host, region, access_key_id, root, access_log)
        for line in environment(url, region, access_key_id, pid):
            click.echo(line)
        click.echo(f"shoal serve: {url} in the background (pid {pid}, log {log}); "
                   f"stop it with: kill {pid}", err=True)
        return
    click.echo(url_of(sock))  # a detached server's goes to its log
    sys.stdout.flush()
    try:
        serve_forever(Endpoint(root, region, verifier), sock, access_log)
    except KeyboardInterrupt:
        pass


def _verifier(host: str, access_key_id: str | None):
    from .app import is_loopback
    from .signing import Verifier

    if access_key_id:
        secret = os.environ.get(SECRET_ENV)
        if not secret:
            raise ConfigError(f"--access-key-id needs its secret in ${SECRET_ENV}")
        return Verifier(access_key_id, secret)
    if not is_loopback(host):
        raise ConfigError(f"listening on {host} (beyond loopback) needs --access-key-id and "
                          f"${SECRET_ENV}: every request must then be signed")
    return None


def environment(url: str, region: str, access_key_id: str | None, pid: int) -> list[str]:
    """``export`` lines for a POSIX shell. A region or keys the shell already has are kept
    (loopback accepts any keys, and S3 may need the real ones); the secret of a signing
    server is named, never printed."""
    lines = [f"export AWS_ENDPOINT_URL_SAGEMAKER={shlex.quote(url)}",
             f"export AWS_ENDPOINT_URL_CLOUDWATCH_LOGS={shlex.quote(url)}",
             f'export AWS_DEFAULT_REGION="${{AWS_DEFAULT_REGION:-{region}}}"',
             f"export AWS_ENDPOINT_URL_CLOUDWATCH={shlex.quote(url)}",  # training metrics
             f"export AWS_ENDPOINT_URL_SAGEMAKER_RUNTIME={shlex.quote(url)}"]  # InvokeEndpoint
    if access_key_id:
        lines += [f"export AWS_ACCESS_KEY_ID={shlex.quote(access_key_id)}",
                  f'export AWS_SECRET_ACCESS_KEY="${SECRET_ENV}"']
    else:
        lines += [f'export AWS_ACCESS_KEY_ID="${{AWS_ACCESS_KEY_ID:-{PLACEHOLDER_KEY}}}"',
                  f'export AWS_SECRET_ACCESS_KEY="${{AWS_SECRET_ACCESS_KEY:-{PLACEHOLDER_KEY}}}"']
    return lines + [f"export {PID_ENV}={pid}"]


def _start_detached(sock: socket.socket, host, region, access_key_id, root, access_log):
    """Start the server on ``sock`` in a session of its own (a closed terminal leaves it
    running), its output in a log file; return its URL, pid and log once it answers."""
    from .app import url_of

    url = url_of(sock)
    log = Path.home() / ".shoal" / f"serve-{sock.getsockname()[1]}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, "-m", "shoal.cli", "serve", "--host", host, "--region", region,
            "--listen-fd", str(sock.fileno())]
    argv += ["--access-key-id", access_key_id] if access_key_id else []
    argv += ["--root", str(root)] if root else []
    argv += ["--access-log"] if access_log else []
    with open(log, "ab") as out:
        server = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                                  pass_fds=(sock.fileno(),), start_new_session=True)
    sock.close()  # the server's copy listens
    _wait_answering(url, server, log)
    return url, server.pid, log


def _wait_answering(url: str, server: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT
    while True:
        try:
            urllib.request.urlopen(url + "/", timeout=5).close()
            return
        except urllib.error.HTTPError:
            return  # an answer (GET is not an operation): it serves
        except OSError:
            if server.poll() is not None or time.monotonic() > deadline:
                break
            time.sleep(0.1)  # refused only in the instant the server's socket is being set up
    if server.poll() is None:
        server.terminate()
    tail = log.read_text(errors="replace")[-2000:]
    raise ConfigError(f"shoal serve did not start (its log, {log}):\n{tail}")
