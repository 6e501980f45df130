"""Pushing a built image: to ECR under the name the SDK resolves by default
(``matrix.image_uri``), or to a local OCI layout / directory (``oci:PATH``, ``dir:PATH``).

The ECR half (authorization, repository) talks to an ECR client passed in; the command
lines are pure; ``push_image`` runs them. The registry password only ever travels on a
builder's stdin and in a private, temporary auth file, never in argv or logs.
"""

from __future__ import annotations

import base64
import tempfile
from pathlib import Path

import attrs
from botocore.exceptions import ClientError, NoRegionError
from shoal.containers import builder as builders
from shoal.containers import matrix, render
from shoal.errors import BuildError

LOCAL_TRANSPORTS = ("oci", "dir")


@attrs.frozen
class RegistryLogin:
    registry: str  # host name, e.g. 123456789012.dkr.ecr.us-west-2.amazonaws.com
    username: str
    password: str = attrs.field(repr=False)

    @property
    def account(self) -> str:
        return self.registry.split(".", 1)[0]


@attrs.frozen
class Destination:
    """Where to push: ECR (``transport == "ecr"``) or a local ``oci``/``dir`` path."""

    transport: str = attrs.field(validator=attrs.validators.in_(("ecr", *LOCAL_TRANSPORTS)))
    path: str | None = None


def parse_destination(text: str | None) -> Destination:
    """``None``/"ecr" -> ECR; ``oci:/path`` or ``dir:/path`` -> a local layout."""
    if text in (None, "", "ecr"):
        return Destination("ecr")
    transport, sep, path = text.partition(":")
    if not sep or transport not in LOCAL_TRANSPORTS or not path:
        raise BuildError(f"'dest' must be 'ecr', 'oci:PATH' or 'dir:PATH' (got {text!r})")
    return Destination(transport, str(Path(path).absolute()))


def decode_authorization(data: dict) -> RegistryLogin:
    """One ``authorizationData`` entry of GetAuthorizationToken as a login."""
    username, _, password = base64.b64decode(data["authorizationToken"]).decode().partition(":")
    registry = data["proxyEndpoint"].removeprefix("https://").removeprefix("http://").rstrip("/")
    return RegistryLogin(registry=registry, username=username, password=password)


def ecr_login(ecr, account: str | None = None) -> RegistryLogin:
    """ECR's registry and credentials for ``account`` (default: the caller's)."""
    kwargs = {"registryIds": [account]} if account else {}
    try:
        reply = ecr.get_authorization_token(**kwargs)
    except ClientError as error:
        raise BuildError(f"ECR GetAuthorizationToken failed: {error}") from error
    return decode_authorization(reply["authorizationData"][0])


def ensure_repository(ecr, name: str, *, account: str | None = None, scan_on_push: bool = True,
                      immutable_tags: bool = False) -> dict:
    """The ECR repository ``name``, created (scanned on push) when missing."""
    owner = {"registryId": account} if account else {}
    try:
        return ecr.describe_repositories(repositoryNames=[name], **owner)["repositories"][0]
    except ClientError as error:
        if error.response["Error"]["Code"] != "RepositoryNotFoundException":
            raise BuildError(f"ECR DescribeRepositories failed: {error}") from error
    try:
        return ecr.create_repository(
            repositoryName=name,
            imageTagMutability="IMMUTABLE" if immutable_tags else "MUTABLE",
            imageScanningConfiguration={"scanOnPush": scan_on_push},
            encryptionConfiguration={"encryptionType": "AES256"},
            **owner,
        )["repository"]
    except ClientError as error:
        raise BuildError(f"ECR CreateRepository failed for {name}: {error}") from error


def login_command(builder: str, registry: str, *, authfile: Path | None = None,
                  buildah: builders.Buildah | None = None) -> list[str]:
    """The argv that logs in to ``registry``; the password is given on stdin."""
    if builder == "docker":
        return ["docker", "login", "--username", "AWS", "--password-stdin", registry]
    settings = buildah or builders.Buildah()
    auth = ["--authfile", str(authfile)] if authfile else []
    return [*settings.global_args(), "login", *auth, "--username", "AWS",
            "--password-stdin", registry]


def push_commands(builder: str, local: str, destination: str, *, authfile: Path | None = None,
                  buildah: builders.Buildah | None = None) -> list[list[str]]:
    """The argvs that push image ``local`` to ``destination`` (a registry name, or a
    ``oci:``/``dir:`` transport reference)."""
    local_transport = destination.split(":", 1)[0] in LOCAL_TRANSPORTS
    if builder == "docker":
        if local_transport:
            raise BuildError("pushing to an oci:/dir: destination needs buildah")
        return [["docker", "tag", local, destination], ["docker", "push", destination]]
    settings = buildah or builders.Buildah()
    auth = ["--authfile", str(authfile)] if authfile and not local_transport else []
    target = destination if local_transport else f"docker://{destination}"
    return [[*settings.global_args(), "push", *auth, local, target]]


def local_reference(dest: Destination, tag: str) -> str:
    """A buildah transport reference: ``oci:/path:tag`` (tag names the image in the
    layout's index.json) or ``dir:/path``."""
    return f"oci:{dest.path}:{tag}" if dest.transport == "oci" else f"dir:{dest.path}"


def push_image(options: render.BuildOptions, *, dest: str | None = None, ecr=None,
               builder: str | None = None, buildah: builders.Buildah | None = None,
               account: str | None = None, region: str | None = None,
               scan_on_push: bool = True, immutable_tags: bool = False) -> str:
    """Push the locally built image for ``options``; returns where it went."""
    builder = builder or builders.detect_builder()
    spec, local = options.spec, options.local_name
    target = parse_destination(dest)
    if target.transport != "ecr":
        reference = local_reference(target, spec.tag(options.processor))
        for argv in push_commands(builder, local, reference, buildah=buildah):
            builders.run(argv)
        return reference
    if ecr is None:
        import boto3  # only an ECR push needs AWS

        try:
            ecr = boto3.client("ecr", region_name=region)
        except NoRegionError:
            ecr = None
    if ecr is None or not ecr.meta.region_name:
        raise BuildError("no AWS region for the ECR push: pass --region or set AWS_DEFAULT_REGION")
    login = ecr_login(ecr, account)
    ensure_repository(ecr, spec.repository(options.scope), account=login.account,
                      scan_on_push=scan_on_push, immutable_tags=immutable_tags)
    uri = matrix.image_uri(spec, options.processor, login.account, ecr.meta.region_name,
                           options.scope)
    with tempfile.TemporaryDirectory(prefix="shoal-auth-") as private:
        authfile = Path(private) / "auth.json" if builder == "buildah" else None
        builders.run(login_command(builder, login.registry, authfile=authfile, buildah=buildah),
                     stdin=login.password)
        for argv in push_commands(builder, local, uri, authfile=authfile, buildah=buildah):
            builders.run(argv)
    return uri
