"""``smp.delay_param_initialization``: parameters without memory until the model is partitioned.

Inside ``delay_param_initialization(enabled=True)`` (and ``smp.model_creation`` when the
configuration sets ``delayed_parameter_initialization``), every parameter a module registers
is moved to torch's ``meta`` device: it keeps its shape, dtype and ``requires_grad`` but has
no storage. Buffers are created as usual (they are small and often computed, such as
position ids). The ``torch.nn.init`` calls made on such parameters while the context is open
are recorded, in order.

When ``smp.DistributedModel`` partitions the model (the first ``smp.step``, or its
construction under tensor parallelism alone), :func:`materialise` gives each rank's own
modules their parameters' storage on the CPU, in place (the Parameter objects stay the same,
so an optimizer built before still holds them), and initialises them: the module's
``reset_parameters()`` where its class has one, else the recorded ``torch.nn.init`` calls
replayed. The parameters of modules other pipeline ranks own get an empty storage, as
partitioning leaves them anyway; they never take the memory of their full shape. With
``ddp`` the broadcast from the data-parallel root that follows makes replicas equal, and a
state dict loaded into the model fills the materialised parameters. A module tensor
parallelism replaces is created anew at ``DistributedModel``, initialised normally.

A parameter neither way initialises (its values were set through ``.data`` or before it was
registered) is zero-filled, with a warning naming it: load a state dict for such models.
Auto-partition traces the first step on world rank 0 with the whole model, so that rank
materialises every module for the trace (the others' storage is freed right after).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import threading

import torch
from shoal.modelparallel.errors import SMPUsageError

log = logging.getLogger("shoal.modelparallel")

_ON_CPU = "Parameter must be on CPU for delayed initialization."
_lock = threading.RLock()
_depth = 0  # open contexts (nested ones included)
_init_depth = threading.local()
# id(parameter) -> (parameter, [(init function, args, kwargs)]); the parameter is held so
# that its id stays its own until it is materialised.
_recorded: dict[int, tuple[torch.nn.Parameter, list]] = {}
_patched: dict[str, object] = {}
_hook = None


@contextlib.contextmanager
def delay_param_initialization(enabled: bool = True):
    """Modules created inside get their parameters on ``meta``, initialised once the model
    is partitioned (each rank only its own)."""
    if not enabled:
        yield
        return
    _enter()
    try:
        yield
    finally:
        _exit()


def _enter() -> None:
    global _depth, _hook
    with _lock:
        _depth += 1
        if _depth > 1:
            return
        _hook = torch.nn.modules.module.register_module_parameter_registration_hook(_to_meta)
        for name in dir(torch.nn.init):
            fn = getattr(torch.nn.init, name)
            if name.endswith("_") and not name.startswith("_") and callable(fn):
                _patched[name] = fn
                setattr(torch.nn.init, name, _recording(fn))


def _exit() -> None:
    global _depth, _hook
    with _lock:
        _depth -= 1
        if _depth:
            return
        _hook.remove()
        _hook = None
        for name, fn in _patched.items():
            setattr(torch.nn.init, name, fn)
        _patched.clear()


def _to_meta(_module, _name, param):
    if param is None or param.is_meta:
        return None
    if param.device.type != "cpu":
        raise SMPUsageError(_ON_CPU)
    meta = torch.nn.Parameter(torch.empty_like(param, device="meta"),
                              requires_grad=param.requires_grad)
    with _lock:
        _recorded[id(meta)] = (meta, [])
    return meta


def _recording(fn):
    @functools.wraps(fn)
    def init(tensor, *args, **kwargs):
        outer = getattr(_init_depth, "value", 0) == 0  # one init function may call another
        if outer and isinstance(tensor, torch.Tensor) and tensor.is_meta:
            entry = _recorded.get(id(tensor))
            if entry is not None and entry[0] is tensor:
                entry[1].append((fn, args, kwargs))
        _init_depth.value = getattr(_init_depth, "value", 0) + 1
        try:
            return fn(tensor, *args, **kwargs)
        finally:
            _init_depth.value -= 1
    return init


def is_delayed(module: torch.nn.Module) -> bool:
    """Whether some parameter of ``module`` (or its children) still waits on ``meta``."""
    return any(p.is_meta for p in module.parameters())


def materialise(root: torch.nn.Module, owns=lambda _name: True, each=None) -> list[str]:
    """Gives the ``meta`` parameters of the modules ``owns(name)`` accepts CPU storage and
    their initialisation; the others get an empty storage. ``each(params)``, if given, runs
    on each module's parameters once they are initialised (sharded data parallelism shards
    them there, so that the whole model never exists at once). Returns the parameters
    materialised, by name."""
    done: list[str] = []
    unset: list[str] = []
    with torch.no_grad():
        for name, module in root.named_modules(remove_duplicate=True):
            params = [(n, p) for n, p in module.named_parameters(recurse=False) if p.is_meta]
            if not params:
                continue
            if not owns(name):
                for _, param in params:
                    give_storage(param, torch.empty(0, dtype=param.dtype))
                continue
            for _, param in params:
                give_storage(param, torch.empty_like(param, device="cpu"))
            full = [f"{name}.{n}" if name else n for n, _ in params]
            done += full
            reset = getattr(module, "reset_parameters", None)
            if callable(reset) and len(params) == len(list(module.parameters(recurse=False))):
                reset()
            else:
                for (_, param), qualified in zip(params, full):
                    calls = _recorded.get(id(param), (None, []))[1]
                    if not calls:
                        param.zero_()
                        unset.append(qualified)
                    for fn, args, kwargs in calls:
                        fn(param, *args, **kwargs)
            _forget(p for _, p in params)
            if each is not None:
                each([p for _, p in params])
    if unset:
        log.warning("delayed parameter initialization: no initialisation was recorded for %s "
                    "(they are zero until a state dict is loaded)", ", ".join(unset))
    return done


def give_storage(param: torch.nn.Parameter, storage: torch.Tensor) -> None:
    """``param`` (on ``meta``) takes ``storage`` in place: the same Parameter object."""
    new = torch.nn.Parameter(storage, requires_grad=param.requires_grad)
    try:
        torch.utils.swap_tensors(param, new)
    except RuntimeError as exc:
        raise SMPUsageError(f"delayed parameter initialization cannot give a parameter its "
                            f"storage in place: {exc}") from exc


def _forget(params) -> None:
    with _lock:
        for param in params:
            _recorded.pop(id(param), None)
