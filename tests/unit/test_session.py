"""shoal.Session: clients, region, account, default bucket, retries, role expansion."""

import boto3
import pytest
from botocore.stub import Stubber
from moto import mock_aws
from shoal.errors import ValidationError
from shoal.session import LOCAL_REGION, Session, retry_config


def test_clients_get_standard_retries_unless_the_user_configured_some(monkeypatch):
    config = retry_config(boto3.Session(region_name="us-west-2"), max_attempts=7)
    assert config.retries == {"mode": "standard", "max_attempts": 7}
    session = Session(boto3.Session(region_name="us-west-2"))
    assert session.s3_client.meta.config.retries["mode"] == "standard"
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "3")
    assert retry_config(boto3.Session(region_name="us-west-2")) is None
    client = Session(boto3.Session(region_name="us-west-2")).s3_client
    assert client.meta.config.retries["total_max_attempts"] == 3


def test_retry_settings_in_the_config_file_are_respected(monkeypatch, tmp_path):
    config = tmp_path / "config"
    config.write_text("[default]\nretry_mode = adaptive\n")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(config))
    assert retry_config(boto3.Session(region_name="us-west-2")) is None


def test_account_is_asked_once_and_names_the_default_bucket():
    sts = boto3.client("sts", region_name="us-west-2")
    with Stubber(sts) as stub:
        stub.add_response("get_caller_identity", {"Account": "111122223333"})
        session = Session(boto3.Session(region_name="eu-west-1"), sts_client=sts)
        assert session.default_bucket() == "sagemaker-eu-west-1-111122223333"
        assert session.account_id() == "111122223333"  # no second call: the stub has none
        assert session.is_default_bucket("sagemaker-eu-west-1-111122223333")


def test_injected_clients_are_used_and_region_is_the_sessions():
    client = object()
    session = Session(boto3.Session(region_name="ap-south-1"), sagemaker_client=client,
                      default_bucket="mine")
    assert session.sagemaker_client is client
    assert (session.region, session.boto_region_name) == ("ap-south-1", "ap-south-1")
    assert session.default_bucket() == "mine"


def test_role_names_expand_through_iam():
    with mock_aws():
        iam = boto3.client("iam", region_name="us-east-1")
        arn = iam.create_role(RoleName="R", AssumeRolePolicyDocument="{}")["Role"]["Arn"]
        session = Session(boto3.Session(region_name="us-east-1"))
        assert session.expand_role("R") == arn
        assert session.expand_role("arn:aws:iam::1:role/x") == "arn:aws:iam::1:role/x"


def test_missing_region_is_an_error_except_in_local_mode(monkeypatch):
    monkeypatch.delenv("AWS_DEFAULT_REGION")
    with pytest.raises(ValidationError, match="no AWS region"):
        Session()
    assert Session(local_mode=True).region == LOCAL_REGION
