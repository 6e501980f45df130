"""``shoal endpoints`` and ``shoal invoke``: this machine's endpoints (``instance_type="local"``
deploys, and ``shoal serve``'s over the same local root) or, with ``--sagemaker REGION``,
SageMaker's.

    shoal endpoints [--sagemaker REGION] [--output json]
    shoal endpoints delete NAME [--sagemaker REGION]
    shoal invoke NAME --body FILE|- [--content-type T] [--accept T] [--out FILE]

``invoke`` sends the body verbatim (InvokeEndpoint) and writes the answer's bytes to stdout
or ``--out``; a container error prints the status and message the runtime reports.
"""

from __future__ import annotations

import json
import sys

import click

from shoal.errors import InvocationError

__all__ = ["endpoints", "invoke"]


def _clients(region: str | None):
    if region is None:
        from shoal.local.endpoints import LocalEndpoints

        local = LocalEndpoints()
        return local, local
    import boto3

    from shoal.session import Session

    session = Session(boto3.Session(region_name=region))
    return session.sagemaker_client, session.client("sagemaker-runtime")


def table(rows: list[dict]) -> list[str]:
    cells = [("NAME", "STATUS", "CREATED")] + [
        (r["EndpointName"], r["EndpointStatus"],
         r["CreationTime"].astimezone().strftime("%Y-%m-%d %H:%M:%S")) for r in rows]
    widths = [max(len(c[i]) for c in cells) for i in range(2)]
    return ["  ".join([c[0].ljust(widths[0]), c[1].ljust(widths[1]), c[2]]) for c in cells]


@click.group(invoke_without_command=True)
@click.option("--sagemaker", "region", metavar="REGION", help="SageMaker's endpoints in REGION.")
@click.option("--output", type=click.Choice(["text", "json"]), default="text", show_default=True)
@click.pass_context
def endpoints(ctx, region, output):
    """List endpoints (this machine's unless --sagemaker)."""
    ctx.obj = region
    if ctx.invoked_subcommand is not None:
        return
    sm, _ = _clients(region)
    rows = sm.list_endpoints()["Endpoints"]
    if output == "json":
        click.echo(json.dumps(rows, default=str, indent=1))
        return
    for line in table(rows):
        click.echo(line)


@endpoints.command()
@click.argument("name")
@click.pass_obj
def delete(region, name):
    """Delete an endpoint and its configuration (the model stays)."""
    sm, _ = _clients(region)
    config = sm.describe_endpoint(EndpointName=name)["EndpointConfigName"]
    sm.delete_endpoint(EndpointName=name)
    try:
        sm.delete_endpoint_config(EndpointConfigName=config)
    except Exception as error:  # a configuration shared or already gone: the endpoint is
        click.echo(f"endpoint deleted; its configuration {config} was not: {error}", err=True)
    click.echo(f"deleted {name}")


@click.command()
@click.argument("name")
@click.option("--body", required=True, type=click.File("rb"), help="File to send; - for stdin.")
@click.option("--content-type", default="application/json", show_default=True)
@click.option("--accept", default=None, help="Accept header (default: the container's).")
@click.option("--out", type=click.File("wb"), default="-", help="Where the answer goes.")
@click.option("--sagemaker", "region", metavar="REGION", help="A SageMaker endpoint in REGION.")
def invoke(name, body, content_type, accept, out, region):
    """Send one request to an endpoint and write its answer."""
    from botocore.exceptions import ClientError

    _, runtime = _clients(region)
    args = {"EndpointName": name, "Body": body.read(), "ContentType": content_type}
    if accept:
        args["Accept"] = accept
    try:
        answer = runtime.invoke_endpoint(**args)
    except ClientError as error:
        info = error.response
        if info["Error"]["Code"] == "ModelError":
            raise InvocationError(name, info.get("OriginalStatusCode"),
                                  info.get("OriginalMessage", "")) from None
        raise
    out.write(answer["Body"].read())
    if out is not sys.stdout.buffer:
        click.echo(f"{answer['ContentType']} answer written to {out.name}", err=True)
