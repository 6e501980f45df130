"""``@smp.step``: one call of the step function per microbatch, across the pipeline.

On the pipeline's first rank the arguments are split into microbatches and the function
runs once per microbatch under the schedule (its module calls reach the ranks that own the
modules); the other pipeline ranks serve those calls and receive each microbatch's return
value. The first call partitions the model. Every rank returns the same outputs: a
``StepOutput`` per returned tensor, a list by microbatch for every other value.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch
from shoal.modelparallel.errors import SMPUsageError
from shoal.modelparallel.torch import microbatch
from shoal.modelparallel.torch import state as _state
from shoal.modelparallel.torch.tensorparallel import collectives as tp_collectives


def step(func: Callable | None = None, *, non_split_inputs=None, input_split_axes=None,
         detach_outputs: bool = True):
    """Decorates a step function; usable bare (``@smp.step``) or called (``@smp.step()``)."""
    if func is None:
        return functools.partial(step, non_split_inputs=non_split_inputs,
                                 input_split_axes=input_split_axes,
                                 detach_outputs=detach_outputs)

    @functools.wraps(func)
    def run(*args, **kwargs):
        st = _state.require()
        model = st.model
        if model is None:
            raise SMPUsageError("smp.step needs an smp.DistributedModel: create it before "
                                "calling a step function")
        m = st.cfg.microbatches
        leads = st.topology.pp_rank == 0
        chunks = (microbatch.split_arguments(func, args, kwargs, m, non_split_inputs,
                                             input_split_axes) if leads else None)
        if not model.partitioned:
            first = (lambda: func(*chunks[0][0], **chunks[0][1])) if leads else None
            model.partition_at_first_step(first)
        grad = torch.is_grad_enabled()  # the caller's mode, for every microbatch's thread
        tp_collectives.reset_tags()
        if leads:
            bodies = [_body(func, a, k, grad) for a, k in chunks]
            results = st.engine.lead(bodies, st.cfg.active_microbatches)
        else:
            results = st.engine.follow(m)
        model.after_step()
        microbatch.warn_if_large(results)
        return microbatch.convert_outputs(results, detach_outputs)

    return run


def _body(func, args, kwargs, grad_enabled):
    def call():
        with torch.set_grad_enabled(grad_enabled):
            return func(*args, **kwargs)
    return call
