"""``smp.set_activation_checkpointing``: modules whose activations are recomputed in the backward.

A checkpointed module's forward runs under ``torch.utils.checkpoint.checkpoint(...,
use_reentrant=False)``: only its inputs are kept for the backward, which runs the forward
again. The module's forward itself is wrapped, so the checkpoint applies where the module
runs: on the pipeline rank that owns it, when another rank calls it through the engine.

An ``nn.Sequential`` is checkpointed by groups of its children (``strategy``): ``each`` child
alone, ``contiguous`` all of them as one (under a pipeline, each run of consecutive children
on one rank), ``group_<n>`` n consecutive children at a time (cut where the owner changes).
Each group another rank owns is one call to that rank, which runs it checkpointed.

A checkpoint whose modules live on more than one pipeline rank cannot be recomputed in one
place: with auto-partition it runs unchecked (with a warning), with manual placement it is a
``CheckpointingError``.

Tensor parallelism's dropout draws its masks from generators of its own, which
``preserve_rng_state`` does not cover: their states are taken when the checkpointed function
first runs and put back while it runs again, so the recomputation drops the same elements.

``SHOAL_ACTIVATION_CHECKPOINTING`` (Shoal's own; read once at ``smp.init``) checkpoints modules
without a change to the script: ``blocks`` each child of the model's main stack (the
``nn.ModuleList`` or ``nn.Sequential`` of at least two children of one class holding the most
parameters), ``types:A,B`` every module of those classes (by ``__name__``; one inside another
chosen one is left to it). The modules are chosen when ``smp.DistributedModel`` wraps the model
(every rank sees the whole model then) and checkpointed right after partitioning, through
``set_activation_checkpointing``, so its refusals apply. Each module is checkpointed whole: a
plain ``nn.Sequential`` one with ``strategy="contiguous"``. A stack that is an ``nn.Sequential``
is checkpointed child by child rather than as the Sequential with ``strategy="each"``: under a
pipeline the engine then still hands each rank its run of children in one call. A module the
script checkpointed, or one inside or around it, is left to the script's call, before or after.
"""

from __future__ import annotations

import logging
import re
import warnings
import weakref
from collections.abc import Callable, Sequence

import attrs
import torch
from shoal.modelparallel.errors import CheckpointingError, SMPConfigError, SMPUsageError
from shoal.modelparallel.stacks import main_stack
from shoal.modelparallel.torch import offload as _offload
from shoal.modelparallel.torch import placement
from shoal.modelparallel.torch import state as _state
from torch.utils.checkpoint import checkpoint as _torch_checkpoint

log = logging.getLogger("shoal.modelparallel")

_NOT_WRAPPED = ("The model needs to be wrapped with smp.DistributedModel before "
                "set_activation_checkpointing can be called on a module")
_NOT_SEQUENTIAL = "strategy can only be used when checkpointing Sequential modules"
_STRATEGY = re.compile(r"^(?:each|contiguous|group_([1-9][0-9]*))$")


@attrs.define
class _Spec:
    preserve_rng_state: bool
    strategy: str
    original: Callable | None  # a non-Sequential module's forward before it was wrapped


_specs: weakref.WeakKeyDictionary[torch.nn.Module, _Spec] = weakref.WeakKeyDictionary()
_hooked: weakref.WeakSet = weakref.WeakSet()  # models whose partitioning re-installs


def set_activation_checkpointing(module: torch.nn.Module, preserve_rng_state: bool = True,
                                 pack_args_as_tuple: bool = False,
                                 strategy: str = "each") -> None:
    """Checkpoints ``module`` (a module of the ``smp.DistributedModel``'s model)."""
    st = _state.require()
    model = st.model
    if model is None:
        raise SMPUsageError(_NOT_WRAPPED)
    if not isinstance(module, torch.nn.Module):
        raise TypeError(f"set_activation_checkpointing needs an nn.Module "
                        f"(got {type(module).__name__})")
    check_strategy(module, strategy)
    warn_packing(pack_args_as_tuple)
    name = _name_in(model, module)
    if st.shard_groups is not None:
        _refuse_shared(model, module, name)
    if _planned:
        _withdraw_planned(st, module, name)
    previous = _specs.get(module)
    original = None
    if not _is_sequential(module):
        if previous is not None:
            original = previous.original
        elif model.partitioned:  # the engine holds the forward the owner runs
            original = st.engine.forwards.get(name, module.forward)
        else:
            original = module.forward
    spec = _specs[module] = _Spec(preserve_rng_state, strategy, original)
    if model.partitioned:
        _install(model, name, module, spec)
        return
    if _is_sequential(module):
        children = list(module._modules.values())
        groups = [(a, b, 0) for a, b in strategy_groups(len(children), strategy)]
        module.forward = _grouped_forward(name, children, groups, spec, me=0)
    else:
        module.forward = _wrapped(original, [module], spec)
    if model not in _hooked:
        _hooked.add(model)
        model.register_post_partition_hook(_after_partition)


def _refuse_shared(model, module: torch.nn.Module, name: str) -> None:
    """SMP's rule under sharded data parallelism: a checkpointed module shares no parameter
    with a module outside it (its re-run forward would gather what the outside releases)."""
    inside = {id(p) for p in module.parameters()}
    inner = {id(m) for m in module.modules()}
    for other in model.get_module().modules():
        if id(other) not in inner and any(id(p) in inside
                                          for p in other.parameters(recurse=False)):
            raise SMPUsageError(
                "When sharded data parallelism is enabled, modules that share parameters "
                f"cannot be checkpointed. Offending module: {name}")


def check_strategy(module: torch.nn.Module, strategy: str) -> None:
    if strategy != "each" and not isinstance(module, torch.nn.Sequential):
        raise SMPUsageError(_NOT_SEQUENTIAL)
    if not isinstance(strategy, str) or not _STRATEGY.match(strategy):
        raise SMPUsageError(f"Unknown activation checkpointing strategy {strategy!r}; the "
                            "valid strategies are 'each', 'contiguous' and 'group_<n>' "
                            "(n a positive integer, e.g. 'group_2')")


def strategy_groups(count: int, strategy: str) -> list[tuple[int, int]]:
    """The [start, end) ranges of a Sequential's ``count`` children each checkpoint covers."""
    if strategy == "each":
        size = 1
    elif strategy == "contiguous":
        size = max(count, 1)
    else:
        size = int(_STRATEGY.match(strategy).group(1))
    return [(start, min(start + size, count)) for start in range(0, count, size)]


def checkpointed_call(fn: Callable, modules: Sequence[torch.nn.Module], args, kwargs,
                      preserve_rng_state: bool = True, what: str = "module"):
    """``fn(*args, **kwargs)`` keeping only its inputs for the backward; ``modules`` are
    those it runs (their tensor-parallel dropouts' generators are restored to recompute)."""
    if not torch.is_grad_enabled():  # nothing to keep: a traced or evaluation forward
        return _checked(fn(*args, **kwargs), what)
    kwargs = _without_cache(modules, kwargs)
    taken: list[tuple[torch.Generator, torch.Tensor]] = []
    runs = 0

    def body(*a, **k):
        nonlocal runs
        runs += 1
        if runs == 1:
            taken[:] = [(g, g.get_state()) for g in _dropout_generators(modules)]
            return _checked(fn(*a, **k), what)
        now = [(g, g.get_state()) for g, _ in taken]
        for g, state in taken:
            g.set_state(state)
        try:
            return fn(*a, **k)
        finally:  # later calls continue from where the forward had left them
            for g, state in now:
                g.set_state(state)

    with _offload.saving():  # offload_activations: the inputs kept go to host memory
        return _torch_checkpoint(body, *args, use_reentrant=False,
                                 preserve_rng_state=preserve_rng_state, **kwargs)


# What Hugging Face's checkpointed layers drop: a cache written in the forward would be
# written again when the backward re-runs it (keys twice as long as the mask).
_CACHE_ARGUMENTS = {"use_cache": False, "cache": None, "layer_past": None,
                    "past_key_value": None, "past_key_values": None}


def _without_cache(modules, kwargs: dict) -> dict:
    """``kwargs`` without a key/value cache, for a Hugging Face layer (a
    ``GradientCheckpointingLayer``, which does the same under its own checkpointing)."""
    if not any(hasattr(type(m), "_can_checkpoint_with_cache") for m in modules):
        return kwargs
    dropped = {k: v for k, v in _CACHE_ARGUMENTS.items() if kwargs.get(k) not in (None, False)}
    return {**kwargs, **dropped} if dropped else kwargs


def runs_here(module: torch.nn.Module) -> bool:
    """Whether all of ``module`` runs on this rank (always so before partitioning)."""
    st = _state.current()
    model = st.model if st is not None else None
    if model is None or not model.partitioned or st.topology.pp_size == 1:
        return True
    names = {id(m): n for n, m in placement.named_modules(model.get_module()).items()}
    if id(module) not in names:
        return True
    return _ranks_of(model.owner, names[id(module)]) == {st.engine.rank}


# -- installing ---------------------------------------------------------------------------
def has_checkpointing(model) -> bool:
    """Whether some module of ``model`` is checkpointed."""
    return any(m in _specs for m in model.get_module().modules())


def _after_partition(model, _optimizer) -> None:
    for name, module in placement.named_modules(model.get_module()).items():
        spec = _specs.get(module)
        if spec is not None:
            _install(model, name, module, spec)


def _install(model, name: str, module: torch.nn.Module, spec: _Spec) -> None:
    """Wraps the forward the owner runs, and routes this rank's calls to the owner."""
    st = _state.require()
    engine, owner = st.engine, model.owner
    me = engine.rank
    if _is_sequential(module):
        prefix = f"{name}." if name else ""
        keys = [f"{prefix}{k}" for k in module._modules]
        children = list(module._modules.values())
        groups = []
        for start, end in strategy_groups(len(children), spec.strategy):
            for a, b, rank in _cut_by_owner(owner, keys, start, end):
                if rank is None:
                    _split(st, keys[a])
                else:
                    run = children[a:b]
                    engine.forwards[f"{name}[{a}:{b}]"] = _wrapped(
                        run_of(run), run, spec, what=f"{name}[{a}:{b}]")
                groups.append((a, b, rank))
        forward = _grouped_forward(name, children, groups, spec, me)
    elif len(_ranks_of(owner, name)) > 1:
        _split(st, name)
        forward = spec.original
    else:
        forward = _wrapped(spec.original, [module], spec, what=name)
    engine.forwards[name] = forward
    module.forward = forward if owner[name] == me else engine._dispatcher(name, forward)


def _cut_by_owner(owner, keys, start, end):
    """[a, b, rank] runs of children keys[start:end] that one rank holds wholly; a child
    spread over several ranks is a run of its own with rank None."""
    runs: list[list] = []
    for i in range(start, end):
        ranks = _ranks_of(owner, keys[i])
        rank = next(iter(ranks)) if len(ranks) == 1 else None
        if runs and rank is not None and runs[-1][2] == rank:
            runs[-1][1] = i + 1
        else:
            runs.append([i, i + 1, rank])
    return [tuple(r) for r in runs]


def _split(st, name: str) -> None:
    text = (f"module {name or '<root>'!r} is checkpointed, but its modules are placed on "
            "more than one pipeline partition")
    if not st.cfg.auto_partition:
        raise CheckpointingError(f"{text}; a checkpointed module must be placed on one "
                                 "partition")
    log.warning("%s by auto-partition: it runs without activation checkpointing", text)


def _ranks_of(owner: dict[str, int], name: str) -> set[int]:
    if not name:
        return set(owner.values())
    return {r for n, r in owner.items() if n == name or n.startswith(name + ".")}


# -- running ------------------------------------------------------------------------------
def _wrapped(fn: Callable, modules, spec: _Spec, what: str = "module") -> Callable:
    def forward(*args, **kwargs):
        return checkpointed_call(fn, modules, args, kwargs, spec.preserve_rng_state, what)
    forward.__wrapped__ = fn
    return forward


def run_of(children):
    """One callable running ``children`` in a row (a Sequential's slice)."""
    def run(x):
        for child in children:
            x = child(x)
        return x
    return run


def _grouped_forward(name, children, groups, spec: _Spec, me: int) -> Callable:
    """A Sequential's forward by checkpointed groups; a group another rank holds is one
    call to that rank (which runs it checkpointed), a split one runs child by child."""
    runs = [(a, b, rank, _wrapped(run_of(children[a:b]), children[a:b], spec,
                                  what=f"{name}[{a}:{b}]")) for a, b, rank in groups]

    def forward(x):
        engine = _state.require().engine
        for a, b, rank, checkpointed in runs:
            if rank is None:
                for child in children[a:b]:
                    x = child(x)
            elif rank == me or not engine.active:
                x = checkpointed(x)
            else:
                x = engine._remote_call(rank, f"{name}[{a}:{b}]", (x,), {})
        return x

    return forward


def _dropout_generators(modules) -> list[torch.Generator]:
    from shoal.modelparallel.torch.nn.dropout import ParallelDropout

    found: dict[int, torch.Generator] = {}
    for module in modules:
        for sub in module.modules():
            if isinstance(sub, ParallelDropout):
                generator = sub.mask_generator()
                if generator is not None:
                    found.setdefault(id(generator), generator)
    return list(found.values())


def _checked(output, what: str):
    if isinstance(output, (dict, set, frozenset)):
        raise CheckpointingError(
            f"the checkpointed {what} returned a {type(output).__name__}; a checkpointed "
            "module's output must be a tensor or a tuple/list of them, not a dict or a set")
    return output


# -- SHOAL_ACTIVATION_CHECKPOINTING -----------------------------------------------------------
PLANNED_VARIABLE = "SHOAL_ACTIVATION_CHECKPOINTING"
_PLANNED_ACCEPTED = "'off' (or unset or empty), 'blocks', or 'types:<ClassName>[,<ClassName>...]'"
_MISSING = object()


@attrs.frozen
class Planned:
    """What ``SHOAL_ACTIVATION_CHECKPOINTING`` asks for: the main stack's blocks, or the
    modules of the classes named."""
    blocks: bool
    types: tuple[str, ...] = ()

    def __str__(self) -> str:
        return "blocks" if self.blocks else "types:" + ",".join(self.types)


@attrs.define
class _PlannedRecord:
    """A module checkpointed for the variable, with what its call ran before."""
    model: weakref.ref  # the smp.DistributedModel it belongs to
    name: str
    forward: object  # the module's own ``forward`` attribute (_MISSING: its class's)
    engine_forwards: dict  # the engine's forwards under its name and its runs' keys


# modules checkpointed for the variable, which a script's own call takes back
_planned: weakref.WeakKeyDictionary[torch.nn.Module, _PlannedRecord] = \
    weakref.WeakKeyDictionary()


def parse_planned(raw: str | None) -> Planned | None:
    """The variable's value, checked (None: nothing to checkpoint)."""
    value = (raw or "").strip()
    if value in ("", "off"):
        return None
    if value == "blocks":
        return Planned(blocks=True)
    if value.startswith("types:"):
        names = tuple(n.strip() for n in value[len("types:"):].split(","))
        if names and all(n.isidentifier() for n in names):
            return Planned(blocks=False, types=tuple(dict.fromkeys(names)))
    raise SMPConfigError(f"{PLANNED_VARIABLE}={raw!r} is not understood; the accepted values "
                         f"are {_PLANNED_ACCEPTED}")


def plan(model) -> None:
    """At ``smp.DistributedModel``: chooses the modules the variable asks for (the whole
    model is on every rank now) and checkpoints them right after partitioning."""
    planned = _state.require().planned_checkpointing
    if planned is None:
        return
    modules = placement.named_modules(model.get_module())
    if planned.blocks:
        stack = main_stack(modules)
        chosen = [] if stack is None else [
            (f"{stack}.{k}" if stack else k) for k in modules[stack]._modules]
        where = f"the stack {stack or '<root>'!r}" if stack is not None else "no stack"
    else:
        chosen = _of_types(modules, planned.types)
        where = "classes " + ", ".join(planned.types)

    def apply(model, _optimizer) -> None:
        _apply_planned(model, planned, chosen, where)

    model.register_post_partition_hook(apply)


def _of_types(modules: dict[str, torch.nn.Module], types: tuple[str, ...]) -> list[str]:
    """The modules of those classes, outermost first; none inside another chosen one."""
    chosen: list[str] = []
    for name, module in modules.items():  # parents come before their children
        if type(module).__name__ in types and not any(_within(name, c) for c in chosen):
            chosen.append(name)
    return chosen


def _within(name: str, outer: str) -> bool:
    """Whether module ``name`` is ``outer`` or inside it."""
    return outer == "" or name == outer or name.startswith(outer + ".")


def _apply_planned(model, planned: Planned, chosen: list[str], where: str) -> None:
    """After partitioning: checkpoints the chosen modules that the script's own calls leave
    alone (a module it checkpointed, or one inside or around it, stays as the script said)."""
    st = _state.require()
    modules = placement.named_modules(model.get_module())
    script = [n for n, m in modules.items() if m in _specs]
    done, left = [], 0
    for name in chosen:
        module = modules[name]
        if any(_within(name, s) or _within(s, name) for s in script):
            left += 1
            continue
        record = _PlannedRecord(weakref.ref(model), name,
                                module.__dict__.get("forward", _MISSING),
                                _engine_entries(st.engine, name))
        set_activation_checkpointing(module, strategy=_whole(module))
        _planned[module] = record
        done.append(module)
    classes = sorted({type(m).__name__ for m in done})
    message = (f"{PLANNED_VARIABLE}={planned}: {len(done)} modules "
               f"({', '.join(classes) or 'none'}) checkpointed, from {where}")
    if left:
        message += f"; {left} left to the script's own set_activation_checkpointing"
    if chosen:
        log.info("%s", message)
    else:
        log.warning("%s: the model has no such module", message)


def _whole(module: torch.nn.Module) -> str:
    """The strategy that checkpoints ``module`` as one piece."""
    return "contiguous" if _is_sequential(module) else "each"


def _engine_entries(engine, name: str) -> dict:
    return {k: v for k, v in engine.forwards.items()
            if k == name or k.startswith(f"{name}[")}


def _withdraw_planned(st, module: torch.nn.Module, name: str) -> None:
    """A script's own call on ``module`` takes back the variable's checkpoints of it and of
    the modules inside or around it: the script's choice is the one that applies."""
    for planned, record in list(_planned.items()):
        if record.model() is not st.model or not (_within(record.name, name)
                                                  or _within(name, record.name)):
            continue
        del _planned[planned]
        _specs.pop(planned, None)
        engine = st.engine
        for key in list(_engine_entries(engine, record.name)):
            engine.forwards.pop(key)
        engine.forwards.update(record.engine_forwards)
        if record.forward is _MISSING:
            planned.__dict__.pop("forward", None)
        else:
            planned.forward = record.forward
        log.debug("%s: %r is left to the script's own set_activation_checkpointing",
                  PLANNED_VARIABLE, record.name)


# -- small helpers ------------------------------------------------------------------------
def _is_sequential(module: torch.nn.Module) -> bool:
    return (isinstance(module, torch.nn.Sequential)
            and type(module).forward is torch.nn.Sequential.forward)


def warn_packing(pack_args_as_tuple: bool) -> None:
    if pack_args_as_tuple:
        warnings.warn("pack_args_as_tuple is deprecated and has no effect",
                      DeprecationWarning, stacklevel=3)


def _name_in(model, module: torch.nn.Module) -> str:
    for name, candidate in placement.named_modules(model.get_module()).items():
        if candidate is module:
            return name
    raise SMPUsageError("set_activation_checkpointing needs a module of the model wrapped "
                        "by smp.DistributedModel")
