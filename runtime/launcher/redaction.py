"""Keeping secrets out of logs and failure files.

Names that look like credentials (``password``, ``token``, ``secret``, ``api_key``, ...)
have their values replaced with ``****`` wherever the launcher prints a mapping or a
command line; whole environments are never printed, only their keys.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

REDACTED = "****"

_SECRET_NAME = re.compile(
    r"(pass(word|wd)?|secret|token|credential|creds|private|api[_-]?key|access[_-]?key|"
    r"auth|(^|[_-])key$)",
    re.IGNORECASE,
)


def is_secret_name(name: str) -> bool:
    return bool(_SECRET_NAME.search(name))


def redact_mapping(mapping: Mapping[str, object]) -> dict[str, object]:
    return {k: (REDACTED if is_secret_name(str(k)) else v) for k, v in mapping.items()}


def _redact_assignment(token: str) -> str:
    name, sep, _ = token.partition("=")
    if sep and is_secret_name(name.lstrip("-")):
        return f"{name}={REDACTED}"
    return token


def redact_argv(argv: Sequence[str]) -> list[str]:
    """Hide the value after a secret-looking ``--flag`` and in ``NAME=value`` tokens."""
    out: list[str] = []
    hide_next = False
    for token in argv:
        if hide_next:
            out.append(REDACTED)
            hide_next = False
            continue
        if token.startswith("-") and "=" not in token and is_secret_name(token.lstrip("-")):
            hide_next = True
            out.append(token)
            continue
        out.append(_redact_assignment(token))
    return out
