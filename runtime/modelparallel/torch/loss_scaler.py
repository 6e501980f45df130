"""Loss scaling for fp16 training (``smp.DistributedOptimizer``'s ``static_loss_scale``,
``dynamic_loss_scale`` and ``dynamic_loss_args``).

The scale multiplies the loss before the backward so that small float16 gradients do not
flush to zero; the optimizer divides it out of the fp32 master gradients. A step whose
gradients hold an inf or NaN is skipped. With a dynamic scale, ``delayed_shift`` such
overflows (consecutive ones with ``consecutive_hysteresis``) divide the scale by
``scale_factor``, never below ``min_scale``, and ``scale_window`` clean steps in a row
multiply it by ``scale_factor``.
"""

from __future__ import annotations

from typing import Any

DYNAMIC_DEFAULTS: dict[str, Any] = {
    "init_scale": 2.0**32,
    "scale_factor": 2.0,
    "scale_window": 1000,
    "min_scale": 1.0,
    "delayed_shift": 1,
    "consecutive_hysteresis": False,
}


class LossScaler:
    """A fixed scale (1 for bf16: its exponent range is float32's, nothing to guard)."""

    dynamic = False

    def __init__(self, scale: float = 1.0) -> None:
        if not scale > 0:
            raise ValueError(f"the loss scale must be positive (got {scale})")
        self.loss_scale = float(scale)

    def update(self, overflow: bool) -> None:  # noqa: ARG002 - a fixed scale does not move
        return None

    def state_dict(self) -> dict[str, Any]:
        return {"loss_scale": self.loss_scale}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.loss_scale = float(state["loss_scale"])


class DynamicLossScaler(LossScaler):
    dynamic = True

    def __init__(self, init_scale: float = DYNAMIC_DEFAULTS["init_scale"],
                 scale_factor: float = DYNAMIC_DEFAULTS["scale_factor"],
                 scale_window: int = DYNAMIC_DEFAULTS["scale_window"],
                 min_scale: float = DYNAMIC_DEFAULTS["min_scale"],
                 delayed_shift: int = DYNAMIC_DEFAULTS["delayed_shift"],
                 consecutive_hysteresis: bool = DYNAMIC_DEFAULTS["consecutive_hysteresis"]) -> None:
        super().__init__(init_scale)
        if not scale_factor > 1:
            raise ValueError(f"'scale_factor' must be above 1 (got {scale_factor})")
        if scale_window < 1 or delayed_shift < 1:
            raise ValueError(f"'scale_window' and 'delayed_shift' must be >= 1 (got "
                             f"{scale_window}, {delayed_shift})")
        self.scale_factor = float(scale_factor)
        self.scale_window = int(scale_window)
        self.min_scale = float(min_scale)
        self.delayed_shift = int(delayed_shift)
        self.consecutive_hysteresis = bool(consecutive_hysteresis)
        self.hysteresis = self.delayed_shift  # overflows left before the scale drops
        self.clean_steps = 0  # steps without overflow since the last overflow or growth

    def update(self, overflow: bool) -> None:
        if overflow:
            self.clean_steps = 0
            if self.hysteresis <= 1:
                self.loss_scale = max(self.loss_scale / self.scale_factor, self.min_scale)
            else:
                self.hysteresis -= 1
            return
        if self.consecutive_hysteresis:
            self.hysteresis = self.delayed_shift  # only overflows in a row count
        self.clean_steps += 1
        if self.clean_steps >= self.scale_window:
            self.clean_steps = 0
            self.hysteresis = self.delayed_shift
            self.loss_scale *= self.scale_factor

    def state_dict(self) -> dict[str, Any]:
        return {"loss_scale": self.loss_scale, "hysteresis": self.hysteresis,
                "clean_steps": self.clean_steps}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.loss_scale = float(state["loss_scale"])
        self.hysteresis = int(state.get("hysteresis", self.delayed_shift))
        self.clean_steps = int(state.get("clean_steps", 0))


def make_scaler(static_loss_scale: float | None, dynamic_loss_scale: bool,
                dynamic_loss_args: dict[str, Any] | None) -> LossScaler:
    if dynamic_loss_scale:
        args = dict(dynamic_loss_args or {})
        unknown = sorted(set(args) - set(DYNAMIC_DEFAULTS))
        if unknown:
            raise TypeError(f"unknown dynamic_loss_args: {unknown} (known: "
                            f"{sorted(DYNAMIC_DEFAULTS)})")
        return DynamicLossScaler(**args)
    return LossScaler(1.0 if static_loss_scale is None else static_loss_scale)


class ScaledOptimizerView:
    """What scripts read on an optimizer that wraps theirs (``self.optimizer``) and scales
    the loss (``self.scaler``): the inner optimizer's groups, state and defaults (LR
    schedulers set ``param_groups[i]["lr"]``), and the current loss scale."""

    optimizer: Any
    scaler: LossScaler

    @property
    def param_groups(self):
        return self.optimizer.param_groups

    @property
    def state(self):
        return self.optimizer.state

    @property
    def defaults(self):
        return self.optimizer.defaults

    @property
    def loss_scale(self) -> float:
        return self.scaler.loss_scale

    @property
    def cur_scale(self) -> float:
        return self.scaler.loss_scale
