"""Secret detection and redaction."""

import pytest
from shoal.errors import SecretValueError
from shoal.secrets import (
    REDACTED,
    check_no_secrets,
    entry_kind,
    find_secrets,
    key_words,
    redact,
    secret_key_name,
)

PRIVATE_KEY = "-----BEGIN RSA PRIVATE KEY-----\nMIIEow...\n-----END RSA PRIVATE KEY-----"


@pytest.mark.parametrize("key, value, kind", [
    ("key_id", "AKIAIOSFODNN7EXAMPLE", "AWS access key id"),
    ("session", "ASIAY34FZKBOKMUTVV7A", "AWS access key id"),
    ("aws", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", "AWS secret access key"),
    ("cert", PRIVATE_KEY, "private key"),
    ("gh", "ghp_" + "a1B2" * 9, "GitHub token"),
    ("gh", "github_pat_" + "A" * 30, "GitHub token"),
    ("chat", "xoxb-1234567890-abcdefghij", "Slack token"),
    ("hook", "https://hooks.slack.com/services/T000/B000/XXXX", "Slack webhook"),
    ("db", "postgres://user:hunter2@db.example.com/x", "password in a URL"),
    ("db_password", "hunter2", "secret-looking key name"),
    ("HF_TOKEN", '"hf_abc"', "secret-looking key name"),
    ("openaiApiKey", "sk-123", "secret-looking key name"),
    ("client-secret", "abc", "secret-looking key name"),
])
def test_secret_kinds(key, value, kind):
    assert entry_kind(key, value) == kind


@pytest.mark.parametrize("key, value", [
    ("max_tokens", "512"),
    ("tokenizer", "bert-base-uncased"),
    ("learning_rate", "0.001"),
    ("commit", "da39a3ee5e6b4b0d3255bfef95601890afd80709"),  # sha1: lowercase hex only
    ("password", "1234"),  # numbers carry no secret
    ("api_key", ""),
    ("sagemaker_submit_directory", '"s3://b/job/source/sourcedir.tar.gz"'),
    ("url", "https://example.com/data"),
])
def test_ordinary_values_pass(key, value):
    assert entry_kind(key, value) is None


def test_key_words_split_case_and_separators():
    assert key_words("hfApiKey") == ["hf", "api", "key"]
    assert key_words("DB_PASSWORD") == ["db", "password"]
    assert secret_key_name("private-key") and not secret_key_name("keyboard")


def test_check_names_keys_never_values():
    with pytest.raises(SecretValueError) as caught:
        check_no_secrets(environment={"a": "AKIAIOSFODNN7EXAMPLE", "b": "1"})
    message = str(caught.value)
    assert "environment['a'] (AWS access key id)" in message
    assert "AKIAIOSFODNN7EXAMPLE" not in message
    assert "allow_secrets=True" in message


def test_every_secret_is_named_in_one_error_with_the_ways_to_allow_them():
    with pytest.raises(SecretValueError) as caught:
        check_no_secrets({"lr": "0.1", "api_key": "sk-live-123", "hf_token": '"hf_abc"'},
                         {"GITHUB_TOKEN": "ghp_" + "x1" * 18, "N": "4"})
    message = str(caught.value)
    assert ("hyperparameters['api_key'] (secret-looking key name), hyperparameters['hf_token'] "
            "(secret-looking key name), environment['GITHUB_TOKEN'] (GitHub token);") in message
    assert ("the estimator's allow_secrets=True, 'allow_secrets: true' in the job file, or "
            "'shoal run --allow-secrets'") in message
    assert not any(value in message for value in ("sk-live-123", "hf_abc", "ghp_"))


def test_allow_skips_the_check():
    check_no_secrets({"password": "x"}, {"DB_PASSWORD": "y"}, allow=True)
    assert [f.key for f in find_secrets({"password": "x", "n": 1}, "hyperparameters")] == ["password"]


def test_redact_replaces_only_secret_values_and_copies():
    request = {"TrainingJobName": "job", "HyperParameters": {"lr": "0.1", "token": '"abc"'},
               "Environment": {"KEY": "AKIAIOSFODNN7EXAMPLE", "N": "4"},
               "InputDataConfig": [{"ChannelName": "train", "S3Uri": "s3://b/x"}]}
    out = redact(request)
    assert out["HyperParameters"] == {"lr": "0.1", "token": REDACTED}
    assert out["Environment"] == {"KEY": REDACTED, "N": "4"}
    assert out["InputDataConfig"] == request["InputDataConfig"]
    assert request["Environment"]["KEY"] == "AKIAIOSFODNN7EXAMPLE"
