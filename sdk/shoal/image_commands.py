"""``shoal image build|push``: the command-line face of Shoal's training images
(mounted by the main CLI as ``shoal image``). Shoal's errors propagate to the main CLI,
which maps them to exit codes (ImageError 2, BuildError 1)."""

from __future__ import annotations

from pathlib import Path

import click

from shoal.containers import builder as builders
from shoal.containers import matrix, push, render


def _image_options(command):
    """The options naming one image of the matrix, shared by build and push."""
    frameworks = sorted({spec.framework for spec in matrix.specs()})
    decorators = [
        click.option("--framework", required=True, type=click.Choice(frameworks)),
        # --framework-version as `shoal run` and the job files name it; --version stays an alias.
        click.option("--framework-version", "--version", "framework_version", required=True,
                     help="Framework version of the matrix, e.g. 1.13.1 (or 1.13: its newest "
                          "patch release)."),
        click.option("--processor", type=click.Choice(matrix.PROCESSORS), default="gpu",
                     show_default=True),
        click.option("--scope", type=click.Choice(matrix.SCOPES), default="training",
                     show_default=True, help="A training image (train) or an inference image "
                                             "(serve: the model server)."),
    ]
    for decorate in reversed(decorators):
        command = decorate(command)
    return command


@click.group("image")
def image():
    """Build and push Shoal's training and inference images."""


@image.command("build")
@_image_options
@click.option("--base", default=None, help="Base image instead of the matrix's (e.g. a local one).")
@click.option("--python", default=None,
              help='Python of the base to use: "3.9" (python3.9 packages) or "3" (python3).')
@click.option("--no-framework", is_flag=True,
              help="Leave the framework out (runtime and launcher only).")
@click.option("--source", type=click.Path(exists=True, file_okay=False, path_type=Path),
              default=None, help="Shoal source tree to build from (default: this checkout).")
@click.option("--ca-certificate", "ca_certificates", multiple=True,
              type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="Extra CA certificate (*.crt) to trust, e.g. a TLS-inspecting proxy's.")
@click.option("--builder", type=click.Choice(builders.BUILDERS), default=None,
              help="Default: docker when an engine answers, else buildah.")
@click.option("--dry-run", is_flag=True, help="Print the rendered Dockerfile; build nothing.")
def build(framework, framework_version, processor, scope, base, python, no_framework, source,
          ca_certificates, builder, dry_run):
    """Render the Dockerfile and build the image."""
    try:
        options = render.BuildOptions(
            framework=framework, framework_version=framework_version, processor=processor,
            scope=scope, base=base, python=python, install_framework=not no_framework,
            ca_certificates=ca_certificates)
    except ValueError as error:  # attrs validators: a usage error
        raise click.BadParameter(str(error)) from error
    if dry_run:
        click.echo(render.render_dockerfile(options), nl=False)
        return
    click.echo(builders.build_image(options, source_root=source, builder=builder))


@image.command("push")
@_image_options
@click.option("--dest", default=None,
              help="ecr (default), or a local layout: oci:/path or dir:/path.")
@click.option("--account", default=None, help="ECR registry account (default: the caller's).")
@click.option("--region", default=None, help="ECR region (default: the AWS configuration's).")
@click.option("--immutable-tags", is_flag=True, help="Create the repository with immutable tags.")
@click.option("--no-scan-on-push", is_flag=True, help="Create the repository without scan on push.")
@click.option("--builder", type=click.Choice(builders.BUILDERS), default=None)
def push_(framework, framework_version, processor, scope, dest, account, region,
          immutable_tags, no_scan_on_push, builder):
    """Push a built image to ECR (as the SDK names it) or to a local layout."""
    options = render.BuildOptions(framework=framework, framework_version=framework_version,
                                  processor=processor, scope=scope)
    where = push.push_image(options, dest=dest, builder=builder, account=account, region=region,
                            scan_on_push=not no_scan_on_push, immutable_tags=immutable_tags)
    click.echo(where)
