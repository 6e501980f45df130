"""``smp.DistributedOptimizer``: the user's optimizer itself, with SMP's state-dict methods.

The same object comes back (so ``isinstance(opt, torch.optim.Optimizer)`` holds and LR
schedulers accept it). Each rank steps only the parameters it owns: the others have no
gradient, so torch's optimizers skip them. ``state_dict()`` gathers every pipeline rank's
state; ``load_state_dict()`` waits until the model is partitioned.

With ``shard_optimizer_state`` (optstate.py) each data-parallel replica steps only the
parameters it owns, so only those get optimizer state, and ``step()`` ends with the
allgather of the updated parameters. ``state_dict()`` then returns this stage's state
gathered from the replicas (SMP's warning says so), and ``local_state_dict(
gather_if_shard=False)`` this rank's shard alone, what partial checkpoints save.
"""

from __future__ import annotations

import types
import warnings
from typing import Any

import torch
from shoal.modelparallel.errors import SMPUsageError
from shoal.modelparallel.topology import CommGroup
from shoal.modelparallel.torch import optstate
from shoal.modelparallel.torch import state as _state


def DistributedOptimizer(optimizer: torch.optim.Optimizer,  # noqa: N802 - SMP's name
                         static_loss_scale: float | None = 1.0, dynamic_loss_scale: bool = False,
                         dynamic_loss_args: dict[str, Any] | None = None, **more_loss_args: Any):
    """The optimizer for ``smp.DistributedModel``'s parameters. Without fp16/bf16 the loss
    scale arguments have no effect; with them the 16-bit wrapper comes back
    (:class:`Bit16Optimizer`, the user's optimizer as its ``.optimizer``)."""
    st = _state.require()
    if st.model is None:
        raise SMPUsageError("smp.DistributedModel call must take place before "
                            "smp.DistributedOptimizer.")
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"smp.DistributedOptimizer needs a torch optimizer (got "
                        f"{type(optimizer).__name__})")
    known = {id(p) for p in st.model.parameters()}
    for group in optimizer.param_groups:
        for p in group["params"]:
            if id(p) not in known:
                raise SMPUsageError("every parameter of the optimizer must belong to the "
                                    "smp.DistributedModel")
    from shoal.modelparallel.torch.model import half_dtype

    if getattr(st.model, "sharded", None) is not None:  # sharded data parallelism
        from shoal.modelparallel.torch.sharded.optimizer import ShardedOptimizer

        args = {**(dynamic_loss_args or {}), **more_loss_args}
        st.optimizer = ShardedOptimizer(optimizer, st, static_loss_scale, dynamic_loss_scale,
                                        args)
        return st.optimizer
    sharding = optstate.install(st)  # set up first of the post-partition hooks
    if half_dtype(st.cfg) is not None:
        from shoal.modelparallel.torch.bit16 import Bit16Optimizer

        args = {**(dynamic_loss_args or {}), **more_loss_args}
        st.optimizer = Bit16Optimizer(optimizer, st, static_loss_scale, dynamic_loss_scale, args,
                                      sharding=sharding)
        return st.optimizer
    _wrap(optimizer, st, sharding)
    st.optimizer = optimizer
    return optimizer


def _wrap(optimizer: torch.optim.Optimizer, st: _state.State, sharding) -> None:
    """Gives the user's optimizer SMP's methods, in place."""
    original_load = optimizer.load_state_dict
    original_state = optimizer.state_dict
    original_step = optimizer.step
    pending: list = []
    params = [p for group in optimizer.param_groups for p in group["params"]]

    def local_state_dict(self, *args, gather_if_shard: bool = True, **kwargs):
        out = original_state()
        if sharding is not None and gather_if_shard:
            out["state"], _ = sharding.gather_state(out["state"], None, params)
        out["_smp_is_partial"] = True
        return out

    def state_dict(self):
        from shoal.modelparallel.torch import comm

        if sharding is not None:
            warnings.warn(optstate.LOCAL_ONLY, stacklevel=2)
            return local_state_dict(self)
        parts = comm.allgather(local_state_dict(self), CommGroup.PP_GROUP)
        merged = original_state()
        for part in parts:
            merged["state"].update(part["state"])
        return merged

    def load(state_dict):
        original_load(state_dict)
        if sharding is not None:  # a whole state: only this rank's parameters keep theirs
            sharding.drop_unowned(optimizer.state)

    def load_state_dict(self, state_dict):
        state_dict = {k: v for k, v in state_dict.items() if k != "_smp_is_partial"}
        if not st.model.partitioned:
            pending.append(state_dict)
            st.model.register_post_partition_hook(lambda m, o: load(pending.pop()))
            return
        load(state_dict)

    def step(self, *args, **kwargs):
        # A backward outside smp.step (tensor parallelism alone) is averaged here. A bound
        # method, as LR schedulers expect of optimizer.step.
        st.model.sync_outside_step()
        out = original_step(*args, **kwargs)
        if sharding is not None:
            sharding.gather()
        return out

    optimizer.step = types.MethodType(step, optimizer)
    optimizer.local_state_dict = types.MethodType(local_state_dict, optimizer)
    optimizer.state_dict = types.MethodType(state_dict, optimizer)
    optimizer.load_state_dict = types.MethodType(load_state_dict, optimizer)
