"""torch's DistributedDataParallel on a Shoal process group: no gradient copies, no division pass.

By default torch's DDP copies every gradient into its bucket, dividing it by the world size
on the way, before the allreduce, and copies the reduced bucket back into the gradient
after it; with ``gradient_as_bucket_view=True`` the gradients *are* views of the buckets
and the division is a pass of its own. All of it runs on the training thread. For a DDP
whose process group is on backend ``shoal`` (or ``smddp``) two defaults change, with
plain ``DistributedDataParallel(model)`` code:

- ``gradient_as_bucket_view`` defaults to True (passing it explicitly, either way, wins);
- the bucket's allreduce asks the core for the average (a communication hook registered
  at construction), which divides while it reduces, so the reducer's division goes.

On the communication-heavy benchmark (``benchmarks/ddp_step.py``) the copies cost about a
sixth of the step and the division pass about a fifteenth. The gradients are the same up
to rounding: the sum over ranks divided by the world size instead of the sum of divided
gradients (bit-equal for 2 ranks). A hook the user registers later (``register_comm_hook``
or a built-in one) takes the default hook's place, as if there had been none. Under torch's
``Join`` with ``divide_by_initial_world_size=False`` the hook divides by the ranks still
training, as torch's reducer would. ``SHOAL_TORCH_DDP_DEFAULTS=0`` (read when a DDP is
built) keeps torch's own defaults; other backends' DDPs are always left as torch makes them.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import os
import weakref

import torch.distributed as torch_dist
from torch.nn.parallel import DistributedDataParallel

from .backend import ALIASES, BACKEND_NAME

_MARK = "_shoal_defaults"
# DDP -> (its reducer, the default hook's state); beside the DDP, not in it, so that a
# DDP still pickles (its __getstate__ drops the reducer and the group, not our entry).
_default_hooks: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def install() -> None:
    """Wrap DDP's constructor and hook registration once (idempotent)."""
    if getattr(DistributedDataParallel.__init__, _MARK, False):
        return
    _wrap(DistributedDataParallel, "__init__", _init_with_defaults)
    _wrap(DistributedDataParallel, "register_comm_hook", _register_in_place_of_default)
    _wrap(DistributedDataParallel, "_register_builtin_comm_hook", _register_in_place_of_default)


def _wrap(cls, name: str, wrapper) -> None:
    original = getattr(cls, name)

    @functools.wraps(original)
    def method(self, *args, **kwargs):
        return wrapper(original, self, *args, **kwargs)

    setattr(method, _MARK, True)
    setattr(cls, name, method)


def _init_with_defaults(original, ddp, *args, **kwargs):
    if os.environ.get("SHOAL_TORCH_DDP_DEFAULTS", "1").strip() == "0":
        return original(ddp, *args, **kwargs)
    arguments = bound_arguments(original, ddp, args, kwargs)
    on_shoal = arguments is not None and is_shoal_group(arguments.get("process_group"))
    on_shoal = on_shoal and arguments.get("device_mesh") is None
    if on_shoal and "gradient_as_bucket_view" not in arguments:
        kwargs["gradient_as_bucket_view"] = True
    original(ddp, *args, **kwargs)
    if on_shoal and _takes_default_hook(ddp):
        state = AverageHookState(ddp.process_group, ddp)
        torch_dist._register_comm_hook(ddp.reducer, state, average_hook)
        _default_hooks[ddp] = (ddp.reducer, state)


def default_hook_state(ddp) -> AverageHookState | None:
    """The state of the default hook in ``ddp``'s current reducer, if it has one."""
    reducer, state = _default_hooks.get(ddp, (None, None))
    return state if reducer is not None and reducer is getattr(ddp, "reducer", None) else None


def bound_arguments(function, ddp, args, kwargs) -> dict | None:
    """The arguments the caller gave, by name (None if the call does not fit)."""
    try:
        return inspect.signature(function).bind(ddp, *args, **kwargs).arguments
    except TypeError:
        return None  # torch's own constructor reports the bad call


def is_shoal_group(group) -> bool:
    """Whether ``group`` (None: the default group) runs on Shoal's backend."""
    if group is None and not torch_dist.is_initialized():
        return False
    try:
        backend = str(torch_dist.get_backend(group)).lower()
    except (RuntimeError, ValueError):
        return False  # not a group torch knows: its DDP says so
    return backend in (BACKEND_NAME, *ALIASES)


def _takes_default_hook(ddp) -> bool:
    """A C++ reducer without a hook yet (mixed precision, for one, brings its own)."""
    return (
        getattr(ddp, "reducer", None) is not None
        and not ddp._comm_hooks
        and not getattr(ddp, "_use_python_reducer", False)
    )


class AverageHookState:
    """The default hook's state: its group and DDP, and the hook registered in its place."""

    def __init__(self, group, ddp):
        self.group = group
        self.ddp = weakref.ref(ddp)  # the DDP holds the reducer, which holds this state
        self.replacement = None  # (state, hook)

    def divides_by_ranks_training(self) -> bool:
        """Under torch's Join with divide_by_initial_world_size=False."""
        ddp = self.ddp()
        return (
            ddp is not None
            and ddp._join_config.enable
            and not getattr(ddp, "_divide_by_initial_world_size", True)
        )


def average_hook(state: AverageHookState, bucket):
    """The bucket's average over the group, reduced and divided by the core in one pass."""
    if state.replacement is not None:
        user_state, hook = state.replacement
        return hook(user_state, bucket)
    if state.divides_by_ranks_training():
        return _average_over_ranks_training(state.group, bucket.buffer())
    work = torch_dist.all_reduce(
        bucket.buffer(), op=torch_dist.ReduceOp.AVG, group=state.group, async_op=True
    )
    return work.get_future().then(lambda future: future.value()[0])


def _average_over_ranks_training(group, tensor):
    """The sum divided by the ranks that have not joined. A joined rank runs the hook
    outside backward (to shadow the others' allreduces), the others inside it."""
    import torch

    training = torch.tensor([float(torch._C._current_graph_task_id() != -1)])
    torch_dist.all_reduce(training, group=group)
    count = max(training.item(), 1.0)
    work = torch_dist.all_reduce(tensor, group=group, async_op=True)
    return work.get_future().then(lambda future: future.value()[0].div_(count))


def _register_in_place_of_default(original, ddp, *args, **kwargs):
    """DDP's reducer takes one hook: a later one replaces the default hook's work."""
    state = default_hook_state(ddp)
    if state is None or state.replacement is not None:
        return original(ddp, *args, **kwargs)
    with _registration_into(state):
        return original(ddp, *args, **kwargs)


@contextlib.contextmanager
def _registration_into(state: AverageHookState):
    """DDP's registration calls, for the time of one, hand the hook to ``state``."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    builtins = {
        torch_dist.BuiltinCommHookType.ALLREDUCE: default_hooks.allreduce_hook,
        torch_dist.BuiltinCommHookType.FP16_COMPRESS: default_hooks.fp16_compress_hook,
    }

    def register_hook(reducer, user_state, hook):
        state.replacement = (user_state, hook)

    def register_builtin(reducer, hook_type):
        state.replacement = (state.group, builtins[hook_type])

    saved = torch_dist._register_comm_hook, torch_dist._register_builtin_comm_hook
    torch_dist._register_comm_hook, torch_dist._register_builtin_comm_hook = (
        register_hook,
        register_builtin,
    )
    try:
        yield
    finally:
        torch_dist._register_comm_hook, torch_dist._register_builtin_comm_hook = saved
