"""``smp.patches``: SMP's function forms of its features (``smp.patches.checkpoint``)."""

from shoal.modelparallel.torch.patches import checkpoint

__all__ = ["checkpoint"]
