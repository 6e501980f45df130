"""The reduction operations of the TensorFlow API (``ReduceOp.AVERAGE`` is the default)."""

from __future__ import annotations

import enum

from shoal.errors import ValidationError


class ReduceOp(enum.Enum):
    """How tensors combine across ranks; the value is the core's op name."""

    AVERAGE = "average"
    SUM = "sum"
    MIN = "min"
    MAX = "max"


def parse_op(op: ReduceOp | None) -> ReduceOp:
    """``None`` means ``AVERAGE``, as in the closed library; anything else must be a ReduceOp."""
    if op is None:
        return ReduceOp.AVERAGE
    if not isinstance(op, ReduceOp):
        names = ", ".join(f"ReduceOp.{member.name}" for member in ReduceOp)
        raise ValidationError(f"'op' must be one of {names} (got {op!r})")
    return op
