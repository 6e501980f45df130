"""Secret detection for hyperparameters and environment variables, and redaction of
requests before they are printed.

A ``CreateTrainingJob`` request is stored by the service and shown in the console,
in ``DescribeTrainingJob`` and in logs; a credential put there leaks. Shoal refuses
secret-looking values with ``SecretValueError`` unless allowed (the estimator's
``allow_secrets=True``, a job file's ``allow_secrets: true``, ``shoal run --allow-secrets``),
and never includes the value itself in a message.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Mapping

import attrs

from shoal.errors import SecretValueError

REDACTED = "***"

# What a value looks like when it is a credential, whatever its key is called.
VALUE_PATTERNS: dict[str, re.Pattern] = {
    "AWS access key id": re.compile(r"(?<![A-Z0-9])(AKIA|ASIA)[A-Z0-9]{16}(?![A-Z0-9])"),
    "private key": re.compile(r"-----BEGIN ([A-Z0-9]+ )*PRIVATE KEY( BLOCK)?-----"),
    "GitHub token": re.compile(r"\b(gh[pousr]_[A-Za-z0-9]{36,}|github_pat_[A-Za-z0-9_]{22,})"),
    "Slack token": re.compile(r"\bxox[abposr]-[A-Za-z0-9-]{10,}"),
    "Slack webhook": re.compile(r"https://hooks\.slack\.com/services/[A-Za-z0-9/]+"),
    "password in a URL": re.compile(r"[a-z][a-z0-9+.-]*://[^/\s:@]+:[^/\s@]+@"),
}
# An AWS secret access key: exactly 40 characters of base64 with mixed case and a digit.
_AWS_SECRET = re.compile(r"(?=.*[a-z])(?=.*[A-Z])(?=.*[0-9])[A-Za-z0-9/+]{40}")

# Key names that announce a secret; matched against the key's words, so that
# ``max_tokens`` or ``tokenizer`` are not taken for ``token``.
SECRET_WORDS = frozenset({"password", "passwd", "pwd", "secret", "token", "apikey",
                          "credential", "credentials", "passphrase"})
SECRET_PAIRS = frozenset({("api", "key"), ("private", "key"), ("access", "key"),
                          ("secret", "key"), ("auth", "token")})


@attrs.frozen
class Finding:
    """One secret-looking entry: where (``hyperparameters``/``environment``), which key, what kind."""

    where: str
    key: str
    kind: str

    def __str__(self) -> str:
        return f"{self.where}[{self.key!r}] ({self.kind})"


def key_words(key: str) -> list[str]:
    """``"hfApiKey"`` -> ``["hf", "api", "key"]``; ``"DB_PASSWORD"`` -> ``["db", "password"]``."""
    spaced = re.sub(r"([a-z0-9])([A-Z])", r"\1 \2", str(key))
    return [w for w in re.split(r"[^A-Za-z0-9]+", spaced.lower()) if w]


def secret_key_name(key: str) -> bool:
    words = key_words(key)
    return bool(SECRET_WORDS.intersection(words)) or any(
        pair in SECRET_PAIRS for pair in zip(words, words[1:]))


def _plain_scalar(value) -> bool:
    """Numbers, booleans and null (also JSON-encoded) carry no secret."""
    if value is None or isinstance(value, (bool, int, float)):
        return True
    try:
        return isinstance(value, str) and not isinstance(json.loads(value), str)
    except ValueError:
        return False


def value_kind(value) -> str | None:
    """The kind of credential a value looks like, or None."""
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    for kind, regex in VALUE_PATTERNS.items():
        if regex.search(text):
            return kind
    bare = text.strip('"')
    if _AWS_SECRET.fullmatch(bare):
        return "AWS secret access key"
    return None


def entry_kind(key: str, value) -> str | None:
    """Why ``key=value`` looks secret, or None."""
    kind = value_kind(value)
    if kind:
        return kind
    if secret_key_name(key) and not _plain_scalar(value) and str(value).strip('"'):
        return "secret-looking key name"
    return None


def find_secrets(mapping: Mapping | None, where: str) -> list[Finding]:
    """Every secret-looking entry of a hyperparameter or environment mapping."""
    found = []
    for key, value in (mapping or {}).items():
        kind = entry_kind(str(key), value)
        if kind:
            found.append(Finding(where, str(key), kind))
    return found


# The three places a user can say "send them anyway".
ALLOW_HINT = ("the estimator's allow_secrets=True, 'allow_secrets: true' in the job file, "
              "or 'shoal run --allow-secrets'")


def check_no_secrets(hyperparameters: Mapping | None = None, environment: Mapping | None = None,
                     allow: bool = False) -> None:
    """Raise one ``SecretValueError`` naming every secret-looking key of both mappings (never
    a value) unless ``allow``."""
    if allow:
        return
    found = find_secrets(hyperparameters, "hyperparameters") + find_secrets(
        environment, "environment")
    if found:
        listed = ", ".join(str(f) for f in found)
        raise SecretValueError(
            f"refusing to send secret-looking values: {listed}; the request is stored and "
            "shown by the service. Pass them through a secrets manager, or send them anyway "
            f"with {ALLOW_HINT}")


def _redact_value(value):
    if isinstance(value, str) and value_kind(value):
        return REDACTED
    if isinstance(value, dict):
        return {k: _redact_entry(k, v) for k, v in value.items()}
    if isinstance(value, list):
        return [_redact_value(v) for v in value]
    return value


def _redact_entry(key, value):
    if isinstance(value, (str, int, float)) and entry_kind(str(key), value):
        return REDACTED
    return _redact_value(value)


def redact(request: Mapping) -> dict:
    """A copy of a request with every secret-looking value replaced by ``***``."""
    return _redact_value(copy.deepcopy(dict(request)))
