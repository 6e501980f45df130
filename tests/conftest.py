"""Suite-wide fixtures: no test may reach real AWS."""

import os

import pytest

FAKE_REGION = "us-west-2"


@pytest.fixture(autouse=True)
def fake_aws_credentials(monkeypatch, tmp_path_factory):
    """Clear every AWS_* variable and set fake credentials and a fake config."""
    for key in list(os.environ):
        if key.startswith("AWS_"):
            monkeypatch.delenv(key, raising=False)
    home = tmp_path_factory.mktemp("aws-home")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_SESSION_TOKEN", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", FAKE_REGION)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(home / "config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(home / "credentials"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
