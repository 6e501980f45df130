"""What ``shoal serve --detach`` prints for ``eval``, as a POSIX shell reads it: the endpoint,
a region and placeholder keys unless the shell has its own, and never a signing secret."""

from __future__ import annotations

import subprocess

import pytest
from click.testing import CliRunner
from shoal.server.command import environment, serve

URL = "http://127.0.0.1:8123"
SHOWN = ("AWS_ENDPOINT_URL_SAGEMAKER", "AWS_ENDPOINT_URL_CLOUDWATCH_LOGS",
         "AWS_ENDPOINT_URL_CLOUDWATCH", "AWS_ENDPOINT_URL_SAGEMAKER_RUNTIME",
         "AWS_DEFAULT_REGION",
         "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "SHOAL_SERVE_PID")


def evaluated(lines: list[str], **shell) -> dict[str, str]:
    """The variables after ``eval`` of ``lines`` in bash started with ``shell``'s variables."""
    script = "\n".join(lines) + "\n" + "".join(f'printf "%s\\n" "${name}"\n' for name in SHOWN)
    done = subprocess.run(["bash", "-c", script], env={"PATH": "/usr/bin:/bin", **shell},
                          capture_output=True, text=True, check=True)
    return dict(zip(SHOWN, done.stdout.splitlines()))


def test_a_shell_without_aws_gets_the_endpoint_a_region_and_placeholder_keys():
    assert evaluated(environment(URL, "eu-west-1", None, 4242)) == {
        "AWS_ENDPOINT_URL_SAGEMAKER": URL, "AWS_ENDPOINT_URL_CLOUDWATCH_LOGS": URL,
        "AWS_ENDPOINT_URL_CLOUDWATCH": URL, "AWS_ENDPOINT_URL_SAGEMAKER_RUNTIME": URL,
        "AWS_DEFAULT_REGION": "eu-west-1", "AWS_ACCESS_KEY_ID": "local",
        "AWS_SECRET_ACCESS_KEY": "local", "SHOAL_SERVE_PID": "4242"}


def test_a_region_and_keys_the_shell_has_are_kept():
    mine = {"AWS_DEFAULT_REGION": "ap-south-1", "AWS_ACCESS_KEY_ID": "AKIDMINE",
            "AWS_SECRET_ACCESS_KEY": "mine"}
    got = evaluated(environment(URL, "us-east-1", None, 1), **mine)
    assert {k: got[k] for k in mine} == mine
    assert got["AWS_ENDPOINT_URL_SAGEMAKER"] == URL


def test_a_signing_server_is_given_its_key_and_its_secret_by_name_only():
    lines = environment(URL, "us-east-1", "AKIDSHOAL", 1)
    assert not any("s3cr3t" in line for line in lines)
    got = evaluated(lines, SHOAL_SERVE_SECRET_ACCESS_KEY="s3cr3t", AWS_ACCESS_KEY_ID="AKIDOTHER")
    assert (got["AWS_ACCESS_KEY_ID"], got["AWS_SECRET_ACCESS_KEY"]) == ("AKIDSHOAL", "s3cr3t")


@pytest.mark.parametrize("region", ["us-east-1", "us-gov-west-1", "cn-north-1"])
def test_region_names_are_accepted(region):
    assert f"${{AWS_DEFAULT_REGION:-{region}}}" in environment(URL, region, None, 1)[2]


def test_a_region_that_is_no_region_name_is_refused_before_anything_starts():
    # it is written into the printed shell lines: nothing but a region's characters may reach them
    result = CliRunner().invoke(serve, ["--detach", "--region", 'x"; rm -rf ~; "'])
    assert result.exit_code == 2 and "not a region name" in result.output
