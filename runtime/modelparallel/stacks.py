"""A model's main stack of blocks: what ``SHOAL_ACTIVATION_CHECKPOINTING=blocks`` checkpoints
in the runtime and what the strategy planner treats as the model's repeated layers.

One rule for both, so that a plan's checkpointing is the one the job applies: the
``ModuleList`` or ``nn.Sequential`` of at least two children, all of one class, holding the
most parameters (the first, outermost, of equals). Imports torch only when called.
"""

from __future__ import annotations


def main_stack(modules: dict) -> str | None:
    """The qualified name of the main stack among ``modules`` (name -> module, parents
    first, as ``named_modules`` gives them); None when there is none."""
    import torch

    best, most = None, 0
    for name, module in modules.items():
        if not isinstance(module, (torch.nn.ModuleList, torch.nn.Sequential)):
            continue
        children = list(module._modules.values())
        if len(children) < 2 or any(c is None for c in children) \
                or len({type(c) for c in children}) != 1:
            continue
        size = sum(p.numel() for p in module.parameters())
        if size > most:
            best, most = name, size
    return best
