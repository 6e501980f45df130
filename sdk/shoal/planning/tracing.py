"""A PyTorch model's profile for the planner, read by building and running it on the meta device.

``my_model.py:build`` names a factory returning an ``nn.Module``. The factory runs under
``torch.device("meta")``, so no weight is allocated, and one forward with a sample input of the
given shape is traced: torch's ``FlopCounterMode`` counts the FLOPs, a saved-tensors hook the
bytes autograd keeps for the backward (those a Linear saves, its input, are what tensor
parallelism splits: SMP's ``DistributedLinear`` splits its input features and sums the
partial products, so the rest stays whole on every rank), forward hooks each block's output.
The model's layers are its main stack of identical blocks (the ``ModuleList`` or
``nn.Sequential`` of one class holding the most parameters), with what runs before and after
it as two more layers.
"""

from __future__ import annotations

import importlib.util
import os
import sys

from shoal.errors import ValidationError
from shoal.planning.models import Layer, ModelProfile


def load_factory(spec: str):
    """The callable ``path.py:name`` names (the file is imported as a module)."""
    path, sep, name = str(spec).rpartition(":")
    if not sep or not path.endswith(".py") or not name.isidentifier():
        raise ValidationError(f"model factory {spec!r} must be written file.py:function "
                              "(a function returning an nn.Module)")
    if not os.path.isfile(path):
        raise ValidationError(f"model factory file {path!r} does not exist")
    module_spec = importlib.util.spec_from_file_location("_shoal_model_factory", path)
    module = importlib.util.module_from_spec(module_spec)
    sys.path.insert(0, os.path.dirname(os.path.abspath(path)))
    try:
        module_spec.loader.exec_module(module)
    except Exception as exc:  # the user's file: report it as an input error
        raise ValidationError(f"importing {path!r} failed: {type(exc).__name__}: {exc}") from None
    finally:
        sys.path.pop(0)
    factory = getattr(module, name, None)
    if not callable(factory):
        raise ValidationError(f"{path!r} has no function {name!r}")
    return factory


def main_stack(model):
    """The (name, blocks) of the model's main stack of identical blocks, or None: the
    runtime's own rule (:mod:`shoal.modelparallel.stacks`), so that the blocks a plan
    checkpoints are those ``SHOAL_ACTIVATION_CHECKPOINTING=blocks`` checkpoints."""
    from shoal.modelparallel.stacks import main_stack as stack_of

    modules = dict(model.named_modules())
    name = stack_of(modules)
    return None if name is None else (name, list(modules[name].children()))


def profile_factory(spec: str, sample_shape, *, name: str | None = None,
                    measure_blocks: bool = False) -> ModelProfile:
    """Build ``spec``'s model on the meta device and profile it with a sample input; with
    ``measure_blocks``, time one block on this machine too (:mod:`shoal.planning.timing`)."""
    import torch

    factory = load_factory(spec)
    try:
        with torch.device("meta"):
            model = factory()
    except Exception as exc:  # the user's factory: say where it failed
        raise ValidationError(f"{spec!r} failed on the meta device: {type(exc).__name__}: "
                              f"{exc}") from None
    if not isinstance(model, torch.nn.Module):
        raise ValidationError(f"{spec!r} returned {type(model).__name__}, not an nn.Module")
    profile = profile_module(model, sample_shape, name=name or spec)
    if measure_blocks:
        from shoal.planning.timing import measure_block_speed

        profile = measure_block_speed(model, profile)
    return profile


def _sample(model, shape):
    import torch

    shape = tuple(int(d) for d in shape)
    if not shape or min(shape) < 1:
        raise ValidationError(f"sample input shape {shape} must be positive integers, batch "
                              "first (for example 8,3,224,224)")
    first = next((m for m in model.modules() if not list(m.children())), None)
    if isinstance(first, torch.nn.Embedding):
        return torch.zeros(shape, dtype=torch.long, device="meta")
    return torch.zeros(shape, device="meta")


def _bytes16(tensor) -> float:
    """Bytes at 16-bit precision (the profile's unit) for floating tensors, else as stored."""
    size = 2 if tensor.is_floating_point() else tensor.element_size()
    return float(tensor.numel() * size)


class _Trace:
    """Per-layer tallies while one forward runs."""

    def __init__(self, blocks):
        self.blocks = blocks
        self.current = "prologue"
        self.flops, self.saved, self.boundary, self.tp, self.ops = {}, {}, {}, {}, {}
        # what Linears save (their input): what tensor parallelism splits (module docstring)
        self.saved_split: dict[str, float] = {}
        self.in_linear = 0
        # where each module outside the blocks first ran, and every module's output bytes
        self.section: dict[int, str] = {}
        self.outputs: dict[str, float] = {}
        self.counter = None
        self.mark = 0.0
        self.block_input: list = []

    def total(self) -> float:
        return float(sum(self.counter.get_flop_counts().get("Global", {}).values()))

    def switch(self, to: str) -> None:
        now = self.total()
        self.flops[self.current] = self.flops.get(self.current, 0.0) + now - self.mark
        self.mark, self.current = now, to


def profile_module(model, sample_shape, *, name: str = "model") -> ModelProfile:
    """The profile of a (meta) ``model`` for one sample input of ``sample_shape``."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    stack = main_stack(model)
    blocks = stack[1] if stack else []
    trace = _Trace(blocks)
    param_ids = {id(p) for p in model.parameters()}
    # registered before the blocks' own hooks, so that a block's output counts as its own
    handles = _section_hooks(model, trace)
    for index, block in enumerate(blocks):
        handles.append(block.register_forward_pre_hook(
            lambda _m, args, i=index: _enter(trace, f"block{i}", args)))
        handles.append(block.register_forward_hook(lambda _m, _a, out, i=index: _leave(
            trace, f"block{i}", out)))
    for module in model.modules():
        if isinstance(module, torch.nn.Linear):  # what it saves meanwhile is split
            handles.append(module.register_forward_pre_hook(
                lambda _m, _a: _linear(trace, 1)))
            handles.append(module.register_forward_hook(lambda _m, _a, _o: _linear(trace, -1)))
        if isinstance(module, (torch.nn.Linear, torch.nn.Embedding)):
            handles.append(module.register_forward_hook(lambda _m, _a, out: _tp(trace, out)))

    def pack(tensor):
        base = tensor._base if tensor._base is not None else tensor  # weights saved as views
        if id(base) not in param_ids:
            key, size = trace.current, _bytes16(tensor)
            trace.saved[key] = trace.saved.get(key, 0.0) + size
            if trace.in_linear:
                trace.saved_split[key] = trace.saved_split.get(key, 0.0) + size
        return tensor

    x = _sample(model, sample_shape)
    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), \
                FlopCounterMode(display=False) as counter, _op_counter(trace):
            trace.counter = counter
            out = model(x)
            trace.switch("done")
    except Exception as exc:  # the user's model: say which input it refused
        raise ValidationError(f"{name}: one forward on the meta device with a sample input of "
                              f"shape {tuple(x.shape)} failed: {type(exc).__name__}: {exc}") from None
    finally:
        for handle in handles:
            handle.remove()
    return _profile(model, name, stack, trace, x.shape[0], out)


def _section_hooks(model, trace: _Trace) -> list:
    """Hooks that note where each module first runs (the prologue before the blocks, the
    epilogue after them: a language model's head runs last, wherever it was defined) and
    add every module's output to its section's bytes."""
    handles = []
    for module in model.modules():
        handles.append(module.register_forward_pre_hook(lambda m, _a: _note_section(trace, m)))
        if module is not model:  # the model's output is its last module's, counted there
            handles.append(module.register_forward_hook(lambda _m, _a, out: _count_output(
                trace, out)))
    return handles


def _note_section(trace: _Trace, module) -> None:  # a pre-hook's value would replace the input
    trace.section.setdefault(id(module), trace.current)


def _count_output(trace: _Trace, out) -> None:
    trace.outputs[trace.current] = trace.outputs.get(trace.current, 0.0) + _out_bytes(out)


def _op_counter(trace: _Trace):
    """A dispatch mode that counts the operations each layer's forward dispatches."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            trace.ops[trace.current] = trace.ops.get(trace.current, 0) + 1
            return func(*args, **(kwargs or {}))

    return Count()


def _enter(trace: _Trace, name: str, args) -> None:
    trace.switch(name)
    if name == "block0":  # what a block is called with, for timing one on this machine
        trace.block_input = [(tuple(a.shape), str(a.dtype).replace("torch.", ""))
                             for a in args if hasattr(a, "shape")]


def _leave(trace: _Trace, name: str, out) -> None:
    trace.switch("epilogue")
    tensors = [out] if hasattr(out, "numel") else [t for t in _flat(out) if hasattr(t, "numel")]
    trace.boundary[name] = sum(_bytes16(t) for t in tensors)


def _linear(trace: _Trace, step: int) -> None:
    trace.in_linear += step


def _tp(trace: _Trace, out) -> None:
    if hasattr(out, "numel"):
        trace.tp[trace.current] = trace.tp.get(trace.current, 0.0) + _bytes16(out)


def _flat(value):
    if isinstance(value, (list, tuple)):
        for item in value:
            yield from _flat(item)
    elif isinstance(value, dict):
        for item in value.values():
            yield from _flat(item)
    else:
        yield value


def _profile(model, name, stack, trace: _Trace, batch: int, out) -> ModelProfile:
    import torch

    blocks = trace.blocks
    in_blocks = {id(p) for b in blocks for p in b.parameters()}
    in_block_modules = {id(m) for b in blocks for m in b.modules()}
    outside = _outside_sections(model, trace, in_blocks, in_block_modules)
    layers = []
    if blocks:
        pro, epi = outside["prologue"], outside["epilogue"]
        layers.append(_layer(trace, "prologue", _count(pro["params"]), batch,
                             boundary=trace.boundary.get("block0", 0.0) / batch,
                             largest=_largest(pro["params"]), modules=pro["modules"]))
        for i, block in enumerate(blocks):
            own = [p for p in block.parameters() if p.requires_grad]
            layers.append(_layer(trace, f"block{i}", _count(own), batch,
                                 repeated=True, split=_has_linear(block),
                                 boundary=trace.boundary[f"block{i}"] / batch,
                                 largest=_largest(own), modules=len(list(block.modules()))))
        layers.append(_layer(trace, "epilogue", _count(epi["params"]), batch,
                             boundary=_out_bytes(out) / batch, largest=_largest(epi["params"]),
                             modules=epi["modules"]))
    else:  # no stack: the whole model is one layer
        whole = [p for p in model.parameters() if p.requires_grad]
        layers.append(_layer(trace, "prologue", _count(whole), batch,
                             boundary=_out_bytes(out) / batch, split=_has_linear(model),
                             largest=_largest(whole), modules=len(list(model.modules()))))
    layers = [layer for layer in layers if layer.params or layer.flops or layer.repeated]
    return ModelProfile(name, layers, description={
        "factory": name, "stack": stack[0] if stack else None, "blocks": len(blocks),
        "block_input": trace.block_input, "sample_batch": batch, "torch": torch.__version__})


def _outside_sections(model, trace, in_blocks, in_block_modules) -> dict:
    """The parameters and modules outside the blocks, by the section where their module
    first ran (a parameter two modules share, where the first ran; one never run, in the
    prologue), as SMP's auto-partition places them."""
    found = {key: {"params": [], "modules": 0} for key in ("prologue", "epilogue")}
    seen = set()
    for module in model.modules():
        if id(module) in in_block_modules or module is model:
            continue
        # a module outside the blocks that first ran inside one goes with the prologue
        after = trace.section.get(id(module)) == "epilogue"
        section = found["epilogue" if after else "prologue"]
        section["modules"] += 1
        for p in module.parameters(recurse=False):
            if p.requires_grad and id(p) not in in_blocks and id(p) not in seen:
                seen.add(id(p))
                section["params"].append(p)
    found["prologue"]["params"] += [p for p in model.parameters(recurse=False)
                                    if p.requires_grad and id(p) not in seen]
    return found


def _count(params) -> int:
    return sum(p.numel() for p in params)


def _layer(trace, key, params, batch, *, boundary, repeated=False, split=True,
           largest=0, modules=1) -> Layer:
    saved = trace.saved.get(key, 0.0) / batch
    cut = trace.saved_split.get(key, 0.0) / batch if split else 0.0
    return Layer(key, int(params), trace.flops.get(key, 0.0) / batch, act_split=cut,
                 act_kept=saved - cut, boundary=boundary,
                 tp_comm=trace.tp.get(key, 0.0) / batch if split else 0.0, split=split,
                 repeated=repeated, largest=largest, ops=trace.ops.get(key, 0),
                 modules=max(1, modules), outputs=trace.outputs.get(key, 0.0) / batch)


def _largest(params) -> int:
    return max((p.numel() for p in params), default=0)


def _has_linear(module) -> bool:
    import torch

    return any(isinstance(m, (torch.nn.Linear, torch.nn.Embedding)) for m in module.modules())


def _out_bytes(out) -> float:
    return sum(_bytes16(t) for t in _flat(out) if hasattr(t, "numel"))
