"""Which modules tensor parallelism distributes, and their replacement at ``DistributedModel``.

A module is distributed when its type is registered (``nn.Linear`` and ``nn.Embedding``
built in; ``smp.tp_register`` adds others) and it is marked: created inside
``smp.tensor_parallelism()`` (or ``smp.model_creation(tensor_parallelism=True)``; the
innermost context wins) or marked afterwards by ``smp.set_tensor_parallelism``. When
``smp.DistributedModel`` wraps the model, each marked module of a registered type is
replaced by its distributed module, outermost first (a replaced module's children are not
looked at); one the distributed module cannot take (``can_distribute`` False, such as
sizes the TP degree does not divide where that matters) or one sharing a parameter with a
module outside it (a tied embedding and output layer) is kept, with a log line.

The distributed module is built from the original's constructor arguments (recorded at
creation for registered classes, read back from the attributes of ``nn.Linear`` and
``nn.Embedding``), the mark's keyword arguments overriding those it accepts. Unlike SMP,
which initialises the new module afresh, the original's weights are copied into the shards
when their names and shapes match: a model loaded or initialised before wrapping keeps its
values, whatever the TP degree.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import logging
from collections.abc import Callable
from typing import Any

import attrs
import torch
from shoal.modelparallel.errors import SMPUsageError, TPModuleRegisterError
from shoal.modelparallel.torch import state as _state
from shoal.modelparallel.torch.nn.embedding import DistributedEmbedding
from shoal.modelparallel.torch.nn.linear import DistributedLinear
from shoal.modelparallel.torch.nn.module import DistributedModule

log = logging.getLogger("shoal.modelparallel")

_AFTER_WRAP = ("The model needs to be wrapped with smp.DistributedModel after using the "
               "set_tensor_parallelism API")


@attrs.frozen
class Registration:
    dist_module: type
    init_hook: Callable | None = None
    forward_hook: Callable | None = None
    return_hook: Callable | None = None
    # The original's state dict -> the distributed module's full one (names differ: HF),
    # and back (a full checkpoint saved under the original's names).
    translate: Callable | None = None
    translate_back: Callable | None = None


@attrs.frozen
class Mark:
    enabled: bool
    kwargs: dict = attrs.field(factory=dict)


_REGISTRY: dict[type, Registration] = {}
_contexts: list[Mark] = []


def registration(module_type: type) -> Registration | None:
    return _REGISTRY.get(module_type)


# -- registering -------------------------------------------------------------------------


def tp_register_with_module(module_cls: type, dist_module: type, init_hook=None,
                            forward_hook=None, return_hook=None, *, translate=None,
                            translate_back=None) -> None:
    """Registers ``dist_module`` as the distributed form of ``module_cls`` (``translate``:
    the original's state dict to the distributed module's names, for the weights' copy)."""
    if not (isinstance(dist_module, type) and issubclass(dist_module, DistributedModule)):
        raise TPModuleRegisterError(
            "Can only register a sub-class of smp.nn.DistributedModule. Found "
            f"{getattr(dist_module, '__name__', dist_module)}.")
    _REGISTRY[module_cls] = Registration(dist_module, init_hook, forward_hook, return_hook,
                                         translate, translate_back)
    if module_cls not in _BUILT_IN_ARGS:
        _record_init_args(module_cls)


def tp_register(dist_module: type, init_hook=None, forward_hook=None, return_hook=None):
    """Class decorator: ``@smp.tp_register(DistModule)`` over the module's class."""
    def register(module_cls: type) -> type:
        tp_register_with_module(module_cls, dist_module, init_hook, forward_hook, return_hook)
        return module_cls
    return register


def _record_init_args(cls: type) -> None:
    """Wraps ``cls.__init__`` to keep its arguments (and the context's mark) on the instance."""
    original = cls.__dict__.get("__init__", cls.__init__)
    if getattr(original, "_smp_records", False):
        return

    @functools.wraps(original)
    def __init__(self, *args, **kwargs):  # noqa: N807 - the wrapped constructor
        original(self, *args, **kwargs)
        if type(self) is cls and "_smp_init_args" not in self.__dict__:
            object.__setattr__(self, "_smp_init_args", (args, kwargs))
        _mark_new(self)

    __init__._smp_records = True
    cls.__init__ = __init__


def _mark_new(module: torch.nn.Module) -> None:
    if _contexts and "_smp_tp" not in module.__dict__:
        object.__setattr__(module, "_smp_tp", _contexts[-1])


def _linear_args(m: torch.nn.Linear):
    return (m.in_features, m.out_features), {"bias": m.bias is not None}


def _embedding_args(m: torch.nn.Embedding):
    return (m.num_embeddings, m.embedding_dim), {
        "padding_idx": m.padding_idx, "max_norm": m.max_norm, "norm_type": m.norm_type,
        "scale_grad_by_freq": m.scale_grad_by_freq, "sparse": m.sparse}


_BUILT_IN_ARGS: dict[type, Callable] = {torch.nn.Linear: _linear_args,
                                        torch.nn.Embedding: _embedding_args}


def _register_built_ins() -> None:
    tp_register_with_module(torch.nn.Linear, DistributedLinear)
    tp_register_with_module(torch.nn.Embedding, DistributedEmbedding)


_register_built_ins()


# -- marking -------------------------------------------------------------------------------


@contextlib.contextmanager
def tensor_parallelism(enabled: bool = True, **kwargs: Any):
    """Marks the supported modules created inside for tensor parallelism (``enabled``) or
    against it; ``kwargs`` override the distributed module's constructor arguments."""
    if _state.current() is None:  # SMP: a no-op before smp.init
        yield
        return
    _contexts.append(Mark(bool(enabled), dict(kwargs)))
    # Modules of built-in types are marked as they register their first parameter.
    hook = torch.nn.modules.module.register_module_parameter_registration_hook(
        lambda module, _name, _param: _mark_new(module))
    try:
        yield
    finally:
        hook.remove()
        _contexts.pop()


def set_tensor_parallelism(module: torch.nn.Module, enabled: bool = True, **kwargs: Any) -> None:
    """Marks the outermost supported modules in ``module``'s tree (``enabled=False``: the
    whole tree is kept as it is)."""
    st = _state.require()
    if st.model is not None:
        raise SMPUsageError(_AFTER_WRAP)
    mark = Mark(bool(enabled), dict(kwargs))
    if not enabled:
        for sub in module.modules():
            object.__setattr__(sub, "_smp_tp", mark)
        return
    found = _mark_outermost(module, mark)
    if not found:
        raise SMPUsageError(
            f"Modules of type {type(module).__name__} are not supported for tensor parallelism.")


def _mark_outermost(module: torch.nn.Module, mark: Mark) -> bool:
    if type(module) in _REGISTRY:
        object.__setattr__(module, "_smp_tp", mark)
        return True
    found = False
    for child in module.children():
        found = _mark_outermost(child, mark) or found
    return found


@contextlib.contextmanager
def model_creation(tensor_parallelism: bool = False, dtype: torch.dtype | None = None,
                   **tensor_parallel_config: Any):
    """SMP's one context for model creation: tensor parallelism for what is created inside
    (its keyword arguments to the distributed modules), the default dtype, and delayed
    parameter initialization where the configuration sets ``delayed_parameter_initialization``."""
    from shoal.modelparallel.torch.delayed import delay_param_initialization

    st = _state.current()
    delayed = bool(st is not None and st.cfg.delayed_parameter_initialization)
    previous = torch.get_default_dtype()
    try:
        if dtype is not None:
            torch.set_default_dtype(dtype)
        with delay_param_initialization(enabled=delayed):
            if tensor_parallelism:
                with globals()["tensor_parallelism"](True, **tensor_parallel_config):
                    yield
            else:
                yield
    finally:
        torch.set_default_dtype(previous)


# -- replacing -------------------------------------------------------------------------------


def distribute(root: torch.nn.Module) -> torch.nn.Module:
    """``root`` with its marked, supported modules replaced by distributed ones (the root
    itself included: a model that is one supported module comes back replaced)."""
    holders = _holders(root)
    replaced = _replacement(root, "", holders)
    if replaced is not None:
        return replaced
    _distribute_children(root, "", holders)
    return root


def _holders(root: torch.nn.Module) -> dict[int, set[int]]:
    """For each parameter, the modules that hold it directly (a tied weight: several)."""
    holders: dict[int, set[int]] = {}
    for module in root.modules():
        for param in module.parameters(recurse=False):
            holders.setdefault(id(param), set()).add(id(module))
    return holders


def _distribute_children(module: torch.nn.Module, prefix: str, holders) -> None:
    for name, child in list(module.named_children()):
        path = f"{prefix}.{name}" if prefix else name
        replaced = _replacement(child, path, holders)
        if replaced is not None:
            setattr(module, name, replaced)
        else:
            _distribute_children(child, path, holders)


def _shares_weights(module: torch.nn.Module, holders) -> bool:
    """Whether a parameter of ``module`` is also held by a module outside it (a tied
    embedding and output layer): SMP leaves such modules as they are."""
    inside = {id(m) for m in module.modules()}
    return any(holders.get(id(p), set()) - inside for p in module.parameters())


def _replacement(module: torch.nn.Module, path: str, holders) -> torch.nn.Module | None:
    mark = module.__dict__.get("_smp_tp")
    reg = _REGISTRY.get(type(module))
    if reg is None or mark is None or not mark.enabled:
        return None
    if _shares_weights(module, holders):
        log.info("tensor parallelism: %s (%s) is kept as it is: it shares a parameter with "
                 "another module", path or "the model", type(module).__name__)
        return None
    args, kwargs = _init_args(module)
    if reg.init_hook is not None:
        args, kwargs = reg.init_hook(*args, **kwargs)
    kwargs = {**kwargs, **_accepted(reg.dist_module, mark.kwargs)}
    if not reg.dist_module.can_distribute(*args, **kwargs):
        log.info("tensor parallelism: %s (%s) is kept as it is: %s cannot distribute it",
                 path or "the model", type(module).__name__, reg.dist_module.__name__)
        return None
    with _default_dtype(_dtype_of(module)):  # as created (smp.model_creation's dtype)
        new = reg.dist_module(*args, **kwargs)
    _copy_weights(module, new, reg.translate)
    _install_hooks(new, reg)
    if reg.translate is not None:  # DistributedModel.load_state_dict takes the original's names
        object.__setattr__(new, "_smp_translate", reg.translate)
    if reg.translate_back is not None:  # save_checkpoint(partial=False) writes them
        object.__setattr__(new, "_smp_translate_back", reg.translate_back)
    new.train(module.training)
    log.info("tensor parallelism: %s (%s) -> %s", path or "the model",
             type(module).__name__, reg.dist_module.__name__)
    return new


def _dtype_of(module: torch.nn.Module) -> torch.dtype | None:
    return next((p.dtype for p in module.parameters() if p.is_floating_point()), None)


@contextlib.contextmanager
def _default_dtype(dtype: torch.dtype | None):
    previous = torch.get_default_dtype()
    if dtype is not None:
        torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


def translators(root: torch.nn.Module, back: bool = False) -> list[Callable]:
    """The state-dict translators of the replaced modules in ``root`` (each once): to the
    distributed modules' names, or ``back`` to the originals'."""
    found: list[Callable] = []
    for module in root.modules():
        translate = module.__dict__.get("_smp_translate_back" if back else "_smp_translate")
        if translate is not None and translate not in found:
            found.append(translate)
    return found


def _init_args(module: torch.nn.Module) -> tuple[tuple, dict]:
    recorded = module.__dict__.get("_smp_init_args")
    if recorded is not None:
        return tuple(recorded[0]), dict(recorded[1])
    for cls, read in _BUILT_IN_ARGS.items():
        if type(module) is cls:
            return read(module)
    raise SMPUsageError(
        f"the constructor arguments of {type(module).__name__} were not recorded: register "
        "it with smp.tp_register before creating it")


def _accepted(cls: type, kwargs: dict) -> dict:
    """The keys of ``kwargs`` that ``cls``'s constructor takes (all, if it takes **kwargs)."""
    params = inspect.signature(cls.__init__).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return dict(kwargs)
    return {k: v for k, v in kwargs.items() if k in params}


def _copy_weights(original: torch.nn.Module, new: DistributedModule,
                  translate: Callable | None = None) -> None:
    """The original's parameters and buffers into ``new``'s shards, where name and full
    shape match (a distributed module may translate names itself: ``load_original``; a
    registration may translate the original's state dict: ``translate``)."""
    if hasattr(new, "load_original"):
        if not any(t.is_meta for t in original.state_dict().values()):  # delayed: none yet
            new.load_original(original)
        return
    state = original.state_dict()
    if translate is not None:
        state = translate(state)
    targets = dict(new.named_parameters())
    targets.update(new.named_buffers())
    for name, tensor in state.items():
        if name not in targets or tensor.is_meta:
            continue
        owner_name, _, leaf = name.rpartition(".")
        owner = new.get_submodule(owner_name) if owner_name else new
        split = owner.split_of(leaf) if isinstance(owner, DistributedModule) else None
        full_shape = list(targets[name].shape)
        if split is not None:
            full_shape[split.axis] = split.total
        if list(tensor.shape) == full_shape:
            if isinstance(owner, DistributedModule):
                owner.load_full(leaf, tensor)
            else:
                with torch.no_grad():
                    targets[name].copy_(tensor)


def _install_hooks(new: torch.nn.Module, reg: Registration) -> None:
    if reg.forward_hook is None and reg.return_hook is None:
        return
    inner = new.forward

    def forward(*args, **kwargs):
        if reg.forward_hook is not None:
            args, kwargs = reg.forward_hook(*args, **kwargs)
        out = inner(*args, **kwargs)
        return reg.return_hook(out) if reg.return_hook is not None else out

    new.forward = forward
