"""``smp.patches.checkpoint``: activation checkpointing of one call, as functions.

``checkpoint(module, *args)`` runs ``module(*args)`` keeping only its inputs for the
backward; ``checkpoint_sequential(sequential, input, strategy)`` runs an ``nn.Sequential``
by groups of children (activations.py's strategies), each group so. A module that other
pipeline ranks (partly) run is called as it is: its recomputation could not run here.
"""

from __future__ import annotations

import logging

import torch
from shoal.modelparallel.torch import activations

log = logging.getLogger("shoal.modelparallel")


def checkpoint(module: torch.nn.Module, *args, preserve_rng_state: bool = True):
    """``module(*args)`` with its activations recomputed in the backward."""
    if not activations.runs_here(module):
        log.warning("%s runs on other pipeline ranks: called without checkpointing",
                    type(module).__name__)
        return module(*args)
    return activations.checkpointed_call(module, [module], args, {}, preserve_rng_state,
                                         what=type(module).__name__)


def checkpoint_sequential(sequential: torch.nn.Sequential, input, strategy: str = "each",
                          preserve_rng_state: bool = True, pack_args_as_tuple: bool = False):
    """``sequential(input)`` with each group of children (``strategy``) checkpointed."""
    if not isinstance(sequential, torch.nn.Sequential):
        raise TypeError(f"checkpoint_sequential needs an nn.Sequential "
                        f"(got {type(sequential).__name__})")
    activations.check_strategy(sequential, strategy)
    activations.warn_packing(pack_args_as_tuple)
    children = list(sequential._modules.values())
    x = input
    for start, end in activations.strategy_groups(len(children), strategy):
        group = children[start:end]
        if not all(activations.runs_here(child) for child in group):
            for child in group:
                x = child(x)
            continue
        x = activations.checkpointed_call(activations.run_of(group), group, (x,), {}, preserve_rng_state,
                                          what=f"children [{start}:{end}]")
    return x
