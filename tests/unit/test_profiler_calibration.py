"""The calibration probe's arithmetic: alpha-beta from two sizes, one figure per key."""

import numpy as np
import pytest
from shoal.profiler import calibration


@pytest.mark.parametrize("ranks", [2, 4, 8])
def test_alpha_and_bandwidth_are_recovered_from_two_all_reduce_times(ranks):
    alpha, bw = 20e-6, 3e9

    def seconds(n):  # ring all-reduce: 2 (r - 1) hops, 2 (r - 1) / r of the buffer each rank
        return 2 * (ranks - 1) * alpha + 2 * (ranks - 1) / ranks * n / bw

    got_alpha, got_bw = calibration._alpha_beta(ranks, seconds(calibration.SMALL),
                                                seconds(calibration.LARGE))
    assert got_alpha == pytest.approx(alpha, rel=1e-6)
    assert got_bw == pytest.approx(bw, rel=1e-6)


def test_noise_never_gives_a_negative_latency():
    alpha, bw = calibration._alpha_beta(2, 1e-9, 1e-2)
    assert alpha == 0.0 and bw > 0


def test_each_figure_is_the_slowest_ranks():
    keys = calibration.KEYS
    rows = np.full((3, len(keys)), np.nan)
    rows[:, keys.index("flops")] = [3e9, 1e9, 2e9]
    rows[:, keys.index("layer_overhead")] = [1e-4, 3e-4, 2e-4]
    rows[:, keys.index("alpha_net")] = [5e-6, np.nan, 7e-6]
    rows[:, keys.index("contention")] = [2.1, 1.0, 1.9]  # the typical rank's, not an outlier's
    merged = calibration._merge(rows)
    assert merged == {"flops": 1e9, "layer_overhead": 3e-4, "alpha_net": 7e-6,
                      "contention": 1.9}


def test_the_latency_of_a_synchronization_is_paired_against_drift():
    # the machine slows down over the probe; every pair's with-block is 200 us slower
    pairs = [(1e-3 * (1 + i / 10), 1e-3 * (1 + i / 10) + 200e-6) for i in range(10)]
    assert calibration.paired_cost(pairs) == pytest.approx(200e-6)
    # one pair hit by a long stall on the machine (not by the all-reduce) moves nothing
    pairs[3] = (pairs[3][0], pairs[3][1] + 50e-3)
    assert calibration.paired_cost(pairs) == pytest.approx(200e-6)


def test_a_synchronization_never_costs_less_than_nothing():
    assert calibration.paired_cost([(2e-3, 1.9e-3), (2e-3, 1.95e-3), (2e-3, 1.99e-3)]) == 0.0


def test_a_rank_without_a_gpu_computes_on_its_cpu_in_float32(monkeypatch):
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    device = calibration.pick_device(3, "bf16")
    assert device == calibration.Device("cpu", "float32")
    with pytest.raises(ValueError, match="'precision' must be one of"):
        calibration.pick_device(0, "fp8")


def test_ranks_share_the_gpus_round_robin(monkeypatch):
    torch = pytest.importorskip("torch")
    chosen = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    monkeypatch.setattr(torch.cuda, "set_device", chosen.append)
    assert calibration.pick_device(5, "fp16") == calibration.Device("cuda:1", "float16")
    assert chosen == [1]


def test_the_device_figures_of_a_cpu_rank():
    pytest.importorskip("torch")
    figures = calibration.device_figures(calibration.Device(), hidden=32, repeats=1)
    assert set(figures) == {"flops", "layer_overhead", "hbm"}
    assert all(value > 0 for value in figures.values())


def test_the_layer_overhead_is_per_layer_of_one_graph(monkeypatch):
    """A model's layers share one backward call: the probe times a stack as one graph, so
    its figure is per layer (STACK of them, three passes each), not per backward call."""
    pytest.importorskip("torch")
    backward_calls = []
    import torch

    real = torch.Tensor.backward

    def counting(self, *args, **kwargs):
        backward_calls.append(1)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(torch.Tensor, "backward", counting)
    monkeypatch.setattr(calibration, "timed", lambda fn, repeats, device: (fn(), 1.0)[1])
    seconds = calibration.layer_overhead(1)
    assert len(backward_calls) == 8  # one per forward of the whole stack
    assert seconds == pytest.approx(1.0 / (8 * calibration.STACK) / 3)
