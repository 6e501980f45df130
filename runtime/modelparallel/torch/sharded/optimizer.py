"""``smp.DistributedOptimizer`` under sharded data parallelism (DeepSpeed's ZeRO-3 shape).

The user's optimizer keeps its groups and hyper-parameters, but each group's parameters
are replaced by one flat float32 tensor: this rank's chunks of them, end to end
(``fp32_partitioned_groups_flat[i]``, the layout SMP's scripts index with
``p.ds_tensor.ds_numel``). Its gradient is a view of the reducer's gradient shards, laid
out in the same order, so nothing is copied before the step. In float32 each
``p.ds_tensor`` becomes a view of the flat tensor (one copy of the weights per rank); with
fp16/bf16 the chunks stay 16-bit and take the new values after each step.

``step()`` does what SMP's does inside it: unscales fp16 gradients and skips the step on
every rank when one of them overflowed (halving a dynamic scale), clips the global
gradient norm to ``sdp_gradient_clipping`` (0 turns it off), steps, and refreshes the
persistent parameters. ``clip_master_grads`` clips nothing (SMP: a no-op under sharded
data parallelism) and returns the norm.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from shoal.modelparallel.errors import SMPUsageError
from shoal.modelparallel.torch.loss_scaler import LossScaler, ScaledOptimizerView, make_scaler


class ShardedOptimizer(ScaledOptimizerView):
    """Wraps the user's optimizer (``.optimizer``, which LR schedulers take)."""

    def __init__(self, optimizer: torch.optim.Optimizer, st, static_loss_scale,
                 dynamic_loss_scale: bool, dynamic_loss_args: dict[str, Any]) -> None:
        self.optimizer = optimizer
        self._st = st
        model = st.model
        self._sharded = model.sharded
        self._reducer = model.sharded.reducer
        if st.cfg.fp16:
            self.scaler = make_scaler(static_loss_scale, dynamic_loss_scale, dynamic_loss_args)
        else:
            self.scaler = LossScaler(1.0)
        self.overflow = False
        self.clipping = float(st.cfg.sdp_gradient_clipping)
        self.partition_count = self._sharded.parts
        self.ds_param_shard_group = self._sharded.groups.torch_group
        self.fp16_groups: list[list[torch.nn.Parameter]] = []
        self.fp32_partitioned_groups_flat: list[torch.Tensor] = []
        self._half = model.half_dtype is not None
        for group in optimizer.param_groups:
            params = [p for p in group["params"] if p.requires_grad]  # frozen ones never step
            self.fp16_groups.append(params)
            group["params"] = [self._flat_for(params)]
        self._reducer.arrange([p for params in self.fp16_groups for p in params])
        self._grad_views = [self._reducer.span(params) for params in self.fp16_groups]
        pending = getattr(model, "pending_optimizer_state", None)
        if pending is not None:  # smp.resume_from_checkpoint ran before this optimizer
            model.pending_optimizer_state = None
            self.load_state_dict(pending)

    def _flat_for(self, params: list[torch.nn.Parameter]) -> torch.Tensor:
        if not params:
            flat = torch.zeros(0, requires_grad=True)
        else:
            flat = torch.cat([p.ds_tensor.detach().float() for p in params]).requires_grad_()
        if not self._half:  # the chunks become views of the master: one copy of the weights
            at = 0
            for p in params:
                n = p.ds_tensor.numel()
                self._sharded.set_shard(p, flat.detach()[at:at + n])
                at += n
        self.fp32_partitioned_groups_flat.append(flat)
        return flat

    # -- what scripts read ---------------------------------------------------------------
    @property
    def dynamic_loss_scale(self) -> bool:
        return self.scaler.dynamic

    def __repr__(self) -> str:
        return f"ShardedOptimizer({self.optimizer!r}, partition_count={self.partition_count})"

    # -- the step ------------------------------------------------------------------------
    def zero_grad(self, set_to_none: bool = True) -> None:  # noqa: ARG002 - one buffer
        self._reducer.zero()
        for flat in self.fp32_partitioned_groups_flat:
            flat.grad = None

    def _unscale(self) -> None:
        """The step's gradient shards, complete and (fp16) divided by the loss scale."""
        st = self._st
        plain = st.model._outside_step  # a plain loss.backward(): no loss scale in it
        st.model.sync_outside_step()
        if st.cfg.fp16 and not plain and self.scaler.loss_scale != 1.0:
            self._reducer.flat.mul_(1.0 / self.scaler.loss_scale)

    def _global_norm(self) -> float:
        """The same on every rank: shards summed over the sharding and TP groups, and the
        replicas hold the same averaged shards."""
        return self._reducer.norm(frozenset(self._st.model._layout.distributed),
                                  self._st.topology.tp_rank)

    def clip_master_grads(self, max_norm: float, norm_type: float = 2) -> torch.Tensor:  # noqa: ARG002
        """SMP: no clipping here under sharded data parallelism (``step()`` clips by
        ``sdp_gradient_clipping``); returns the gradient's global L2 norm."""
        self._st.model.sync_outside_step()
        norm = self._global_norm()
        if self._st.cfg.fp16:
            norm /= self.scaler.loss_scale
        return torch.tensor(norm)

    def step(self, closure=None):
        if closure is not None:
            raise SMPUsageError("smp.DistributedOptimizer.step under sharded data "
                                "parallelism takes no closure")
        self._unscale()
        norm = self._global_norm() if self._half or self.clipping > 0 else 0.0
        # 16 bits: an inf or NaN anywhere makes the norm so on every rank; the step is skipped.
        self.overflow = self._half and not math.isfinite(norm)
        if self.overflow:
            self._reducer.zero()
            self.scaler.update(True)
            return None
        if self.clipping > 0:
            coefficient = self.clipping / (norm + 1e-6)
            if coefficient < 1:
                self._reducer.flat.mul_(coefficient)
        for flat, grad in zip(self.fp32_partitioned_groups_flat, self._grad_views):
            flat.grad = grad
        out = self.optimizer.step()
        if self._half:
            self._copy_to_chunks()
        self._sharded.refresh_persistent()
        self.scaler.update(False)
        return out

    def _copy_to_chunks(self) -> None:
        with torch.no_grad():
            for params, flat in zip(self.fp16_groups, self.fp32_partitioned_groups_flat):
                at = 0
                for p in params:
                    n = p.ds_tensor.numel()
                    p.ds_tensor.copy_(flat[at:at + n])
                    at += n

    def refresh_masters(self) -> None:
        """16-bit chunks loaded from a model state: the float32 masters take their values."""
        if not self._half:
            return  # the chunks are views of the masters
        with torch.no_grad():
            for params, flat in zip(self.fp16_groups, self.fp32_partitioned_groups_flat):
                if params:
                    flat.copy_(torch.cat([p.ds_tensor.float() for p in params]))

    # -- state dicts ---------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """This rank's shard of the optimizer (DeepSpeed's stage-3 layout)."""
        return {
            "optimizer_state_dict": self.optimizer.state_dict(),
            "fp32_flat_groups": [f.detach().clone() for f in self.fp32_partitioned_groups_flat],
            "partition_count": self.partition_count,
            "loss_scaler": self.scaler.state_dict(),
            "dynamic_loss_scale": self.scaler.dynamic,
            "overflow": self.overflow,
            "_smp_zero2d": True,
        }

    local_state_dict = state_dict

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if not state_dict.get("_smp_zero2d"):
            raise SMPUsageError("Error: trying to load a non-sharded checkpoint into sharded "
                                "data parallelism model!")
        if int(state_dict["partition_count"]) != self.partition_count:
            raise SMPUsageError(
                f"the optimizer state holds {state_dict['partition_count']} shards, this "
                f"job's sharded_data_parallel_degree is {self.partition_count}")
        self.optimizer.load_state_dict(state_dict["optimizer_state_dict"])
        with torch.no_grad():
            for flat, saved in zip(self.fp32_partitioned_groups_flat,
                                   state_dict["fp32_flat_groups"]):
                flat.copy_(saved)
        if self._half:
            self._copy_to_chunks()
        self._sharded.refresh_persistent()
        self.scaler.load_state_dict(state_dict["loss_scaler"])
        self.overflow = bool(state_dict.get("overflow", False))
