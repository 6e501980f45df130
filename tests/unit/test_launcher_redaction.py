"""Secret-looking values never reach logs or failure files."""

from shoal.launcher.redaction import REDACTED, is_secret_name, redact_argv, redact_mapping


def test_secret_names():
    for name in ("password", "db_passwd", "API_KEY", "aws_secret_access_key", "hf_token",
                 "auth", "private_key", "key", "credentials"):  # fmt: skip
        assert is_secret_name(name), name
    for name in ("lr", "epochs", "monkey", "keyboard_layout", "batch-size"):
        assert not is_secret_name(name), name


def test_redact_argv():
    argv = ["python", "train.py", "--password", "hunter2", "--lr", "0.1", "-x",
            "WANDB_API_KEY=abc", "--hf_token=xyz", "-x", "PATH"]  # fmt: skip
    assert redact_argv(argv) == ["python", "train.py", "--password", REDACTED, "--lr", "0.1",
                                 "-x", f"WANDB_API_KEY={REDACTED}", f"--hf_token={REDACTED}",
                                 "-x", "PATH"]  # fmt: skip


def test_redact_mapping():
    assert redact_mapping({"token": "t", "lr": 1}) == {"token": REDACTED, "lr": 1}
