"""TensorFlow collectives: ``allreduce``, ``oob_allreduce``, ``broadcast``, ``allgather`` and
their grouped forms, usable eagerly and inside ``tf.function``.

Each collective is one ``tf.numpy_function`` (a stateful op, so ``tf.function`` keeps the
collectives in program order on every rank) over the numpy side in ``wire``. Grouped
reductions pack their tensors into one flat buffer per dtype (``fusion``) inside the graph,
so that a model's many small gradients cost one op and a few collectives. Graphs compiled
with XLA (``jit_compile=True``) cannot hold these ops. A failed collective raises Shoal's
error (``CollectiveTimeoutError``, ``PeerLostError``) eagerly; inside ``tf.function``,
TensorFlow raises a ``tf.errors.OpError`` whose message names it.
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence

import tensorflow as tf
from shoal.errors import ValidationError

from . import fusion, topology, wire
from .compression import Compression, parse_compression
from .reduce_op import ReduceOp, parse_op

REDUCIBLE = (tf.float16, tf.bfloat16, tf.float32, tf.float64, tf.int32, tf.int64)


def _check_reducible(tensor: tf.Tensor) -> None:
    if tensor.dtype not in REDUCIBLE:
        names = ", ".join(d.name for d in REDUCIBLE)
        raise ValidationError(f"allreduce dtype must be one of {names} (got {tensor.dtype.name})")


def _check_movable(tensor: tf.Tensor) -> None:
    if tensor.dtype in (tf.string, tf.resource, tf.variant):
        raise ValidationError(f"cannot send a {tensor.dtype.name} tensor between ranks")


def _check_root(root_rank, group=None) -> int:
    size = topology.size() if group is None else group.size
    if not _is_int(root_rank) or not 0 <= root_rank < size:
        raise ValidationError(f"'root_rank' must be an int in [0, {size}) (got {root_rank!r})")
    return int(root_rank)


def _is_int(value) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _with_shapes(outputs, inputs) -> list[tf.Tensor]:
    # numpy_function forgets static shapes (the collectives keep them) and unwraps a
    # one-element output list.
    if not isinstance(outputs, (list, tuple)):
        outputs = [outputs]
    for output, tensor in zip(outputs, inputs):
        output.set_shape(tensor.shape)
    return list(outputs)


def grouped_allreduce(tensors: Sequence, op: ReduceOp | None = ReduceOp.AVERAGE,
                      compression=Compression.none, bucket_bytes: int | None = None,
                      group=None) -> list[tf.Tensor]:
    """Reduces a list of dense tensors across ranks (of ``group``, a ``new_group``; None: all)
    in one fused collective op."""
    op = parse_op(op)
    compression = parse_compression(compression)
    topology.communicator()
    tensors = [tf.convert_to_tensor(t) for t in tensors]
    if not tensors:
        return []
    sent, contexts = zip(*(compression.compress(t) for t in tensors))
    for tensor in sent:
        _check_reducible(tensor)

    reduced = _fused_reduce(list(sent), op, bucket_bytes, group)
    return [compression.decompress(r, ctx) for r, ctx in zip(reduced, contexts)]


def _static_nbytes(tensor: tf.Tensor) -> int:
    count = tensor.shape.num_elements()
    return 0 if count is None else count * tensor.dtype.size


def _flatten(tensors: list[tf.Tensor]) -> tf.Tensor:
    flat = [tf.reshape(t, [-1]) for t in tensors]
    return flat[0] if len(flat) == 1 else tf.concat(flat, axis=0)


def _unflatten(flat: tf.Tensor, like: list[tf.Tensor]) -> list[tf.Tensor]:
    if len(like) == 1:
        pieces = [flat]
    elif all(t.shape.is_fully_defined() for t in like):
        pieces = tf.split(flat, [t.shape.num_elements() for t in like])
    else:
        pieces = tf.split(flat, tf.stack([tf.size(t) for t in like]), num=len(like))
    out = []
    for piece, tensor in zip(pieces, like):
        shape = tensor.shape if tensor.shape.is_fully_defined() else tf.shape(tensor)
        piece = tf.reshape(piece, shape)
        piece.set_shape(tensor.shape)
        out.append(piece)
    return out


def _fused_reduce(tensors: list[tf.Tensor], op: ReduceOp, bucket_bytes: int | None,
                  group=None) -> list[tf.Tensor]:
    """One flat buffer per dtype (and bucket), all reduced by one op, cut back into tensors."""
    buckets = fusion.plan_buckets([t.dtype.name for t in tensors],
                                  [_static_nbytes(t) for t in tensors], bucket_bytes)
    flats = [_flatten([tensors[i] for i in bucket]) for bucket in buckets]
    reduced = _differentiable_reduce(flats, op, bucket_bytes, group)
    out: list = [None] * len(tensors)
    for bucket, flat in zip(buckets, reduced):
        for index, piece in zip(bucket, _unflatten(flat, [tensors[i] for i in bucket])):
            out[index] = piece
    return out


def _reduce_op(tensors: list[tf.Tensor], op: ReduceOp, bucket_bytes: int | None,
               group=None) -> list[tf.Tensor]:
    def reduce(*arrays):
        return wire.reduce_arrays(arrays, op.value, bucket_bytes, group)

    reduced = tf.numpy_function(reduce, tensors, [t.dtype for t in tensors], name="ShoalAllreduce")
    return _with_shapes(reduced, tensors)


def _differentiable_reduce(tensors: list[tf.Tensor], op: ReduceOp, bucket_bytes: int | None,
                           group=None):
    """The reduction, with its gradient: a sum or average across ranks passes the same
    reduction of the upstream gradients back (the job's loss is the sum of the ranks')."""

    @tf.custom_gradient
    def reduce_with_gradient(*inputs):
        outputs = _reduce_op(list(inputs), op, bucket_bytes, group)

        def gradient(*upstream):
            if op not in (ReduceOp.SUM, ReduceOp.AVERAGE):
                return [None] * len(inputs)
            upstream = [tf.zeros_like(y) if d is None else d for d, y in zip(upstream, outputs)]
            return _reduce_op(upstream, op, bucket_bytes, group)

        return outputs, gradient

    return list(reduce_with_gradient(*tensors))


def allreduce(tensor, param_index: int, num_params: int, compression=Compression.none,
              op: ReduceOp | None = ReduceOp.AVERAGE) -> tf.Tensor:
    """Reduces one gradient tensor across ranks (average by default).

    ``param_index`` is this tensor's position among the ``num_params`` gradients being
    reduced (0 and 1 for a single tensor); IndexedSlices are gathered, see ``sparse_allreduce``.
    """
    for name, value in (("param_index", param_index), ("num_params", num_params)):
        if not _is_int(value):
            raise ValidationError(f"'{name}' must be an int (got {value!r})")
    if num_params < 1:
        raise ValidationError(f"'num_params' must be >= 1 (got {num_params})")
    if not 0 <= param_index < num_params:
        raise ValidationError(f"'param_index' must be in [0, {num_params}) (got {param_index})")
    if isinstance(tensor, tf.IndexedSlices):
        return sparse_allreduce(tensor, op=op, compression=compression)
    return grouped_allreduce([tensor], op=op, compression=compression)[0]


def oob_allreduce(tensor, compression=Compression.none, op: ReduceOp | None = ReduceOp.AVERAGE,
                  group=None) -> tf.Tensor:
    """Reduces a non-gradient tensor (a loss, a metric) across ranks, outside gradient fusion."""
    return grouped_allreduce([tensor], op=op, compression=compression, group=group)[0]


def grouped_broadcast(tensors: Sequence, root_rank: int, group=None) -> list[tf.Tensor]:
    """Root's values of every tensor, moved by a single collective (``root_rank``: a rank of
    ``group``)."""
    root_rank = _check_root(root_rank, group)
    tensors = [tf.convert_to_tensor(t) for t in tensors]
    if not tensors:
        return []
    for tensor in tensors:
        _check_movable(tensor)

    def broadcast_all(*arrays):
        return wire.broadcast_arrays(arrays, root_rank, group)

    received = tf.numpy_function(broadcast_all, tensors, [t.dtype for t in tensors], name="ShoalBroadcast")
    return _with_shapes(received, tensors)


def broadcast(tensor, root_rank: int, group=None) -> tf.Tensor:
    """A tensor holding root's value of ``tensor`` (same shape and dtype on every rank)."""
    return grouped_broadcast([tensor], root_rank, group)[0]


def allgather(tensor, group=None) -> tf.Tensor:
    """Every rank's ``tensor`` concatenated along the first axis in rank order; the first
    dimension may differ between ranks, the others must match."""
    topology.communicator()
    tensor = tf.convert_to_tensor(tensor)
    _check_movable(tensor)
    gathered = tf.numpy_function(lambda a: wire.gather_rows(a, group), [tensor], tensor.dtype,
                                 name="ShoalAllgather")
    gathered.set_shape(tf.TensorShape([None]).concatenate(tensor.shape[1:]) if tensor.shape.rank
                       else tf.TensorShape([None]))
    return gathered


def sparse_allreduce(slices: tf.IndexedSlices, op: ReduceOp | None = ReduceOp.AVERAGE,
                     compression=Compression.none) -> tf.IndexedSlices:
    """Reduces IndexedSlices (an embedding's gradient) by gathering every rank's rows.

    The result lists every rank's indices and values (divided by ``size()`` for AVERAGE);
    applying it, repeated indices add up, which is the dense sum or average. MIN and MAX
    have no such form: densify first (``sparse_as_dense=True``).
    """
    op = parse_op(op)
    if op not in (ReduceOp.SUM, ReduceOp.AVERAGE):
        raise ValidationError(f"IndexedSlices reduce with SUM or AVERAGE only (got ReduceOp.{op.name})")
    compression = parse_compression(compression)
    sent, ctx = compression.compress(slices.values)
    values = compression.decompress(allgather(sent), ctx)
    indices = allgather(slices.indices)
    if op is ReduceOp.AVERAGE:
        values = values / tf.cast(topology.size(), values.dtype)
    return tf.IndexedSlices(values, indices, dense_shape=slices.dense_shape)


def overlap(tensor):
    """Identity: the closed library's XLA overlap marker has nothing to mark here."""
    return tf.identity(tensor)
