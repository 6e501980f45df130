"""``smp.DistributedModel``: the user's module, partitioned over the pipeline at the first step.

Until the first ``smp.step`` call the model is whole on every rank. That call decides who
owns each module (partition.py: auto from a traced first microbatch, or the manual
placements), routes module calls through the pipeline engine, frees the parameters of
modules other ranks own, and, with ``ddp: True``, broadcasts each owned parameter and
buffer from data-parallel rank 0. Gradients are averaged over the microbatches
(``average_grads_across_microbatches``: each microbatch's backward starts from its loss's
gradient divided by their number) and, with ``ddp``, over the
data-parallel group (gradsync.py: buckets start during the backward), so
``optimizer.step()`` sees the whole batch's gradient.

With ``fp16`` or ``bf16`` (SMP's ``Bit16_Module``) the module's floating parameters and
buffers become float16 / bfloat16, floating inputs are cast to that dtype and floating
outputs back to float32 (``upscale_model_output=False`` keeps them 16-bit); the loss
scale is applied in ``backward`` and the float32 master weights live in the optimizer
(bit16.py).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from shoal.dataparallel import core
from shoal.modelparallel.errors import SMPUsageError
from shoal.modelparallel.torch import activations as _activations
from shoal.modelparallel.torch import delayed as _delayed
from shoal.modelparallel.torch import offload as _offload
from shoal.modelparallel.torch import placement as _partition
from shoal.modelparallel.torch import state as _state
from shoal.modelparallel.torch.gradsync import GradientSync
from shoal.modelparallel.torch.scheduler import current_task
from shoal.modelparallel.torch.tensorparallel import registry as _tp_registry
from shoal.modelparallel.torch.tensorparallel.layout import TensorLayout

_FORWARD_OUTSIDE_STEP = (
    "SMP DistributedModel forward can only be run from inside a smp.step annotated function "
    "when pipeline parallelism degree is more than 1.")
_BACKWARD_OUTSIDE_STEP = (
    "smp.DistributedModel's backward can only be run inside smp.step annotated function")


class DataParallelModule(torch.nn.Module):
    """The layer ``ddp: True`` adds, so scripts reach their module as ``model.module.module``."""

    def __init__(self, module: torch.nn.Module) -> None:
        super().__init__()
        self.module = module

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)


class DistributedModel(torch.nn.Module):
    """Wraps the user's module; only one per process, created after ``smp.init()``."""

    def __init__(self, module: torch.nn.Module, trace_device: str = "cpu",
                 trace_execution_times: bool = False, overlapping_allreduce: bool = True,
                 backward_passes_per_step: int = 1,
                 average_grads_across_microbatches: bool = True, bucket_cap_mb: int = 25,
                 trace_memory_usage: bool = False, broadcast_buffers: bool = True,
                 gradient_as_bucket_view: bool = False, find_unused_parameters: bool = False,
                 upscale_model_output: bool = True, **_ignored: Any) -> None:
        st = _state.require()
        if st.model is not None:
            raise SMPUsageError("smp.DistributedModel can be created only once per process")
        if not isinstance(module, torch.nn.Module):
            raise TypeError(f"smp.DistributedModel needs an nn.Module (got {type(module).__name__})")
        if backward_passes_per_step < 1:
            raise ValueError(f"'backward_passes_per_step' must be >= 1 (got {backward_passes_per_step})")
        from shoal.modelparallel.torch.optstate import check_model

        check_model(st.cfg, gradient_as_bucket_view)  # shard_optimizer_state's conditions
        super().__init__()
        # Tensor parallelism: marked modules become smp.nn's distributed modules, here.
        module = _tp_registry.distribute(module)
        self.half_dtype = half_dtype(st.cfg)
        self.upscale_model_output = upscale_model_output
        if self.half_dtype is not None:
            module.to(self.half_dtype)  # in place: the Parameter objects stay the same
        self._layout = TensorLayout(module)
        self._tp_hooks = []
        if st.topology.tp_size > 1 and not st.cfg.prescaled_batch:
            self._tp_hooks = self._layout.scale_scaled_batch_gradients(
                module.parameters(), st.topology.tp_size)
        self.module = DataParallelModule(module) if st.cfg.ddp else module
        self._user = module
        self.trace_execution_times = trace_execution_times
        self.backward_passes_per_step = backward_passes_per_step
        self.average_grads_across_microbatches = average_grads_across_microbatches
        self.bucket_bytes = int(bucket_cap_mb * 2**20)
        self.broadcast_buffers = broadcast_buffers
        self.partitioned = False
        self.owner: dict[str, int] = {}
        self._post_partition_hooks: list[Callable] = []
        self._deferred_state: tuple[dict, bool] | None = None
        self.overlapping_allreduce = overlapping_allreduce
        self._grad_syncs: list[GradientSync] = []
        self._outside_step = False  # a forward ran outside smp.step: sync at optimizer.step
        self.sharded = None  # sharded data parallelism's parameters (sharded/params.py)
        st.model = self
        _activations.plan(self)  # SHOAL_ACTIVATION_CHECKPOINTING: checkpoints after partitioning
        if st.topology.pp_size == 1 and (st.topology.tp_size > 1 or st.shard_groups):
            # SMP: with tensor parallelism alone, smp.step is optional; the parameters are
            # broadcast here and the model is ready for a plain forward and backward. Under
            # sharded data parallelism scripts read p.ds_tensor before the first step.
            self.partition_at_first_step(None)

    # -- what scripts call ------------------------------------------------------------------
    def forward(self, *args, **kwargs):
        st = _state.require()
        if current_task() is None and not st.tracing:
            if st.topology.pp_size > 1:
                raise SMPUsageError(_FORWARD_OUTSIDE_STEP)
            if torch.is_grad_enabled():
                self._outside_step = True
        if self.half_dtype is None:
            return self.module(*args, **kwargs)
        args, kwargs = _cast_floating((args, kwargs), self.half_dtype)
        out = self.module(*args, **kwargs)
        return _cast_floating(out, torch.float32) if self.upscale_model_output else out

    def backward(self, tensors, grad_tensors=None) -> None:
        """Replaces ``loss.backward()``: the backward runs across the pipeline."""
        st = _state.require()
        if st.tracing:
            return
        if current_task() is None:
            raise SMPUsageError(_BACKWARD_OUTSIDE_STEP)
        st.engine.begin_backward()
        m = st.cfg.microbatches
        scale = 1.0 / m if m > 1 and self.average_grads_across_microbatches else 1.0
        if st.cfg.fp16 and st.optimizer is not None:
            scale *= getattr(st.optimizer, "loss_scale", 1.0)  # fp16: the loss scale
        if scale != 1.0:
            tensors, grad_tensors = _scaled_roots(tensors, grad_tensors, scale)
        torch.autograd.backward(tensors, grad_tensors)

    def get_module(self) -> torch.nn.Module:
        return self._user

    def register_post_partition_hook(self, hook: Callable) -> None:
        """``hook(model, optimizer)`` runs right after partitioning (now, if it is done)."""
        if self.partitioned:
            hook(self, _state.require().optimizer)
        else:
            self._post_partition_hooks.append(hook)

    def join(self, *args, **kwargs):
        import contextlib

        return contextlib.nullcontext()

    # -- what this rank holds ---------------------------------------------------------------
    def _owns(self, module_name: str) -> bool:
        return not self.partitioned or self.owner[module_name] == _state.require().topology.pp_rank

    def local_named_modules(self):
        for name, module in _partition.named_modules(self._user).items():
            if self._owns(name):
                yield name, module

    def local_modules(self):
        return (m for _, m in self.local_named_modules())

    def local_named_parameters(self):
        """This rank's parameters, each once (a tied parameter under its first name)."""
        seen: set[int] = set()
        for name, module in self.local_named_modules():
            for pname, param in module.named_parameters(recurse=False):
                if id(param) not in seen:
                    seen.add(id(param))
                    yield (f"{name}.{pname}" if name else pname), param

    def local_parameters(self):
        return (p for _, p in self.local_named_parameters())

    def local_named_buffers(self):
        for name, module in self.local_named_modules():
            for bname, buf in module.named_buffers(recurse=False):
                if buf is not None:
                    yield (f"{name}.{bname}" if name else bname), buf

    def local_buffers(self):
        return (b for _, b in self.local_named_buffers())

    # -- partitioning ----------------------------------------------------------------------
    def partition_at_first_step(self, run_traced: Callable[[], Any] | None) -> None:
        """Decides the owners (tracing ``run_traced`` on world rank 0 for auto-partition)."""
        st = _state.require()
        pp = st.topology.pp_size
        modules = _partition.named_modules(self._user)
        if pp == 1:
            owner = dict.fromkeys(modules, 0)
        elif not st.cfg.auto_partition:
            owner = _partition.manual_assignment(self._user, pp, st.cfg.default_partition)
        else:
            from shoal.modelparallel.torch import comm

            decided = None
            if st.topology.rank == 0:
                traces = self._trace(run_traced)
                decided = _partition.auto_assignment(
                    self._user, traces, pp, st.cfg.memory_weight, self.trace_execution_times)
            owner = comm.broadcast_from_world_root(decided)
        self.owner = owner
        self.partitioned = True
        st.engine.install(modules, owner)
        each = self._shard_materialised if st.shard_groups is not None else None
        _delayed.materialise(self._user, self._owns, each)  # delay_param_initialization's
        self._release_others()
        if st.cfg.ddp:
            self._broadcast_from_dp_root()
        self._start_gradient_sync()
        if self._deferred_state is not None:
            state_dict, strict = self._deferred_state
            self._deferred_state = None
            self.load_state_dict(state_dict, strict)
        for hook in self._post_partition_hooks:
            hook(self, st.optimizer)
        _offload.note_partitioned(_activations.has_checkpointing(self))

    def _trace(self, run_traced: Callable[[], Any]) -> dict[str, _partition.ModuleTrace]:
        st = _state.require()
        traces: dict[str, _partition.ModuleTrace] = {}
        started: dict[str, list[float]] = {}
        handles = []
        for name, module in _partition.named_modules(self._user).items():
            def pre(_m, _a, name=name):
                traces.setdefault(name, _partition.ModuleTrace(order=len(traces)))
                started.setdefault(name, []).append(time.perf_counter())

            def post(_m, _a, output, name=name):
                trace = traces[name]
                trace.seconds += time.perf_counter() - started[name].pop()
                trace.output_bytes += _tensor_bytes(output)
            handles.append(module.register_forward_pre_hook(pre))
            handles.append(module.register_forward_hook(post))
        _delayed.materialise(self._user)  # the trace runs the whole model
        st.tracing = True
        try:
            with torch.no_grad():
                run_traced()
        finally:
            st.tracing = False
            for handle in handles:
                handle.remove()
        return traces

    def _release_others(self) -> None:
        """Frees the storage of parameters that other pipeline ranks own."""
        me = _state.require().topology.pp_rank
        for name, module in _partition.named_modules(self._user).items():
            if self.owner[name] != me:
                for param in module.parameters(recurse=False):
                    param.data = torch.empty(0, dtype=param.dtype)

    def _by_reducer(self, tensors) -> dict:
        """``tensors`` by the group that keeps them equal: scaled-batch ones (tensor
        parallelism's) over the reduced-data-parallel group, the others over the
        data-parallel group."""
        from shoal.modelparallel.topology import CommGroup

        scaled = self._layout.scaled_batch
        return {CommGroup.DP_GROUP: [t for t in tensors if id(t) not in scaled],
                CommGroup.RDP_GROUP: [t for t in tensors if id(t) in scaled]}

    def _shard_materialised(self, params) -> None:
        """Delayed initialization under sharded data parallelism: a module's parameters,
        just initialised, are made equal across the replicas and cut into their chunks."""
        from shoal.modelparallel.torch.sharded.params import shard_parameter

        st = _state.require()
        if st.cfg.ddp:
            self._broadcast_from_dp_root(params)
        groups = st.shard_groups
        for p in params:
            shard_parameter(p, groups.degree, groups.rank,
                            st.cfg.sdp_param_persistence_threshold)

    def _broadcast_from_dp_root(self, tensors=None) -> None:
        st = _state.require()
        if tensors is None:
            tensors = list(self.local_parameters())
            if self.broadcast_buffers:
                tensors += list(self.local_buffers())
        for kind, members in self._by_reducer(tensors).items():
            group = st.core_group(kind)
            if group is _state.SOLO:
                continue
            for tensor in members:
                if tensor.numel():
                    core.broadcast(_raw(tensor.data), 0, group=group)

    def _start_gradient_sync(self) -> None:
        st = _state.require()
        if not st.cfg.ddp:
            return
        if st.shard_groups is not None:
            self._start_sharding(st)
            return
        for kind, params in self._by_reducer(list(self.local_parameters())).items():
            group = st.core_group(kind)
            if group is _state.SOLO or not params:
                continue
            self._grad_syncs.append(GradientSync(
                params, group, self.bucket_bytes, self.backward_passes_per_step,
                self.overlapping_allreduce, timeline=st.engine.timeline))

    def _start_sharding(self, st) -> None:
        """Sharded data parallelism: the parameters are cut into their shards, here."""
        from shoal.modelparallel.topology import CommGroup
        from shoal.modelparallel.torch.sharded.grads import GradientReducer
        from shoal.modelparallel.torch.sharded.params import ShardedParameters

        cfg, tp_group = st.cfg, st.core_group(CommGroup.TP_GROUP)
        per_tp = frozenset()
        if st.topology.tp_size > 1:  # replicated and fed per TP rank: averaged over TP too
            per_tp = frozenset(id(p) for p in self._user.parameters()
                               if id(p) not in self._layout.scaled_batch)
        reducer = GradientReducer(
            st.shard_groups, cfg.sdp_reduce_bucket_size, self.backward_passes_per_step,
            tp_group=None if tp_group is _state.SOLO else tp_group, tp_averaged=per_tp,
            overlap=self.overlapping_allreduce)
        self.sharded = ShardedParameters(
            self._user, st.shard_groups, cfg.sdp_param_persistence_threshold,
            cfg.sdp_max_live_parameters, reducer, cfg.sdp_hierarchical_allgather)

    def after_step(self) -> None:
        """Averages this rank's gradients over its data-parallel group (``ddp``): the
        buckets that started during the backward are waited for, the rest reduced now."""
        self._outside_step = False
        for sync in self._grad_syncs:
            sync.finish_step()
        if self.sharded is not None:
            self.sharded.reducer.finish_step()
            self.sharded.end_step()

    def sync_outside_step(self) -> None:
        """At ``optimizer.step()``: averages the gradients of a backward that ran outside
        ``smp.step`` (tensor parallelism alone lets scripts call ``loss.backward()``)."""
        if self._outside_step:
            self.after_step()

    # -- tensor parallelism's view of the model ------------------------------------------------
    def distributed_modules(self):
        """The smp.nn distributed modules of the model."""
        return [m for _, m in self._layout.modules]

    def is_distributed_parameter(self, param) -> bool:
        return id(param) in self._layout.distributed

    def is_distributed_buffer(self, buf) -> bool:
        return id(buf) in self._layout.distributed

    def is_scaled_batch_parameter(self, param) -> bool:
        """Whether ``param`` sees the TP group's whole batch (reduced over RDP_GROUP)."""
        return id(param) in self._layout.scaled_batch

    def is_scaled_batch_buffer(self, buf) -> bool:
        return id(buf) in self._layout.scaled_batch

    def default_reducer_named_parameters(self):
        """This rank's parameters whose gradients are reduced over DP_GROUP."""
        return [(n, p) for n, p in self.local_named_parameters()
                if id(p) not in self._layout.scaled_batch]

    def scaled_batch_reducer_named_parameters(self):
        """This rank's parameters whose gradients are reduced over RDP_GROUP."""
        return [(n, p) for n, p in self.local_named_parameters()
                if id(p) in self._layout.scaled_batch]

    # -- state dicts ------------------------------------------------------------------------
    def local_state_dict(self, *args, **kwargs) -> dict[str, Any]:
        """This rank's parameters and buffers, marked partial (under sharded data
        parallelism, this rank's chunks of the parameters)."""
        out: dict[str, Any] = {k: getattr(v, "ds_tensor", v).detach()
                               for k, v in self._named_tensors().items()}
        if self.sharded is not None:  # (sharded/layout.py)
            out["_smp_zero2d"] = True
            out["shard_size"] = self.sharded.parts
        out["_smp_is_partial"] = True
        return out

    def _named_tensors(self) -> dict[str, torch.Tensor]:
        """This rank's parameters (the objects) and persistent buffers, under every name
        (tied parameters under each)."""
        out: dict[str, torch.Tensor] = {}
        for name, module in self.local_named_modules():
            for pname, param in module.named_parameters(recurse=False):
                out[f"{name}.{pname}" if name else pname] = param
            for bname, buf in module.named_buffers(recurse=False):
                if buf is not None and bname not in module._non_persistent_buffers_set:
                    out[f"{name}.{bname}" if name else bname] = buf.detach()
        return out

    def _whole_local(self) -> dict[str, torch.Tensor]:
        """This rank's state with sharded parameters gathered whole (every rank of the
        sharding group calls it)."""
        if self.sharded is None:
            return {k: v for k, v in self.local_state_dict().items() if k != "_smp_is_partial"}
        full: dict[int, torch.Tensor] = {}
        out = {}
        for key, value in self._named_tensors().items():
            if hasattr(value, "ds_tensor"):
                if id(value) not in full:
                    full[id(value)] = self.sharded.full_value(value)
                value = full[id(value)]
            out[key] = value.detach()
        return out

    def state_dict(self, *args, **kwargs) -> dict[str, Any]:  # noqa: ARG002
        """The whole model's state under the plain module's names, split tensors gathered
        whole, from every pipeline and tensor-parallel rank (call it on all of them)."""
        from shoal.modelparallel.topology import CommGroup
        from shoal.modelparallel.torch import comm

        merged = self._layout.gather_full(self._whole_local())
        if self.partitioned and _state.require().topology.pp_size > 1:
            for part in comm.allgather(merged, CommGroup.PP_GROUP):
                merged.update(part)
        order = [k for k in self._user.state_dict() if k in merged]
        return {k: merged[k] for k in order + sorted(set(merged) - set(order))}

    def load_state_dict(self, state_dict: dict[str, Any], strict: bool = True):
        """Loads a full or a partial (``local_state_dict``) state; before partitioning,
        the load waits until the first step has partitioned the model."""
        if not self.partitioned:
            self._deferred_state = (dict(state_dict), strict)
            return None
        partial = bool(state_dict.get("_smp_is_partial"))
        if self.sharded is not None:
            return self._load_sharded(state_dict, partial, strict)
        state_dict = {k: v for k, v in state_dict.items() if k != "_smp_is_partial"}
        own = {k: v for k, v in self.local_state_dict().items() if k != "_smp_is_partial"}
        state_dict = self._under_own_names(state_dict, own, partial, strict)
        tp_rank = _state.require().topology.tp_rank
        with torch.no_grad():
            for key, tensor in own.items():
                if key in state_dict:
                    value = state_dict[key]
                    if not partial:  # a full state dict: this rank's part of split tensors
                        value = self._layout.shard(key, value, tp_rank)
                    tensor.copy_(value)
        return None

    def _under_own_names(self, state_dict: dict, own, partial: bool, strict: bool) -> dict:
        """A full state dict under the original model's names (a Hugging Face checkpoint)
        translated, as SMP does, by the translators of the modules replaced; with
        ``strict``, every entry this rank holds must be there."""
        if not partial and any(k not in state_dict for k in own):
            for translate in _tp_registry.translators(self._user):
                state_dict = translate(state_dict)
        missing = [k for k in own if k not in state_dict]
        if strict and missing:
            raise KeyError(f"the state dict lacks this rank's entries: {missing[:5]}")
        return state_dict

    def _load_sharded(self, state_dict: dict[str, Any], partial: bool, strict: bool):
        """Sharded data parallelism: a partial state holds this rank's chunks, a full one
        whole tensors (Hugging Face names translated, tensor-parallel parts cut)."""
        from shoal.modelparallel.errors import SMPCheckpointError
        from shoal.modelparallel.torch.sharded import layout

        if partial and not state_dict.get("_smp_zero2d"):
            raise SMPCheckpointError("Error: trying to load a non-sharded checkpoint into "
                                     "sharded data parallelism model!")
        state_dict = {k: v for k, v in state_dict.items()
                      if k not in ("_smp_is_partial", "_smp_zero2d", "shard_size")}
        own = self._named_tensors()
        state_dict = self._under_own_names(state_dict, own, partial, strict)
        st = _state.require()
        sharded = self.sharded
        with torch.no_grad():
            for key, tensor in own.items():
                if key not in state_dict:
                    continue
                value = state_dict[key]
                if not hasattr(tensor, "ds_tensor"):
                    tensor.copy_(value if partial else
                                 self._layout.shard(key, value, st.topology.tp_rank))
                    continue
                if not partial:
                    whole = self._layout.shard(key, value, st.topology.tp_rank)
                    value = layout.chunk_of(whole.reshape(-1), sharded.parts, sharded.groups.rank)
                tensor.ds_tensor.copy_(value)
        if hasattr(st.optimizer, "refresh_masters"):
            st.optimizer.refresh_masters()
        sharded.refresh_persistent()
        return None


def half_dtype(cfg) -> torch.dtype | None:
    """The parameters' dtype under ``fp16`` (or its deprecated ``fp16_params``) / ``bf16``."""
    if cfg.fp16 or cfg.fp16_params:
        return torch.float16
    if cfg.bf16:
        return torch.bfloat16
    return None


def _cast_floating(value: Any, dtype: torch.dtype) -> Any:
    """``value`` with its floating tensors (nested in lists, tuples, dicts, and
    dataclass-like model outputs) in ``dtype``."""
    from torch.utils._pytree import tree_map

    def cast(t):
        if isinstance(t, torch.Tensor) and t.is_floating_point() and t.dtype != dtype:
            return t.to(dtype)
        return t

    if hasattr(value, "to_tuple") and hasattr(value, "keys"):  # a transformers ModelOutput
        for key in list(value.keys()):
            value[key] = tree_map(cast, value[key])
        return value
    return tree_map(cast, value)


def _scaled_roots(tensors, grad_tensors, scale: float):
    """The backward's roots with their gradients times ``scale``: averaging over the
    microbatches once at the root of each microbatch's backward, instead of once per
    parameter and microbatch, scales every gradient that flows from it, on every rank."""
    tensors = [tensors] if isinstance(tensors, torch.Tensor) else list(tensors)
    if grad_tensors is None:
        grad_tensors = [None] * len(tensors)
    elif isinstance(grad_tensors, torch.Tensor):
        grad_tensors = [grad_tensors]
    grads = [torch.full_like(t, scale) if g is None else g * scale
             for t, g in zip(tensors, grad_tensors)]
    return tensors, grads


def _tensor_bytes(value: Any) -> int:
    from torch.utils._pytree import tree_leaves

    return sum(t.numel() * t.element_size() for t in tree_leaves(value)
               if isinstance(t, torch.Tensor))


def _raw(tensor: torch.Tensor) -> np.ndarray:
    return tensor.reshape(-1).view(torch.uint8).numpy()
