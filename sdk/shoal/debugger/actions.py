"""What a debug rule does when it fires (``rule_configs.ActionList(StopTraining(), Email(...))``).

The rule receives them as its ``action_json`` parameter, in the string form Debugger's rule
container reads: a JSON list of objects whose quotes are backslash-escaped.
"""

from __future__ import annotations

import re

from shoal.errors import DebuggerError

_JOB_PREFIX = re.compile(r"[A-Za-z0-9\-]+")
_EMAIL = re.compile(r"[a-z0-9]+@\w+\.\w{2,3}")
_PHONE = re.compile(r"\+\d{1,15}")


def _matching(pattern: re.Pattern, what: str, value, hint: str) -> str:
    if not isinstance(value, str) or not pattern.fullmatch(value):
        raise DebuggerError(f"'{what}' must be {hint} (got {value!r})")
    return value


class Action:
    """One action; its parameters are sent followed by the action's lowercase class name."""

    def __init__(self, **parameters):
        self.action_parameters = {**{k: v for k, v in parameters.items() if v is not None},
                                  "name": type(self).__name__.lower()}

    def serialize(self) -> str:
        return "{" + ", ".join(f'\\"{k}\\": \\"{v}\\"' for k, v in self.action_parameters.items()) + "}"

    def with_job_prefix(self, job_name: str) -> Action:
        return self


class StopTraining(Action):
    """Stop the training jobs whose names start with ``training_job_prefix`` (default: this job)."""

    def __init__(self, training_job_prefix: str | None = None):
        if training_job_prefix is not None:
            _matching(_JOB_PREFIX, "training_job_prefix", training_job_prefix,
                      "letters, numbers and hyphens")
        super().__init__(training_job_prefix=training_job_prefix)

    def with_job_prefix(self, job_name: str) -> Action:
        if "training_job_prefix" in self.action_parameters:
            return self
        resolved = StopTraining()
        resolved.action_parameters = {**self.action_parameters, "training_job_prefix": job_name}
        return resolved


class Email(Action):
    """Send an e-mail (through SNS) when the rule fires."""

    def __init__(self, email_address: str):
        _matching(_EMAIL, "email_address", email_address, "an address like username@domain.com")
        super().__init__(endpoint=email_address)


class SMS(Action):
    """Send a text message (through SNS) when the rule fires."""

    def __init__(self, phone_number: str):
        _matching(_PHONE, "phone_number", phone_number, "+ and up to 15 digits")
        super().__init__(endpoint=phone_number)


class ActionList:
    """Several actions for one rule."""

    def __init__(self, *actions: Action):
        if not all(isinstance(a, Action) for a in actions):
            raise DebuggerError(f"'actions' must be Action objects (got {actions!r})")
        self.actions = tuple(actions)

    def with_job_prefix(self, job_name: str) -> ActionList:
        return ActionList(*(a.with_job_prefix(job_name) for a in self.actions))

    def serialize(self) -> str:
        return "[" + ", ".join(a.serialize() for a in self.actions) + "]"


def is_valid_action_object(actions) -> bool:
    return isinstance(actions, (Action, ActionList))
