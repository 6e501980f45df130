"""torch's DistributedDataParallel on a Shoal process group keeps gradients in its buckets.

By default torch's DDP copies every gradient into its bucket (dividing by the world size on
the way) before the allreduce, and copies the reduced bucket back into the gradient after
it: two passes over all gradients per step, on the training thread. With
``gradient_as_bucket_view=True`` the gradients *are* views of the buckets, so both copies
go (the division stays, in place); the reduction and its result are the same. On the
communication-heavy benchmark (``benchmarks/ddp_step.py``) the copies were about a sixth
of the step. So for a DDP whose process group is on backend ``shoal`` (or ``smddp``),
``gradient_as_bucket_view`` defaults to True; passing it explicitly, either way, wins.
Other backends' DDPs are left exactly as torch makes them.
"""

from __future__ import annotations

import functools
import inspect

import torch.distributed as torch_dist
from torch.nn.parallel import DistributedDataParallel

from .backend import ALIASES, BACKEND_NAME

_MARK = "_shoal_bucket_view_default"


def install() -> None:
    """Wrap ``DistributedDataParallel.__init__`` once (idempotent)."""
    original = DistributedDataParallel.__init__
    if getattr(original, _MARK, False):
        return
    signature = inspect.signature(original)

    @functools.wraps(original)
    def __init__(self, *args, **kwargs):
        if wants_bucket_view_default(signature, self, args, kwargs):
            kwargs["gradient_as_bucket_view"] = True
        original(self, *args, **kwargs)

    setattr(__init__, _MARK, True)
    DistributedDataParallel.__init__ = __init__


def wants_bucket_view_default(signature: inspect.Signature, ddp, args, kwargs) -> bool:
    """True if the caller left ``gradient_as_bucket_view`` unset and the group is Shoal's."""
    try:
        arguments = signature.bind(ddp, *args, **kwargs).arguments
    except TypeError:
        return False  # torch's own constructor reports the bad call
    if "gradient_as_bucket_view" in arguments or arguments.get("device_mesh") is not None:
        return False
    return is_shoal_group(arguments.get("process_group"))


def is_shoal_group(group) -> bool:
    """Whether ``group`` (None: the default group) runs on Shoal's backend."""
    if group is None and not torch_dist.is_initialized():
        return False
    try:
        backend = str(torch_dist.get_backend(group)).lower()
    except (RuntimeError, ValueError):
        return False  # not a group torch knows: its DDP says so
    return backend in (BACKEND_NAME, *ALIASES)
