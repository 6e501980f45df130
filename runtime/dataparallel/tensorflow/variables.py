"""Making every rank's variables equal to root's: ``broadcast_variables``,
``broadcast_global_variables`` and the TF1 ``BroadcastGlobalVariablesHook``.

All the variables move in one packed broadcast, then each is assigned its new value.
"""

from __future__ import annotations

import tensorflow as tf

from . import collectives


def broadcast_variables(variables, root_rank: int):
    """Assigns root's values to ``variables`` (tf.Variable or Keras variables) on every rank.

    Eagerly this returns ``None``; inside a graph, the op that groups the assignments.
    """
    variables = list(variables)
    values = collectives.grouped_broadcast([tf.convert_to_tensor(v) for v in variables], root_rank)
    assignments = [variable.assign(value) for variable, value in zip(variables, values)]
    if tf.executing_eagerly():
        return None
    return tf.group(*[a for a in assignments if a is not None])


def broadcast_global_variables(root_rank: int):
    """Broadcasts TF1 global variables (``tf.compat.v1.global_variables()``): none exist eagerly."""
    return broadcast_variables(tf.compat.v1.global_variables(), root_rank)


class BroadcastGlobalVariablesHook(tf.compat.v1.train.SessionRunHook):
    """Broadcasts the global variables from ``root_rank`` once the session exists, so workers
    start from the same values whether initialized randomly or restored from a checkpoint."""

    def __init__(self, root_rank: int, device: str = ""):
        super().__init__()
        self.root_rank = root_rank
        self.device = device
        self.broadcast_op = None

    def begin(self):
        if self.broadcast_op is None or self.broadcast_op.graph != tf.compat.v1.get_default_graph():
            with tf.device(self.device):
                self.broadcast_op = broadcast_global_variables(self.root_rank)

    def after_create_session(self, session, coord):
        session.run(self.broadcast_op)
