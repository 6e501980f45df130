"""The fp16 loss scale of ``smp.DistributedOptimizer`` in isolation: SMP's documented
``dynamic_loss_args`` (init_scale 2**32, scale_factor 2, scale_window 1000, min_scale 1,
delayed_shift 1, consecutive_hysteresis False) and what each does."""

from __future__ import annotations

import pytest
from shoal.modelparallel.torch.loss_scaler import (
    DynamicLossScaler,
    LossScaler,
    make_scaler,
)


def test_defaults_are_smps():
    scaler = make_scaler(None, True, None)
    assert isinstance(scaler, DynamicLossScaler)
    assert scaler.loss_scale == 2.0**32 and scaler.scale_factor == 2.0
    assert (scaler.scale_window, scaler.min_scale, scaler.delayed_shift) == (1000, 1.0, 1)
    assert scaler.consecutive_hysteresis is False


def test_static_scale_never_moves():
    scaler = make_scaler(128.0, False, None)
    assert type(scaler) is LossScaler and scaler.loss_scale == 128.0
    for overflow in (True, False, True):
        scaler.update(overflow)
    assert scaler.loss_scale == 128.0
    assert make_scaler(None, False, None).loss_scale == 1.0


def test_overflow_halves_the_scale():
    scaler = DynamicLossScaler(init_scale=1024.0)
    scaler.update(True)
    assert scaler.loss_scale == 512.0
    scaler.update(True)
    assert scaler.loss_scale == 256.0


def test_delayed_shift_waits_for_that_many_overflows():
    scaler = DynamicLossScaler(init_scale=1024.0, delayed_shift=2)
    scaler.update(True)
    assert scaler.loss_scale == 1024.0  # the first overflow only uses up the hysteresis
    scaler.update(True)
    assert scaler.loss_scale == 512.0
    scaler.update(True)  # hysteresis spent: each further overflow halves
    assert scaler.loss_scale == 256.0


def test_hysteresis_counts_any_overflows_unless_consecutive():
    scattered = DynamicLossScaler(init_scale=64.0, delayed_shift=2, scale_window=100)
    consecutive = DynamicLossScaler(init_scale=64.0, delayed_shift=2, scale_window=100,
                                    consecutive_hysteresis=True)
    for scaler in (scattered, consecutive):
        scaler.update(True)
        scaler.update(False)
        scaler.update(True)
    assert scattered.loss_scale == 32.0  # two overflows, a clean step between
    assert consecutive.loss_scale == 64.0  # the clean step restored the hysteresis


def test_growth_after_scale_window_clean_steps():
    scaler = DynamicLossScaler(init_scale=8.0, scale_window=3)
    scaler.update(False)
    scaler.update(False)
    assert scaler.loss_scale == 8.0
    scaler.update(False)
    assert scaler.loss_scale == 16.0
    scaler.update(False)
    scaler.update(True)  # an overflow restarts the window
    assert scaler.loss_scale == 8.0
    scaler.update(False)
    scaler.update(False)
    assert scaler.loss_scale == 8.0
    scaler.update(False)
    assert scaler.loss_scale == 16.0


def test_min_scale_is_a_floor():
    scaler = DynamicLossScaler(init_scale=4.0, min_scale=2.0, scale_factor=4.0)
    scaler.update(True)
    assert scaler.loss_scale == 2.0
    scaler.update(True)
    assert scaler.loss_scale == 2.0


def test_state_round_trip():
    scaler = DynamicLossScaler(init_scale=64.0, delayed_shift=3, scale_window=5)
    scaler.update(True)
    scaler.update(False)
    other = DynamicLossScaler(delayed_shift=3, scale_window=5)
    other.load_state_dict(scaler.state_dict())
    assert (other.loss_scale, other.hysteresis, other.clean_steps) == (64.0, 2, 1)


def test_bad_arguments():
    with pytest.raises(TypeError, match="unknown dynamic_loss_args"):
        make_scaler(None, True, {"init_scael": 2.0})
    with pytest.raises(ValueError, match="scale_factor"):
        DynamicLossScaler(scale_factor=1.0)
    with pytest.raises(ValueError, match="positive"):
        LossScaler(0.0)
