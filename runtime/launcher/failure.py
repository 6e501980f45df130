"""``output/success`` and ``output/failure``.

The failure text leads with the root cause (host, rank, exit code or signal, and the
exception line of the failing rank's Python traceback, else its last line), then keeps the training toolkit's ``ExecuteUserScriptError`` block
(``ExitCode``, ``ErrorMessage``, ``Command``) that tools parse, and fits in the 1024
characters that ``DescribeTrainingJob`` returns as ``FailureReason``: the error lines and
the command are shortened first, the root cause last. Secret-looking values are redacted.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from shoal.launcher.paths import JobPaths
from shoal.launcher.redaction import redact_argv
from shoal.launcher.supervisor import Outcome
from shoal.launcher.tracebacks import exception_line

LIMIT = 1024
ERROR_LINES = 6
_ELLIPSIS = "..."


def _clip(text: str, budget: int, *, keep_end: bool = False) -> str:
    if len(text) <= budget:
        return text
    if budget <= len(_ELLIPSIS):
        return text[:max(budget, 0)]
    cut = budget - len(_ELLIPSIS)
    return _ELLIPSIS + text[-cut:] if keep_end else text[:cut] + _ELLIPSIS


def _failing_tail(outcome: Outcome) -> Sequence[str]:
    rank = outcome.failure.rank if outcome.failure else None
    lines = outcome.rank_tails.get(rank) if rank is not None else None
    return lines or outcome.tail


def error_lines(outcome: Outcome) -> list[str]:
    """The failing rank's last meaningful lines, else the job's."""
    lines = [ln for ln in _failing_tail(outcome) if ln.strip()]
    lines = [ln for ln in lines if not ln.lstrip().startswith("SHOAL_RANK_FAILED")]
    return lines[-ERROR_LINES:]


def root_cause(outcome: Outcome) -> str:
    if outcome.host_lost:  # what the ranks saw then is its echo
        return outcome.host_lost
    f = outcome.failure
    if outcome.stopped_by and (f is None or f.signal in ("SIGTERM", "SIGKILL")):
        return f"Training stopped by {outcome.stopped_by}."
    if f is None:
        return f"Training process exited with code {outcome.returncode}."
    how = f"was killed by {f.signal}" if f.signal else f"exited with code {f.exit_code}"
    if f.exit_code is None and not f.signal:
        how = "aborted"
    where = f" on host {f.host}" if f.host else ""
    return f"Rank {f.rank}{where} {how}."


def failure_message(outcome: Outcome, last_error: str | None = None) -> str:
    """The failure file's text for a failed outcome (at most ``LIMIT`` characters)."""
    cause = root_cause(outcome)
    errors = error_lines(outcome)
    last = last_error or exception_line(_failing_tail(outcome)) or (
        errors[-1].strip() if errors else "")
    if outcome.host_lost:
        last = ""  # the ranks' errors then only echo the loss
    head = cause + (f" {last}" if last else "")
    head = _clip(head, 500)
    command = " ".join(redact_argv(outcome.command))
    block = "ExecuteUserScriptError:\nExitCode {code}\nErrorMessage \"{msg}\"\nCommand \"{cmd}\""
    fixed = len(head) + 1 + len(block.format(code=outcome.returncode, msg="", cmd=""))
    budget = LIMIT - fixed
    msg_budget = max(0, min(len("\n".join(errors)), budget * 2 // 3))
    msg = _clip("\n".join(errors), msg_budget, keep_end=True)
    cmd = _clip(command, max(0, budget - len(msg)))
    text = head + "\n" + block.format(code=outcome.returncode, msg=msg, cmd=cmd)
    return text[:LIMIT]


def startup_failure_message(error: BaseException, command: Sequence[str] = ()) -> str:
    """The failure text when the job could not start (bad config, code, install)."""
    cause = f"{type(error).__name__}: {error}"
    text = _clip(cause, 700) + "\nExitCode 1"
    if command:
        text += "\nCommand \"" + " ".join(redact_argv(command)) + "\""
    return text[:LIMIT]


def write_success(paths: JobPaths) -> None:
    os.makedirs(paths.output_dir, exist_ok=True)
    with open(paths.success_file, "w"):
        pass


def write_failure(paths: JobPaths, text: str) -> None:
    """Write the failure file unless one exists (the first failure is the root cause)."""
    os.makedirs(paths.output_dir, exist_ok=True)
    try:
        # exclusive: the launcher's thread that declares a host lost may race the main one
        with open(paths.failure_file, "x") as f:
            f.write(text[:LIMIT])
    except FileExistsError:
        return
