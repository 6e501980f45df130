"""``DistributedGradientTape``: a ``tf.GradientTape`` whose ``gradient()`` returns gradients
averaged across ranks (one fused collective for all dense gradients)."""

from __future__ import annotations

import tensorflow as tf

from .compression import Compression
from .gradients import ReduceSettings, reduce_gradients, reject_unsupported
from .reduce_op import ReduceOp


class DistributedGradientTape:
    """Wraps a ``tf.GradientTape``; everything but ``gradient()`` is the wrapped tape's.

    Wrap after recording (``tape = DistributedGradientTape(tape)``) or around it
    (``with DistributedGradientTape(tf.GradientTape()) as tape:``).
    """

    def __init__(self, gradtape: tf.GradientTape, device_dense=None, device_sparse=None,
                 compression=Compression.none, sparse_as_dense: bool = False,
                 op: ReduceOp | None = ReduceOp.AVERAGE, bucket_cap_mb: float | None = None):
        reject_unsupported(device_dense=device_dense, device_sparse=device_sparse)
        if not isinstance(gradtape, tf.GradientTape):
            raise TypeError(f"'gradtape' must be a tf.GradientTape (got {type(gradtape).__name__})")
        extra = {} if bucket_cap_mb is None else {"bucket_cap_mb": bucket_cap_mb}
        self._settings = ReduceSettings(op=op, compression=compression,
                                        sparse_as_dense=sparse_as_dense, **extra)
        self._tape = gradtape

    def gradient(self, target, sources, output_gradients=None,
                 unconnected_gradients=tf.UnconnectedGradients.NONE):
        """The wrapped tape's gradients, reduced across ranks (same structure as ``sources``)."""
        grads = self._tape.gradient(target, sources, output_gradients=output_gradients,
                                    unconnected_gradients=unconnected_gradients)
        return reduce_gradients(grads, self._settings)

    def __enter__(self):
        self._tape.__enter__()
        return self

    def __exit__(self, *exc_info):
        return self._tape.__exit__(*exc_info)

    def __getattr__(self, name):
        # Only reached for names this wrapper lacks: watch, stop_recording, jacobian, ...
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self._tape, name)
