"""``DistributedOptimizer``: an optimizer that averages gradients across ranks before it
applies them, for Keras (``model.compile(optimizer=...)``/``model.fit``) and for TF1
``tf.compat.v1.train.Optimizer`` (``tf.estimator``-style graphs).

A Keras optimizer keeps its class name, config and state: the wrapper is a subclass that
reduces the gradients in ``apply()``, and a saved model names the original optimizer.
Keras graphs compiled with XLA cannot hold the collectives: compile with
``jit_compile=False`` on accelerators (CPU-only Keras never compiles with XLA by default).
"""

from __future__ import annotations

import keras
import tensorflow as tf
from shoal.errors import ValidationError

from .compression import Compression
from .gradients import DEFAULT_BUCKET_CAP_MB, ReduceSettings, reduce_gradients, reject_unsupported
from .reduce_op import ReduceOp

_SUBCLASSES: dict[type, type] = {}


def DistributedOptimizer(optimizer, name: str | None = None, use_locking: bool = False,  # noqa: N802
                         device_dense=None, device_sparse=None, compression=Compression.none,
                         sparse_as_dense: bool = False, op: ReduceOp | None = ReduceOp.AVERAGE,
                         bucket_cap_mb: float = DEFAULT_BUCKET_CAP_MB):
    """Wraps ``optimizer`` so that it applies gradients averaged across ranks.

    A Keras optimizer is returned itself, wrapped in place; ``name`` and ``use_locking``
    apply to TF1 optimizers, which get a wrapper object.
    """
    reject_unsupported(device_dense=device_dense, device_sparse=device_sparse)
    settings = ReduceSettings(op=op, compression=compression, sparse_as_dense=sparse_as_dense,
                              bucket_cap_mb=bucket_cap_mb)
    if isinstance(optimizer, keras.optimizers.Optimizer):
        return _wrap_keras(optimizer, settings)
    if isinstance(optimizer, tf.compat.v1.train.Optimizer):
        return _V1DistributedOptimizer(optimizer, settings, name=name, use_locking=use_locking)
    raise ValidationError(
        "'optimizer' must be a keras.optimizers.Optimizer or a tf.compat.v1.train.Optimizer "
        f"(got {type(optimizer).__name__})"
    )


def _keras_subclass(cls: type) -> type:
    """``cls`` with gradients reduced in ``apply()``; same name and module, for saving."""
    if cls not in _SUBCLASSES:
        def apply(self, grads, trainable_variables=None):
            grads = reduce_gradients(list(grads), self._shoal_settings)
            return super(subclass, self).apply(grads, trainable_variables)

        subclass = type(cls.__name__, (cls,), {"apply": apply, "__module__": cls.__module__,
                                               "__qualname__": cls.__qualname__,
                                               "_shoal_distributed": True})
        _SUBCLASSES[cls] = subclass
    return _SUBCLASSES[cls]


def _wrap_keras(optimizer, settings: ReduceSettings):
    if getattr(optimizer, "_shoal_distributed", False):
        raise ValidationError("the optimizer is already a DistributedOptimizer")
    optimizer.__class__ = _keras_subclass(type(optimizer))
    optimizer._shoal_settings = settings
    return optimizer


class _V1DistributedOptimizer(tf.compat.v1.train.Optimizer):
    """A TF1 optimizer whose ``compute_gradients`` returns gradients reduced across ranks."""

    def __init__(self, optimizer, settings: ReduceSettings, name=None, use_locking=False):
        name = name or f"Distributed{type(optimizer).__name__}"
        super().__init__(name=name, use_locking=use_locking)
        self._optimizer = optimizer
        self._settings = settings

    def compute_gradients(self, *args, **kwargs):
        grads_and_vars = self._optimizer.compute_gradients(*args, **kwargs)
        grads = reduce_gradients([g for g, _ in grads_and_vars], self._settings)
        return list(zip(grads, [v for _, v in grads_and_vars]))

    def apply_gradients(self, *args, **kwargs):
        return self._optimizer.apply_gradients(*args, **kwargs)

    def get_slot(self, *args, **kwargs):
        return self._optimizer.get_slot(*args, **kwargs)

    def get_slot_names(self, *args, **kwargs):
        return self._optimizer.get_slot_names(*args, **kwargs)

    def variables(self, *args, **kwargs):
        return self._optimizer.variables(*args, **kwargs)
