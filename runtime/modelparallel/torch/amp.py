"""``smp.amp.GradScaler``: the loss scaler SMP scripts build for mixed precision.

The scaler is torch's own, disabled (``scale`` returns the loss, ``step`` steps the
optimizer, ``update`` does nothing): with ``fp16: True`` the loss scaling is the
optimizer's (``smp.DistributedOptimizer``'s static or dynamic loss scale, applied by
``model.backward``), so a script that also drives this scaler scales once, not twice, and
without fp16 there is nothing to scale.
"""

from __future__ import annotations

import torch


class GradScaler(torch.amp.GradScaler):
    def __init__(self, init_scale: float = 2.0**16, growth_factor: float = 2.0,
                 backoff_factor: float = 0.5, growth_interval: int = 2000,
                 enabled: bool = True) -> None:
        super().__init__("cpu", init_scale=init_scale, growth_factor=growth_factor,
                         backoff_factor=backoff_factor, growth_interval=growth_interval,
                         enabled=False)
