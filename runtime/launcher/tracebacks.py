"""Reading Python tracebacks out of a rank's output lines.

Both the supervisor (which rank is the root cause) and the failure file (which exception
heads it) read them. A rank's stdout and stderr arrive through separate pipes, and
torch.distributed's excepthook prefixes each line of a traceback with ``[rankN]: ``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

_TRACEBACK = "Traceback (most recent call last):"
_FRAME = re.compile(r'^\s+File "[^"]*", line \d+')
_RANK_PREFIX = re.compile(r"^\[rank\d+\]: ?")
_EXCEPTION = re.compile(r"^[A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt|Warning|Failure|Fault)"
                        r"(?::\s.*)?$")  # fmt: skip
# Errors a rank raises because another rank failed (a peer that died, a pipeline peer
# whose module raised): the other rank, not this one, is the root cause.
RELAY_ERRORS = ("PeerLostError", "SMPPeerError")
_RELAY = re.compile(r"^(?:[A-Za-z_]\w*\.)*(?:" + "|".join(RELAY_ERRORS) + r")(?::|$)")


def _plain(lines: Sequence[str]) -> list[str]:
    return [_RANK_PREFIX.sub("", ln.rstrip()) for ln in lines]


def exception_line(lines: Sequence[str]) -> str | None:
    """The exception line (``ValueError: boom``) of the last Python traceback in ``lines``.

    A line the script printed before raising can land after (or inside) the traceback: the
    exception line is taken by its shape, after the traceback's start (its header, or its
    first frame once the header has scrolled out of the tail).
    """
    lines = _plain(lines)
    starts = [i for i, ln in enumerate(lines) if ln.strip() == _TRACEBACK]
    start = starts[-1] if starts else next(
        (i for i, ln in enumerate(lines) if _FRAME.match(ln)), None)
    if start is None:
        return None
    after = [ln for ln in lines[start + 1:] if ln and not ln[0].isspace()]
    named = [ln for ln in after if _EXCEPTION.match(ln)]
    if named:
        return named[0]
    return after[0] if after else None


def relays_a_failure(lines: Sequence[str]) -> bool:
    """Whether the rank raised one of ``RELAY_ERRORS``: it failed because another did."""
    return any(_RELAY.match(ln) for ln in _plain(lines))
