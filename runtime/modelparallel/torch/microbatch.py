"""Microbatches of an ``smp.step`` call: its arguments split, its outputs gathered.

This is the part of ``@smp.step`` that needs no communication:

* ``split_arguments`` turns one call's arguments into one ``(args, kwargs)`` per
  microbatch. Tensors, also inside lists, tuples (namedtuples keep their type), dicts and
  sets, are cut into contiguous chunks along the batch axis (0, or the argument's entry of
  ``input_split_axes``): microbatch k gets rows k*B/m .. (k+1)*B/m - 1, as views. Objects
  with a method ``smp_slice(num_mb, mb, axis)`` are replaced by what it returns. Anything
  else (modules, optimizers, numbers, strings, devices, ``argparse.Namespace``) is passed
  to every microbatch as the same object, as are the arguments named in
  ``non_split_inputs``.
* ``convert_outputs`` turns the step function's return values, one per microbatch, into
  one value of the same structure: a ``StepOutput`` at each tensor position, a plain list
  by microbatch at every other position.
* ``output_bytes`` / ``warn_if_large``: what returning tensors costs, since every
  returned tensor is broadcast to the other pipeline ranks.
"""

from __future__ import annotations

import collections.abc
import copy
import functools
import inspect
import sys
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import torch

__all__ = [
    "DEFAULT_LARGE_OUTPUT_BYTES",
    "LargeOutputWarning",
    "StepOutput",
    "convert_outputs",
    "divisibility_error_message",
    "output_bytes",
    "split_arguments",
    "warn_if_large",
]

# SMP's text for a batch the microbatches do not divide (PyTorch variant); scripts and
# users search for it, so it is kept word for word.
_DIVISIBILITY_TEXT = (
    "Batch size must be divisible by the number of microbatches. Found batch size={batch}, "
    "number of microbatches={microbatches}. If this is the last batch of the epoch, size of "
    "the current batch might be smaller than the regular batch size you chose. If this is "
    "the case, you can set drop_last=True in your DataLoader to skip this batch, or you can "
    "manually skip this batch. If this is a tensor with no batch dimension, you can specify "
    "its argument name in 'non_split_inputs' argument to smp.step, so that smp does not "
    "attempt to split this tensor. If the batch dimension is not 0th axis, you can specify "
    "the batch axis within 'input_split_axis' argument to smp.step function. For details, "
    "visit SageMaker distributed model parallelism documentation for smp.step: "
    "https://sagemaker.readthedocs.io/en/stable/api/training/smd_model_parallel.html"
)

DEFAULT_LARGE_OUTPUT_BYTES = 256 * 1024 * 1024

# Keys of the warnings already given in this process: each is given once, since a step
# runs thousands of times and the advice does not change.
_warned: set[str] = set()


def divisibility_error_message(batch_size: int, microbatches: int) -> str:
    """SMP's message for a batch of ``batch_size`` that ``microbatches`` does not divide."""
    return _DIVISIBILITY_TEXT.format(batch=batch_size, microbatches=microbatches)


# ---------------------------------------------------------------------------------------
# Splitting the arguments
# ---------------------------------------------------------------------------------------

def split_arguments(
    function: Callable,
    args: tuple,
    kwargs: dict | None,
    microbatches: int,
    non_split_inputs: Iterable[str] | None = None,
    input_split_axes: Mapping[str, int] | None = None,
) -> list[tuple[tuple, dict]]:
    """The ``(args, kwargs)`` to call ``function`` with for each of ``microbatches``.

    ``non_split_inputs`` and ``input_split_axes`` name parameters of ``function``; when it
    takes ``**kwargs`` they may also name keys passed through it (any name is accepted
    then, since an optional keyword may be absent from one call). A name of the ``*args``
    parameter applies to every positional argument it collects.
    """
    _check_microbatches(microbatches)
    signature = inspect.signature(function)
    bound = signature.bind(*args, **(kwargs or {}))
    non_split, axes = _check_names(function, signature, non_split_inputs, input_split_axes)
    per_name = {
        name: _split_parameter(signature.parameters[name], value, microbatches, non_split, axes)
        for name, value in bound.arguments.items()
    }
    return [_call_arguments(signature, per_name, k) for k in range(microbatches)]


def _check_microbatches(microbatches: int) -> None:
    if isinstance(microbatches, bool) or not isinstance(microbatches, int) or microbatches < 1:
        raise ValueError(f"The number of microbatches must be a positive int; got {microbatches!r}.")


def _check_names(function, signature, non_split_inputs, input_split_axes):
    """The non-split names as a set and the split axes as a dict, both validated."""
    if isinstance(non_split_inputs, str):  # one name given bare, not as a list
        non_split_inputs = [non_split_inputs]
    non_split = set(non_split_inputs or ())
    axes = dict(input_split_axes or {})
    for name in non_split | set(axes):
        if not isinstance(name, str):
            raise ValueError(f"non_split_inputs and input_split_axes take argument names; got {name!r}.")
    for name, axis in axes.items():
        if isinstance(axis, bool) or not isinstance(axis, int):
            raise ValueError(f"input_split_axes['{name}'] must be an int axis; got {axis!r}.")
    takes_any = any(p.kind is p.VAR_KEYWORD for p in signature.parameters.values())
    unknown = sorted((non_split | set(axes)) - set(signature.parameters))
    if unknown and not takes_any:
        where = getattr(function, "__qualname__", repr(function))
        raise ValueError(
            f"non_split_inputs / input_split_axes name {unknown}, which are not parameters of "
            f"the smp.step function {where}{signature}."
        )
    return non_split, axes


def _split_parameter(parameter, value, m, non_split, axes) -> list:
    """One parameter's value for each microbatch; ``*args`` / ``**kwargs`` per element."""
    name = parameter.name
    if parameter.kind is parameter.VAR_POSITIONAL:
        parts = [
            _split_argument(name, f"{name}[{i}]", item, m, name in non_split, axes.get(name, 0))
            for i, item in enumerate(value)
        ]
        return [tuple(part[k] for part in parts) for k in range(m)]
    if parameter.kind is parameter.VAR_KEYWORD:
        # A key passed through **kwargs is named by the caller, so it is looked up by its
        # own name first, then by the name of the **kwargs parameter.
        parts = {
            key: _split_argument(key, key, item, m, key in non_split or name in non_split,
                                 axes.get(key, axes.get(name, 0)))
            for key, item in value.items()
        }
        return [{key: part[k] for key, part in parts.items()} for k in range(m)]
    return _split_argument(name, name, value, m, name in non_split, axes.get(name, 0))


def _split_argument(name: str, where: str, value, m: int, whole: bool, axis: int) -> list:
    _warn_if_misplaced(where, value)
    if whole:
        return [value] * m
    return _split(value, m, axis, name, (where,))


def _call_arguments(signature, per_name: dict, k: int) -> tuple[tuple, dict]:
    # BoundArguments turns the per-parameter values back into args and kwargs the way
    # the signature needs them (positional-only first, *args expanded, keywords last).
    bound = inspect.BoundArguments(signature, {name: parts[k] for name, parts in per_name.items()})
    return bound.args, bound.kwargs


def _split(value, m: int, axis: int, name: str, path: tuple) -> list:
    """``value`` for each of ``m`` microbatches. ``name`` is the top-level argument's name
    (the one ``non_split_inputs`` takes), ``path`` locates ``value`` inside it."""
    if _has_smp_slice(value):
        # Called even for one microbatch: the object decides what its slice is.
        return [value.smp_slice(m, k, axis) for k in range(m)]
    if isinstance(value, torch.Tensor):
        return _split_tensor(value, m, axis, name, path)
    if isinstance(value, (collections.abc.Mapping, list, tuple, set, frozenset)):
        return _split_container(value, m, axis, name, path)
    return [value] * m


def _has_smp_slice(value) -> bool:
    # A class that defines smp_slice is an argument like any other, not a sliceable batch.
    return not isinstance(value, type) and callable(getattr(value, "smp_slice", None))


def _split_tensor(tensor: torch.Tensor, m: int, axis: int, name: str, path: tuple) -> list:
    where = "".join(path)
    shape = list(tensor.shape)
    if tensor.dim() == 0:
        raise ValueError(
            f"Argument '{where}' is a 0-dim tensor: it has no batch dimension to split into "
            f"microbatches. List '{name}' in the 'non_split_inputs' argument of smp.step so "
            f"that it is passed whole to every microbatch."
        )
    if not -tensor.dim() <= axis < tensor.dim():
        raise ValueError(
            f"Argument '{where}' (shape {shape}): split axis {axis} from 'input_split_axes' is "
            f"out of range for a tensor with {tensor.dim()} dimension(s)."
        )
    size = tensor.size(axis)
    if size % m:
        raise ValueError(f"Argument '{where}' (shape {shape}): " + divisibility_error_message(size, m))
    if m == 1:
        return [tensor]
    chunk = size // m
    return [tensor.narrow(axis, k * chunk, chunk) for k in range(m)]


def _split_container(value, m: int, axis: int, name: str, path: tuple) -> list:
    labels, children, rebuild = _unpack(value)
    parts = [_split(child, m, axis, name, path + (label,)) for label, child in zip(labels, children)]
    # A container with nothing to split stays the same object for every microbatch, like
    # any other pass-through argument (a list of strings, a config dict).
    if all(part[k] is child for part, child in zip(parts, children) for k in range(m)):
        return [value] * m
    return [rebuild([part[k] for part in parts]) for k in range(m)]


def _unpack(value):
    """``(labels, children, rebuild)`` of a container; ``rebuild(children)`` makes a new one."""
    if isinstance(value, collections.abc.Mapping):
        keys = list(value.keys())
        return ([f"[{key!r}]" for key in keys], [value[key] for key in keys],
                lambda children: _rebuild_mapping(value, dict(zip(keys, children))))
    if isinstance(value, (set, frozenset)):
        # Each element is split on its own, so the iteration order of the set does not
        # matter: microbatch k's set holds chunk k of every element.
        return [" (a set element)"] * len(value), list(value), _rebuilder(value)
    if _is_namedtuple(value):
        return [f".{field}" for field in value._fields], list(value), _rebuilder(value)
    return [f"[{i}]" for i in range(len(value))], list(value), _rebuilder(value)


def _rebuilder(value) -> Callable[[list], Any]:
    if _is_namedtuple(value):
        return lambda children: type(value)(*children)
    if type(value) in (list, tuple, set, frozenset):
        return type(value)
    return lambda children: type(value)(children)


def _is_namedtuple(value) -> bool:
    return isinstance(value, tuple) and hasattr(type(value), "_fields")


def _rebuild_mapping(original: Mapping, items: dict) -> Mapping:
    """A mapping of ``original``'s type holding ``items``, or a dict if it cannot be built."""
    if type(original) is dict:
        return items
    try:  # OrderedDict, BatchEncoding, transformers' ModelOutput
        return type(original)(items)
    except Exception:
        pass
    if isinstance(original, collections.abc.MutableMapping):
        try:  # defaultdict and other mappings whose constructor takes something else
            rebuilt = copy.copy(original)
            rebuilt.clear()
            rebuilt.update(items)
            return rebuilt
        except Exception:
            pass
    return items


@functools.cache  # built once: it is consulted for every argument of every step
def _misplaced_kinds() -> tuple:
    """(class, kind, advice) of arguments that usually do not belong in a step function."""
    from torch.optim import lr_scheduler
    from torch.utils import data

    outside = "call it after smp.step returns, outside the step function"
    batches = "iterate over it outside smp.step and pass the batch, which smp.step splits"
    return (
        (torch.optim.Optimizer, "torch.optim.Optimizer", outside),
        ((lr_scheduler.LRScheduler, lr_scheduler.ReduceLROnPlateau), "learning rate scheduler", outside),
        (data.DataLoader, "DataLoader", batches),
        (data.Dataset, "Dataset", batches),
        (data.Sampler, "Sampler", batches),
    )


def _warn_if_misplaced(where: str, value) -> None:
    for cls, kind, advice in _misplaced_kinds():
        if isinstance(value, cls):
            _warn_once(
                kind,
                f"Argument '{where}' of the smp.step function is a {kind} "
                f"({type(value).__name__}). smp.step runs the function once per microbatch and "
                f"passes it unchanged to each; {advice}.",
                UserWarning,
            )
            return


def _warn_once(key: str, message: str, category: type[Warning]) -> None:
    if key in _warned:
        return
    _warned.add(key)
    warnings.warn(message, category, stacklevel=_caller_level())


def _caller_level() -> int:
    """The stacklevel of the first frame outside this module, the one a warning is about."""
    frame, level = sys._getframe(1), 1
    while frame is not None and frame.f_globals.get("__name__") == __name__:
        frame, level = frame.f_back, level + 1
    return level


# ---------------------------------------------------------------------------------------
# Outputs
# ---------------------------------------------------------------------------------------

class StepOutput:
    """The values one tensor output of a step took, one tensor per microbatch."""

    def __init__(self, outputs: Iterable[torch.Tensor]) -> None:
        self.outputs = list(outputs)

    def reduce_sum(self) -> torch.Tensor:
        self._check_not_empty("reduce_sum")
        total = self.outputs[0]
        for output in self.outputs[1:]:
            total = total + output
        # One microbatch: a copy, so that changing the result leaves the output alone.
        return total.clone() if len(self.outputs) == 1 else total

    def reduce_mean(self) -> torch.Tensor:
        self._check_not_empty("reduce_mean")
        return self.reduce_sum() / len(self.outputs)

    def concat(self) -> torch.Tensor:
        return self.merge(0)

    def merge(self, axis: int = 0) -> torch.Tensor:
        """The outputs concatenated along ``axis``."""
        self._check_not_empty("concat")
        # torch.cat refuses 0-dim tensors; a per-microbatch scalar then concatenates as a
        # one-element vector, which is what a batch of such scalars means.
        outputs = [o.reshape(1) if o.dim() == 0 else o for o in self.outputs]
        return torch.cat(outputs, dim=axis)

    def stack(self, dim: int = 0) -> torch.Tensor:
        self._check_not_empty("stack")
        return torch.stack(self.outputs, dim=dim)

    def detach(self) -> StepOutput:
        return StepOutput(output.detach() for output in self.outputs)

    def __len__(self) -> int:
        return len(self.outputs)

    def __getitem__(self, index):
        if isinstance(index, slice):
            return StepOutput(self.outputs[index])
        return self.outputs[index]

    def __iter__(self) -> Iterator[torch.Tensor]:
        return iter(self.outputs)

    def __repr__(self) -> str:
        outputs = self.outputs
        if not outputs or not all(isinstance(o, torch.Tensor) for o in outputs):
            return f"StepOutput({outputs!r})"
        first = outputs[0]
        grad = ", requires_grad=True" if any(o.requires_grad for o in outputs) else ""
        if any(o.shape != first.shape or o.dtype != first.dtype for o in outputs):
            shapes = [list(o.shape) for o in outputs]
            return f"StepOutput({len(outputs)} microbatches of shapes {shapes}{grad})"
        if first.dim() == 0:
            values = [o.item() for o in outputs]
            return f"StepOutput({len(outputs)} microbatches: {values}, dtype={first.dtype}{grad})"
        return (f"StepOutput({len(outputs)} microbatches of shape {list(first.shape)}, "
                f"dtype={first.dtype}{grad})")

    def _check_not_empty(self, method: str) -> None:
        if not self.outputs:
            raise ValueError(f"StepOutput.{method}() of a StepOutput with no outputs.")


def convert_outputs(per_microbatch: list, detach: bool = True):
    """One value shaped like each microbatch's return value of the step function.

    Each tensor position becomes a ``StepOutput`` of that position's tensors by
    microbatch (detached if ``detach``); each other position becomes a plain list by
    microbatch. Lists, tuples (namedtuples keep their type) and mappings are recursed
    into; other types, including subclasses of list and tuple, are values. A step that
    returns None gives ``[None] * m``, as in SMP: None is a non-tensor value like any other.
    """
    if not per_microbatch:
        raise ValueError("convert_outputs needs the return value of at least one microbatch.")
    return _convert(list(per_microbatch), detach, "")


def _convert(values: list, detach: bool, path: str):
    first = values[0]
    for k, value in enumerate(values[1:], 1):
        if _structure(value) != _structure(first):
            raise ValueError(
                f"The smp.step function returned different structures for different "
                f"microbatches: at output{path}, microbatch 0 returned {_describe(first)} but "
                f"microbatch {k} returned {_describe(value)}."
            )
    if isinstance(first, torch.Tensor):
        return StepOutput(v.detach() if detach else v for v in values)
    if _is_output_container(first):
        labels, children, rebuild = _unpack(first)
        if isinstance(first, collections.abc.Mapping):  # by key: the order may differ
            columns = [[value[key] for value in values] for key in first.keys()]
        else:
            columns = zip(*values)
        return rebuild([_convert(list(col), detach, path + label) for label, col in zip(labels, columns)])
    return list(values)


def _is_output_container(value) -> bool:
    return type(value) in (list, tuple) or _is_namedtuple(value) or isinstance(value, collections.abc.Mapping)


def _structure(value):
    """What must agree between microbatches at one position of the output."""
    if isinstance(value, torch.Tensor):
        return "tensor"
    if isinstance(value, collections.abc.Mapping):
        return (type(value), frozenset(value.keys()))
    if _is_output_container(value):
        return (type(value), len(value))
    return "value"


def _describe(value) -> str:
    if isinstance(value, torch.Tensor):
        return f"a tensor of shape {list(value.shape)}"
    if isinstance(value, collections.abc.Mapping):
        return f"a {type(value).__name__} with keys {list(value.keys())}"
    if _is_output_container(value):
        return f"a {type(value).__name__} of length {len(value)}"
    return "None" if value is None else f"a {type(value).__name__}"


# ---------------------------------------------------------------------------------------
# Output size
# ---------------------------------------------------------------------------------------

class LargeOutputWarning(UserWarning):
    """A step returns tensors large enough that broadcasting them costs real time."""


def output_bytes(value) -> int:
    """Total bytes of the tensors in ``value`` (nested lists, tuples, sets, mappings, StepOutputs)."""
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, StepOutput):
        value = value.outputs
    if isinstance(value, collections.abc.Mapping):
        value = value.values()
    if isinstance(value, (list, tuple, set, frozenset, collections.abc.ValuesView)):
        return sum(output_bytes(item) for item in value)
    return 0


def warn_if_large(value, threshold_bytes: int = DEFAULT_LARGE_OUTPUT_BYTES) -> int:
    """Warn, once per process, if ``value`` (a step's returns, all microbatches) holds more
    than ``threshold_bytes`` of tensors. Returns the byte count."""
    size = output_bytes(value)
    if size > threshold_bytes:
        _warn_once(
            "large-output",
            f"The smp.step function returns {size} bytes of tensors per step. Every tensor a "
            f"step returns is broadcast from the first pipeline rank to the other pipeline "
            f"ranks after each microbatch; return what the training loop needs (the loss), "
            f"not large intermediate tensors such as activations.",
            LargeOutputWarning,
        )
    return size
