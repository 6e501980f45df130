"""``offload_activations``: the activations checkpointing keeps, held in host memory.

Activation checkpointing keeps only the inputs of each checkpointed module for the backward
(activations.py). With ``offload_activations: True`` those inputs are packed through
``torch.autograd.graph.saved_tensors_hooks`` around the checkpointed call: a tensor on an
accelerator is copied to (pinned, when CUDA is available) host memory right after the
forward, and its accelerator copy is dropped. In the backward, when a checkpointed module's
inputs are unpacked for its recomputation, they are copied back, together with those of the
``activation_loading_horizon`` - 1 modules that ran just before it (the next ones the
backward reaches), so that at most ``activation_loading_horizon`` modules' inputs are
brought back ahead.

On the CPU the inputs already are in host memory: packing keeps the tensor itself (no copy)
and unpacking returns it, so training gives exactly the numbers it gives without
offloading. The hooks still run, which :data:`stats` counts.

Offloading acts only on checkpointed modules, as in SMP; with none, it does nothing (logged
once).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import weakref

import attrs
import torch
from shoal.modelparallel.torch import state as _state

log = logging.getLogger("shoal.modelparallel")


@attrs.define
class Stats:
    packed: int = 0  # tensors handed to the hooks in forwards
    moved: int = 0  # of them, those copied to host memory (on an accelerator)
    unpacked: int = 0


stats = Stats()
_lock = threading.Lock()
# The checkpointed calls whose inputs are held, in forward order; each lives as long as the
# autograd graph that can unpack it (a forward without backward leaves nothing behind).
_layers: list[weakref.ref] = []
_warned = False


@attrs.define(eq=False)
class _Held:
    device: torch.device
    host: torch.Tensor
    loaded: torch.Tensor | None = None

    def load(self) -> None:
        if self.loaded is None:
            self.loaded = self.host.to(self.device, non_blocking=self.host.is_pinned())


@attrs.define(eq=False)
class _Layer:
    held: list = attrs.Factory(list)  # those copied to host memory
    pending: int = 0  # tensors not yet unpacked


def enabled() -> bool:
    st = _state.current()
    return bool(st is not None and st.cfg.offload_activations)


def saving():
    """The context a checkpointed call runs in: its saved inputs are offloaded (a no-op
    context unless ``offload_activations`` is set)."""
    if not enabled():
        return contextlib.nullcontext()
    layer = _Layer()
    with _lock:
        _layers[:] = [ref for ref in _layers if ref() is not None]
        _layers.append(weakref.ref(layer))
    return torch.autograd.graph.saved_tensors_hooks(
        lambda t: _pack(layer, t), lambda h: _unpack(layer, h))


def _pack(layer: _Layer, tensor: torch.Tensor):
    stats.packed += 1
    layer.pending += 1
    if tensor.device.type == "cpu":
        held = tensor  # already in host memory
    else:
        host = torch.empty(tensor.shape, dtype=tensor.dtype, layout=tensor.layout,
                           pin_memory=torch.cuda.is_available())
        host.copy_(tensor, non_blocking=True)
        held = _Held(tensor.device, host)
        stats.moved += 1
        layer.held.append(held)
    return held


def _unpack(layer: _Layer, held):
    stats.unpacked += 1
    _prefetch(layer)
    layer.pending = max(layer.pending - 1, 0)
    if layer.pending == 0:
        with _lock:
            _layers[:] = [ref for ref in _layers if ref() not in (None, layer)]
    if isinstance(held, _Held):
        held.load()
        out, held.loaded = held.loaded, None  # the host copy stays, for a second backward
        return out
    return held


def _prefetch(layer: _Layer) -> None:
    """Brings back ``layer``'s inputs and those of the modules that ran before it, up to
    ``activation_loading_horizon`` modules in all."""
    horizon = _state.require().cfg.activation_loading_horizon
    with _lock:
        alive = [ref() for ref in _layers]
        if layer not in alive:
            return
        at = alive.index(layer)
        ahead = [each for each in alive[max(at - horizon + 1, 0):at + 1] if each is not None]
    for each in ahead:
        for held in each.held:
            held.load()


def note_partitioned(has_checkpointing: bool) -> None:
    """At partitioning: says once that offloading needs checkpointed modules."""
    global _warned
    if enabled() and not has_checkpointing and not _warned:
        _warned = True
        log.info("offload_activations is set but no module is checkpointed: offloading "
                 "acts only on the activations activation checkpointing keeps, so it does "
                 "nothing here")
