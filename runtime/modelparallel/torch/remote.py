"""A module call that runs on the rank owning the module, with autograd across the ranks.

The caller sends the call's arguments (tensors as their bytes, everything else pickled in
place) and waits; the owner runs the module's own forward and sends the outputs back. The
caller's side is an autograd function, so its backward sends the outputs' gradients to the
owner, which runs the backward of the graph it kept for that call and sends the inputs'
gradients back. A zero-size tensor that requires grad rides along with every call made with
grad enabled: the owner's parameters need the backward even when no input requires grad.
"""

from __future__ import annotations

import io
import pickle
from typing import Any, NamedTuple

import attrs
import torch


class _TensorPickler(pickle.Pickler):
    """Pickles a structure with its tensors taken out (sent as bytes, beside it)."""

    def __init__(self, buffer, tensors: list[torch.Tensor]) -> None:
        super().__init__(buffer, protocol=pickle.HIGHEST_PROTOCOL)
        self._tensors = tensors

    def persistent_id(self, obj):
        if isinstance(obj, torch.Tensor):
            self._tensors.append(obj)
            return len(self._tensors) - 1
        return None


class _TensorUnpickler(pickle.Unpickler):
    def __init__(self, buffer, tensors: list[torch.Tensor]) -> None:
        super().__init__(buffer)
        self._tensors = tensors

    def persistent_load(self, pid):
        return self._tensors[pid]


# The two commonest structures go without a pickle (whose stream starts with PROTO, 0x80):
_ONE_TENSOR = b"T"  # a module's output that is one tensor
_TENSOR_ARGS = b"A"  # a call's (args, kwargs) with only tensors in args and no kwargs


def pack(structure: Any) -> tuple[bytes, list[torch.Tensor]]:
    """The structure's pickle with tensors as references, and the tensors in order."""
    if type(structure) is torch.Tensor:
        return _ONE_TENSOR, [structure]
    if (type(structure) is tuple and len(structure) == 2 and type(structure[0]) is tuple
            and type(structure[1]) is dict and not structure[1]
            and all(type(a) is torch.Tensor for a in structure[0])):
        return _TENSOR_ARGS, list(structure[0])
    tensors: list[torch.Tensor] = []
    buffer = io.BytesIO()
    _TensorPickler(buffer, tensors).dump(structure)
    return buffer.getvalue(), tensors


def unpack(blob: bytes, tensors: list[torch.Tensor]) -> Any:
    if blob == _ONE_TENSOR:
        return tensors[0]
    if blob == _TENSOR_ARGS:
        return tuple(tensors), {}
    return _TensorUnpickler(io.BytesIO(blob), tensors).load()


# The messages' metadata: named tuples, which pickle without a Python-level __getstate__.
class CallRequest(NamedTuple):
    """A forward request: which module, for which microbatch, and how to rebuild the args."""

    call_id: int
    microbatch: int
    module: str
    blob: bytes
    grad_enabled: bool


class CallReply(NamedTuple):
    call_id: int
    blob: bytes
    error: str | None = None


class GradRequest(NamedTuple):
    call_id: int
    microbatch: int
    present: tuple[int, ...]  # which outputs have a gradient (the others had none)


class GradReply(NamedTuple):
    call_id: int
    present: tuple[int, ...]  # which inputs get a gradient
    error: str | None = None


@attrs.define
class KeptCall:
    """What the owner keeps between a call's forward and its backward."""

    inputs: list[torch.Tensor]
    outputs: list[torch.Tensor]


def differentiable(tensor: torch.Tensor) -> bool:
    return tensor.is_floating_point() or tensor.is_complex()


def mark_inputs(tensors: list[torch.Tensor], requires_grad) -> list[torch.Tensor]:
    """Received inputs that required grad on the caller become leaves that require it here."""
    for tensor, flag in zip(tensors, requires_grad):
        if flag and differentiable(tensor):
            tensor.requires_grad_(True)
    return tensors


def run_backward(kept: KeptCall, present: tuple[int, ...], grads: list[torch.Tensor]):
    """Runs the owner's part of the backward; returns the input positions and gradients."""
    pairs = [(kept.outputs[i], g) for i, g in zip(present, grads)
             if kept.outputs[i].requires_grad]
    if pairs:
        torch.autograd.backward([o for o, _ in pairs], [g for _, g in pairs])
    found = [(i, t.grad) for i, t in enumerate(kept.inputs)
             if t.requires_grad and t.grad is not None]
    return tuple(i for i, _ in found), [g for _, g in found]


class RemoteFunction(torch.autograd.Function):
    """The caller's node for a remote call: forward and backward cross to the owner."""

    @staticmethod
    def forward(ctx, call, anchor, *inputs):  # noqa: ARG004 - anchor only carries grad
        outputs = call.run_forward()
        ctx.call = call
        ctx.set_materialize_grads(False)
        ctx.input_count = len(inputs)
        fixed = [o for o in outputs if not differentiable(o)]
        if fixed:
            ctx.mark_non_differentiable(*fixed)
        return tuple(outputs)

    @staticmethod
    def backward(ctx, *grads):
        call, ctx.call = ctx.call, None
        input_grads = call.run_backward(list(grads), ctx.input_count)
        return (None, None, *input_grads)
