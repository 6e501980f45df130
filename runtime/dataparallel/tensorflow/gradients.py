"""Gradient averaging shared by ``DistributedGradientTape`` and ``DistributedOptimizer``.

``ReduceSettings`` holds the user's choices, checked once; ``reduce_gradients`` reduces a
(nested) structure of gradients: every dense gradient goes into one fused allreduce op,
IndexedSlices are gathered (or densified with ``sparse_as_dense``), ``None`` stays ``None``.
"""

from __future__ import annotations

import attrs
import tensorflow as tf
from shoal.errors import ValidationError

from . import collectives
from .compression import Compression, parse_compression
from .reduce_op import ReduceOp, parse_op

DEFAULT_BUCKET_CAP_MB = 25


def _positive(instance, attribute, value):
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValidationError(f"'{attribute.name}' must be > 0 (got {value!r})")
    if int(value * 1024 * 1024) % 128:
        raise ValidationError(
            f"'{attribute.name}' * 1024 * 1024 must be a multiple of 128 bytes (got {value!r})"
        )


@attrs.frozen
class ReduceSettings:
    """How gradients are reduced across ranks."""

    op: ReduceOp = attrs.field(default=ReduceOp.AVERAGE, converter=parse_op)
    compression: object = attrs.field(default=Compression.none, converter=parse_compression)
    sparse_as_dense: bool = attrs.field(default=False, validator=attrs.validators.instance_of(bool))
    bucket_cap_mb: float = attrs.field(default=DEFAULT_BUCKET_CAP_MB, validator=_positive)

    @property
    def bucket_bytes(self) -> int:
        return int(self.bucket_cap_mb * 1024 * 1024)


def reject_unsupported(**arguments) -> None:
    """Device placement arguments of the closed library are not supported: say so."""
    for name, value in arguments.items():
        if value not in (None, ""):
            raise ValidationError(f"'{name}' is not supported (got {value!r})")


def reduce_gradients(gradients, settings: ReduceSettings):
    """The structure of ``gradients`` with every gradient reduced across ranks."""
    flat = tf.nest.flatten(gradients)
    out = list(flat)
    dense = []
    for index, grad in enumerate(flat):
        if grad is None:
            continue
        if isinstance(grad, tf.IndexedSlices):
            if not settings.sparse_as_dense:
                out[index] = collectives.sparse_allreduce(grad, settings.op, settings.compression)
                continue
            grad = tf.convert_to_tensor(grad)
        dense.append((index, grad))
    reduced = collectives.grouped_allreduce(
        [grad for _, grad in dense], op=settings.op, compression=settings.compression,
        bucket_bytes=settings.bucket_bytes,
    )
    for (index, _), value in zip(dense, reduced):
        out[index] = value
    return tf.nest.pack_sequence_as(gradients, out)
