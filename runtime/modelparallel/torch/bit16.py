"""fp16 / bf16 training: the optimizer side (SMP's ``Bit16_Optimizer`` behaviour).

The model's parameters are 16-bit (``DistributedModel`` casts them); the user's optimizer
steps float32 master copies of the parameters this rank holds, and the 16-bit parameters
are refreshed from them after each step. With fp16, ``model.backward`` multiplies the loss
by the current loss scale (loss_scaler.py) and the step divides it out of the master
gradients; bf16 has float32's exponent range and is not scaled. A step whose gradients
hold an inf or NaN on any rank is skipped on every rank (one small allreduce over the
world decides, so that the replicas and pipeline stages stay in step), with
``optimizer.overflow`` set.

With ``shard_optimizer_state`` (optstate.py) the masters are what is sharded: a rank keeps
the float32 masters (and so the optimizer state) of the parameters it owns only, the others
are empty as other pipeline stages' are; the step ends with the allgather of the updated
16-bit parameters, and the gradient norm sums each owner's share over the world.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
from shoal.dataparallel import core
from shoal.modelparallel.topology import CommGroup
from shoal.modelparallel.torch import state as _state
from shoal.modelparallel.torch.loss_scaler import LossScaler, ScaledOptimizerView, make_scaler


class Bit16Optimizer(ScaledOptimizerView):
    """Wraps the user's optimizer (``.optimizer``, which LR schedulers take)."""

    def __init__(self, optimizer: torch.optim.Optimizer, st: _state.State,
                 static_loss_scale: float | None, dynamic_loss_scale: bool,
                 dynamic_loss_args: dict[str, Any], sharding=None) -> None:
        self.optimizer = optimizer
        self._st = st
        self._sharding = sharding  # optstate.Sharding with shard_optimizer_state
        if st.cfg.fp16:
            self.scaler = make_scaler(static_loss_scale, dynamic_loss_scale, dynamic_loss_args)
        else:
            self.scaler = LossScaler(1.0)
        self.overflow = False
        self._prepared = False  # master gradients taken from this step's 16-bit ones
        # (16-bit parameter, float32 master) in the inner optimizer's order; the masters
        # replace the parameters in its groups, so it steps them.
        self._pairs: list[tuple[torch.Tensor, torch.Tensor]] = []
        for group in optimizer.param_groups:
            masters = []
            for param in group["params"]:
                master = param.detach().float().clone().requires_grad_(param.requires_grad)
                self._pairs.append((param, master))
                masters.append(master)
            group["params"] = masters
        # Partitioning frees other stages' parameters and broadcasts the owned ones from the
        # data-parallel root: the masters follow (now, if that is done).
        st.model.register_post_partition_hook(lambda _m, _o: self._refresh_masters())

    # -- what scripts read -----------------------------------------------------------------
    def __repr__(self) -> str:
        return f"Bit16Optimizer({self.optimizer!r}, loss_scale={self.loss_scale})"

    # -- the step ----------------------------------------------------------------------------
    def zero_grad(self, set_to_none: bool = True) -> None:
        for param, master in self._pairs:
            master.grad = None
            if param.grad is not None:
                if set_to_none:
                    param.grad = None
                else:
                    param.grad.detach_().zero_()
        self._prepared = False

    def clip_master_grads(self, max_norm: float, norm_type: float = 2) -> torch.Tensor:
        """Clips the master gradients by their norm over the whole model and returns that
        norm (-1, nothing clipped, when the gradients overflowed: the step is skipped)."""
        self._prepare_grads()
        if self.overflow:
            return torch.tensor(-1.0)
        grads = [(p, m.grad) for p, m in self._pairs if m.grad is not None]
        norm = self._global_norm(grads, float(norm_type))
        coefficient = float(max_norm) / (norm + 1e-6)
        if coefficient < 1:
            for _, grad in grads:
                grad.mul_(coefficient)
        return torch.tensor(norm)

    def step(self, closure=None):
        self._prepare_grads()
        self._prepared = False
        if self.overflow:
            for _, master in self._pairs:
                master.grad = None
            self.scaler.update(True)
            return None
        out = self.optimizer.step(closure) if closure is not None else self.optimizer.step()
        with torch.no_grad():
            for param, master in self._pairs:
                if master.numel() and master.grad is not None:
                    param.copy_(master)
        if self._sharding is not None:
            self._sharding.gather()
        self.scaler.update(False)
        return out

    def _prepare_grads(self) -> None:
        """Master gradients = the 16-bit gradients in float32, unscaled; ``overflow`` as
        agreed by every rank."""
        if self._prepared:
            return
        # A forward outside smp.step (tensor parallelism alone) had a plain loss.backward(),
        # which no loss scale multiplied: its gradients are taken as they are.
        plain = self._st.model._outside_step
        self._st.model.sync_outside_step()  # a plain backward's gradients, averaged first
        inverse = 1.0 if plain else 1.0 / self.scaler.loss_scale
        bad = False
        for param, master in self._pairs:
            if param.grad is None or not master.numel():
                master.grad = None
                continue
            grad = param.grad.detach().float()
            if inverse != 1.0:
                grad.mul_(inverse)
            if not bad and not bool(torch.isfinite(grad).all()):
                bad = True
            master.grad = grad
        flag = np.array([1.0 if bad else 0.0])
        if self._st.topology.size > 1:
            core.allreduce(flag, op="max")
        self.overflow = bool(flag[0])
        self._prepared = True

    def _global_norm(self, grads, norm_type: float) -> float:
        """Each parameter counted once: tensor-parallel shards over the TP group, the
        replicated parameters from tp_rank 0 only, pipeline stages over the PP group."""
        st = self._st
        first = st.topology.tp_rank == 0
        mine = [g for p, g in grads if first or st.model.is_distributed_parameter(p)]
        group = st.core_group(CommGroup.MP_GROUP)
        if self._sharding is not None:  # each gradient on its owner only: summed over all
            mine = [g for p, g in grads if self._sharding.counts_in_norm(p)]
            group = None if st.topology.size > 1 else _state.SOLO
        if math.isinf(norm_type):
            local = max((float(g.abs().max()) for g in mine if g.numel()), default=0.0)
            op = "max"
        else:
            local = sum(float(torch.linalg.vector_norm(g.double(), norm_type)) ** norm_type
                        for g in mine)
            op = "sum"
        total = np.array([local], dtype=np.float64)
        if group is not _state.SOLO:
            core.allreduce(total, op=op, group=group)
        return float(total[0]) if math.isinf(norm_type) else float(total[0]) ** (1.0 / norm_type)

    def _refresh_masters(self) -> None:
        with torch.no_grad():
            for param, master in self._pairs:
                value = param.detach().float().clone()
                if self._sharding is not None and not self._sharding.owns(param):
                    value = torch.empty(0)  # another replica's to step
                if master.is_meta:  # delayed initialization: made before it had storage
                    from shoal.modelparallel.torch.delayed import give_storage

                    give_storage(master, value)
                else:
                    master.data = value
        for master in [m for _, m in self._pairs if not m.numel()]:
            self.optimizer.state.pop(master, None)

    # -- state dicts ---------------------------------------------------------------------------
    def local_state_dict(self, *args, gather_if_shard: bool = True,
                         **kwargs) -> dict[str, Any]:  # noqa: ARG002
        """This stage's masters and optimizer state; with ``shard_optimizer_state``,
        gathered from the replicas unless ``gather_if_shard`` is False (this rank's shard)."""
        inner = self.optimizer.state_dict()
        masters = [m.detach().clone() if m.numel() else None for _, m in self._pairs]
        if self._sharding is not None and gather_if_shard:
            inner["state"], masters = self._sharding.gather_state(
                inner["state"], masters, [p for p, _ in self._pairs])
        return {
            "optimizer_state_dict": inner,
            "fp32_from_fp16": masters,
            "loss_scaler": self.scaler.state_dict(),
            "dynamic_loss_scale": self.scaler.dynamic,
            "overflow": self.overflow,
            "_smp_is_partial": True,
        }

    def state_dict(self) -> dict[str, Any]:
        """Every pipeline stage's masters and optimizer state (call it on all of them);
        with ``shard_optimizer_state``, this stage's only, as SMP does."""
        from shoal.modelparallel.torch import comm

        if self._sharding is not None:
            import warnings

            from shoal.modelparallel.torch.optstate import LOCAL_ONLY

            warnings.warn(LOCAL_ONLY, stacklevel=2)
            return self.local_state_dict()

        parts = comm.allgather(self.local_state_dict(), CommGroup.PP_GROUP)
        merged = {k: v for k, v in parts[0].items() if k != "_smp_is_partial"}
        inner = merged["optimizer_state_dict"]
        masters = list(merged["fp32_from_fp16"])
        for part in parts[1:]:
            inner["state"].update(part["optimizer_state_dict"]["state"])
            masters = [a if a is not None else b for a, b in zip(masters, part["fp32_from_fp16"])]
        merged["fp32_from_fp16"] = masters
        return merged

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Loads a full or partial state; before partitioning, waits until it is done."""
        if not self._st.model.partitioned:
            saved = dict(state_dict)
            self._st.model.register_post_partition_hook(lambda _m, _o: self.load_state_dict(saved))
            return
        inner = {k: v for k, v in state_dict["optimizer_state_dict"].items()
                 if k != "_smp_is_partial"}
        self.optimizer.load_state_dict(inner)
        with torch.no_grad():
            for (_, master), saved in zip(self._pairs, state_dict["fp32_from_fp16"]):
                if saved is not None and master.numel():
                    master.copy_(saved)
        for master in [m for _, m in self._pairs if not m.numel()]:
            self.optimizer.state.pop(master, None)  # other stages' state: not stepped here
        self.scaler.load_state_dict(state_dict["loss_scaler"])
        self.overflow = bool(state_dict.get("overflow", False))
