"""``shoal serve``: run the endpoint until interrupted; its URL is the first line it prints."""

from __future__ import annotations

import os
import sys

import click

from shoal.errors import ConfigError

SECRET_ENV = "SHOAL_SERVE_SECRET_ACCESS_KEY"


@click.command()
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to listen on; beyond loopback, signed requests only.")
@click.option("--port", default=0, show_default=True, help="0 picks a free port.")
@click.option("--region", default="us-east-1", show_default=True, help="Region in the ARNs.")
@click.option("--access-key-id", help=f"Require SigV4 signatures with this key; its secret is "
                                      f"read from ${SECRET_ENV}.")
@click.option("--root", type=click.Path(file_okay=False),
              help="Local jobs' directory (default $SHOAL_LOCAL_ROOT or ~/.shoal/local).")
@click.option("--access-log", is_flag=True, help="Log every request to stderr.")
def serve(host, port, region, access_key_id, root, access_log):
    """Serve the SageMaker and CloudWatch Logs APIs for training jobs run on this machine.

    Point clients at it: AWS_ENDPOINT_URL_SAGEMAKER=<url> AWS_ENDPOINT_URL_CLOUDWATCH_LOGS=<url>.
    """
    from .app import Endpoint, bind, is_loopback, serve_forever, url_of
    from .signing import Verifier

    verifier = None
    if access_key_id:
        secret = os.environ.get(SECRET_ENV)
        if not secret:
            raise ConfigError(f"--access-key-id needs its secret in ${SECRET_ENV}")
        verifier = Verifier(access_key_id, secret)
    elif not is_loopback(host):
        raise ConfigError(f"listening on {host} (beyond loopback) needs --access-key-id and "
                          f"${SECRET_ENV}: every request must then be signed")
    sock = bind(host, port)
    click.echo(url_of(sock))
    sys.stdout.flush()
    try:
        serve_forever(Endpoint(root, region, verifier), sock, access_log)
    except KeyboardInterrupt:
        pass
