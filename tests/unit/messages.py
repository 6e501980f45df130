"""How the unit tests check an error's text: equal to the expected message, or, when that
starts with ``^``, matching it as a regular expression."""

from __future__ import annotations

import re


def assert_message(text: str, message: str) -> str:
    if message.startswith("^"):
        assert re.search(message, text), text
    else:
        assert text == message
    return text
