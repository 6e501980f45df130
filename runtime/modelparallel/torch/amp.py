"""``smp.amp.GradScaler``: the loss scaler SMP scripts build for mixed precision.

On Shoal's CPU runtime fp16 training is refused at ``smp.init``, so there is nothing to
scale: the scaler is torch's own, disabled (``scale`` returns the loss, ``step`` steps the
optimizer, ``update`` does nothing), and scripts that use it run unchanged.
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
