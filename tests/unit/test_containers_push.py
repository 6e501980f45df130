"""Pushing images: ECR authorization and repository (botocore Stubber), the push command
lines, and that the pushed name is the one the SDK resolves by default."""

import base64
from pathlib import Path

import boto3
import pytest
from botocore.stub import ANY, Stubber
from shoal.containers import builder as builders
from shoal.containers import matrix, push, render
from shoal.errors import BuildError

ACCOUNT = "123456789012"
REGISTRY = f"{ACCOUNT}.dkr.ecr.us-west-2.amazonaws.com"
PASSWORD = "eyJwYXlsb2FkIjoiZmFrZS1lY3ItcGFzc3dvcmQifQ"
VFS = builders.Buildah(storage_driver="vfs")
OPTIONS = render.BuildOptions("pytorch", "1.13.1", "gpu")


def auth_reply():
    token = base64.b64encode(f"AWS:{PASSWORD}".encode()).decode()
    return {"authorizationData": [{"authorizationToken": token,
                                   "proxyEndpoint": f"https://{REGISTRY}"}]}


def repository(name, mutability="MUTABLE"):
    return {"repositoryArn": f"arn:aws:ecr:us-west-2:{ACCOUNT}:repository/{name}",
            "registryId": ACCOUNT, "repositoryName": name,
            "repositoryUri": f"{REGISTRY}/{name}", "imageTagMutability": mutability}


@pytest.fixture
def ecr():
    client = boto3.client("ecr", region_name="us-west-2")
    with Stubber(client) as stub:
        client.stub = stub
        yield client
        stub.assert_no_pending_responses()


@pytest.fixture
def commands(monkeypatch):
    ran = []
    monkeypatch.setattr(builders, "run", lambda argv, stdin=None: ran.append((argv, stdin)))
    return ran


def test_authorization_token_decodes_to_a_login_that_hides_its_password():
    login = push.decode_authorization(auth_reply()["authorizationData"][0])
    assert (login.registry, login.username, login.password) == (REGISTRY, "AWS", PASSWORD)
    assert login.account == ACCOUNT
    assert PASSWORD not in repr(login)


def test_existing_repository_is_not_created_again(ecr):
    name = "shoal-pytorch-training"
    ecr.stub.add_response("describe_repositories", {"repositories": [repository(name)]},
                          {"repositoryNames": [name], "registryId": ACCOUNT})
    assert push.ensure_repository(ecr, name, account=ACCOUNT)["repositoryName"] == name


def test_missing_repository_is_created_with_scan_on_push_and_chosen_mutability(ecr):
    name = "shoal-tensorflow-training"
    ecr.stub.add_client_error("describe_repositories", "RepositoryNotFoundException",
                              expected_params={"repositoryNames": [name]})
    ecr.stub.add_response("create_repository", {"repository": repository(name, "IMMUTABLE")}, {
        "repositoryName": name, "imageTagMutability": "IMMUTABLE",
        "imageScanningConfiguration": {"scanOnPush": True},
        "encryptionConfiguration": {"encryptionType": "AES256"}})
    made = push.ensure_repository(ecr, name, immutable_tags=True)
    assert made["imageTagMutability"] == "IMMUTABLE"


def test_other_ecr_errors_are_build_errors(ecr):
    ecr.stub.add_client_error("describe_repositories", "AccessDeniedException")
    with pytest.raises(BuildError, match="DescribeRepositories failed"):
        push.ensure_repository(ecr, "shoal-pytorch-training")
    ecr.stub.add_client_error("get_authorization_token", "AccessDeniedException")
    with pytest.raises(BuildError, match="GetAuthorizationToken failed"):
        push.ecr_login(ecr)


def test_push_to_ecr_uses_the_sdk_default_name_and_keeps_the_password_off_argv(ecr, commands):
    ecr.stub.add_response("get_authorization_token", auth_reply(), {})
    ecr.stub.add_client_error("describe_repositories", "RepositoryNotFoundException",
                              expected_params={"repositoryNames": ["shoal-pytorch-training"],
                                               "registryId": ACCOUNT})
    ecr.stub.add_response("create_repository", {"repository": repository("shoal-pytorch-training")},
                          {"repositoryName": "shoal-pytorch-training", "registryId": ACCOUNT,
                           "imageTagMutability": "MUTABLE", "imageScanningConfiguration": ANY,
                           "encryptionConfiguration": ANY})
    uri = push.push_image(OPTIONS, ecr=ecr, builder="buildah", buildah=VFS)

    sdk_default = matrix.image_uri(matrix.find("pytorch", "1.13.1"), "gpu", ACCOUNT, "us-west-2")
    assert uri == sdk_default == f"{REGISTRY}/shoal-pytorch-training:1.13.1-gpu-py39"
    (login, login_stdin), (push_argv, push_stdin) = commands
    assert login[:3] == ["buildah", "--storage-driver", "vfs"] and "login" in login
    assert login[-2:] == ["--password-stdin", REGISTRY] and login_stdin == PASSWORD
    authfile = login[login.index("--authfile") + 1]
    assert push_argv[-2:] == [OPTIONS.local_name, f"docker://{uri}"]
    assert push_argv[push_argv.index("--authfile") + 1] == authfile
    assert push_stdin is None
    assert all(PASSWORD not in arg for argv, _ in commands for arg in argv)
    assert not Path(authfile).parent.exists()  # the private auth directory is gone


def test_docker_login_tag_and_push_commands():
    assert push.login_command("docker", REGISTRY) == [
        "docker", "login", "--username", "AWS", "--password-stdin", REGISTRY]
    assert push.push_commands("docker", "localhost/a:1", f"{REGISTRY}/a:1") == [
        ["docker", "tag", "localhost/a:1", f"{REGISTRY}/a:1"], ["docker", "push", f"{REGISTRY}/a:1"]]
    with pytest.raises(BuildError, match="needs buildah"):
        push.push_commands("docker", "localhost/a:1", "oci:/tmp/x:1")


def test_local_destinations(tmp_path, commands):
    where = push.push_image(OPTIONS, dest=f"oci:{tmp_path}/layout", builder="buildah", buildah=VFS)
    assert where == f"oci:{tmp_path}/layout:1.13.1-gpu-py39"
    assert commands == [(["buildah", "--storage-driver", "vfs", "push", OPTIONS.local_name, where],
                         None)]
    assert push.parse_destination(f"dir:{tmp_path}") == push.Destination("dir", str(tmp_path))
    assert push.parse_destination(None) == push.Destination("ecr")


@pytest.mark.parametrize("bad", ["oci:", "s3://bucket/x", "docker://x", "tar:/x"])
def test_bad_destinations_are_refused(bad):
    with pytest.raises(BuildError, match="'dest' must be"):
        push.parse_destination(bad)


def test_an_ecr_push_needs_a_region(monkeypatch, commands):
    monkeypatch.delenv("AWS_DEFAULT_REGION", raising=False)
    with pytest.raises(BuildError, match="no AWS region"):
        push.push_image(OPTIONS, builder="buildah", buildah=VFS)
    assert commands == []


def test_region_reaches_the_ecr_client(monkeypatch, commands):
    made = {}

    def client(service, region_name=None):
        made.update(service=service, region=region_name)
        raise RuntimeError("stop here")

    monkeypatch.setattr(boto3, "client", client)
    with pytest.raises(RuntimeError, match="stop here"):
        push.push_image(OPTIONS, builder="buildah", buildah=VFS, region="eu-west-1")
    assert made == {"service": "ecr", "region": "eu-west-1"}
