"""Shoal's data-parallel TensorFlow 2 API: the ``smdistributed.dataparallel.tensorflow``
surface over Shoal's collective core.

    import shoal.dataparallel.tensorflow as sdp
    sdp.init()
    opt = tf.keras.optimizers.Adam(0.001 * sdp.size())
    with tf.GradientTape() as tape:
        loss = loss_fn(labels, model(images, training=True))
    tape = sdp.DistributedGradientTape(tape)
    grads = tape.gradient(loss, model.trainable_variables)   # averaged across ranks
    opt.apply_gradients(zip(grads, model.trainable_variables))
    if first_batch:
        sdp.broadcast_variables(model.variables, root_rank=0)
        sdp.broadcast_variables(opt.variables, root_rank=0)

Keras 3 optimizers list their variables in the ``variables`` property (Keras 2 scripts call
``opt.variables()``). Collectives run through ``tf.numpy_function`` (eagerly and in ``tf.function``, not in XLA
compiled graphs). IndexedSlices gradients (embeddings) are gathered from every rank, or
densified with ``sparse_as_dense=True``. Supported reduction dtypes: float16, bfloat16,
float32, float64, int32, int64. ``new_group(ranks)`` gives a communicator over some ranks for
the collectives' ``group=`` argument.
"""

from .collectives import (
    allgather,
    allreduce,
    broadcast,
    grouped_allreduce,
    grouped_broadcast,
    oob_allreduce,
    overlap,
    sparse_allreduce,
)
from .compression import Compression, FP16Compression, NoneCompression
from .gradient_tape import DistributedGradientTape
from .optimizer import DistributedOptimizer
from .reduce_op import ReduceOp
from .topology import (
    init,
    is_initialized,
    local_rank,
    local_size,
    new_group,
    rank,
    shutdown,
    size,
)
from .variables import BroadcastGlobalVariablesHook, broadcast_global_variables, broadcast_variables

__all__ = [
    "BroadcastGlobalVariablesHook",
    "Compression",
    "DistributedGradientTape",
    "DistributedOptimizer",
    "FP16Compression",
    "NoneCompression",
    "ReduceOp",
    "allgather",
    "allreduce",
    "broadcast",
    "broadcast_global_variables",
    "broadcast_variables",
    "grouped_allreduce",
    "grouped_broadcast",
    "init",
    "is_initialized",
    "local_rank",
    "local_size",
    "new_group",
    "oob_allreduce",
    "overlap",
    "rank",
    "shutdown",
    "size",
    "sparse_allreduce",
]
