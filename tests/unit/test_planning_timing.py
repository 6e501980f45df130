"""Timing one block on this machine: its speed next to a matmul, applied to every block."""

import pytest
from shoal.planning.costs import CostModel, Hardware, Workload
from shoal.planning.strategy import Candidate
from shoal.planning.tracing import profile_factory

FACTORY = """
import torch
from torch import nn

class Dense(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(512, 512)

    def forward(self, x):
        return self.linear(x)

class Busy(nn.Module):  # one small matmul, then many element-wise passes FLOP counts miss
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(512, 8)
        self.back = nn.Linear(8, 512)

    def forward(self, x):
        y = self.linear(x)
        for _ in range(200):
            y = torch.tanh(y) * 0.5 + y
        return self.back(y)

def dense():
    return nn.Sequential(*[Dense() for _ in range(4)])

def busy():
    return nn.Sequential(*[Busy() for _ in range(4)])
"""


@pytest.fixture
def factory(tmp_path):
    path = tmp_path / "models.py"
    path.write_text(FACTORY)
    return str(path)


@pytest.mark.serial  # a speed measured beside another worker's tests is that worker's too
def test_a_block_slower_than_its_flops_gets_a_lower_speed(factory):
    dense = profile_factory(f"{factory}:dense", (64, 512), measure_blocks=True)
    busy = profile_factory(f"{factory}:busy", (64, 512), measure_blocks=True)
    dense_speed = dense.description["block_speed"]
    busy_speed = busy.description["block_speed"]
    assert 0.01 <= busy_speed < dense_speed / 5 <= 2.0 / 5
    assert all(layer.speed == busy_speed for layer in busy.layers if layer.repeated)
    assert dense.description["block_seconds"] > 0
    # the timed block's operations were dispatched within its measured time: counted once
    assert all(layer.ops == 0 for layer in busy.layers if layer.repeated)


def test_without_measuring_every_speed_is_one(factory):
    profile = profile_factory(f"{factory}:dense", (64, 512))
    assert {layer.speed for layer in profile.layers} == {1.0}
    assert "block_speed" not in profile.description
    assert all(layer.ops > 0 for layer in profile.layers if layer.repeated)


def test_the_cost_model_prices_flops_at_the_measured_speed(factory):
    import attrs

    profile = profile_factory(f"{factory}:dense", (64, 512))
    slow = attrs.evolve(profile, layers=[attrs.evolve(layer, speed=0.25) if layer.repeated
                                         else layer for layer in profile.layers])
    hw = Hardware(gpus_per_host=1, hosts=1, memory=1e12, flops=1e12, layer_overhead=0.0,
                  hbm=1e12, intra_bw=1e11, net_bw=1e10)
    candidate = Candidate(1, 1, 1)
    fast = CostModel(Workload(profile, 64), hw).estimate(candidate).time["compute"]
    slowed = CostModel(Workload(slow, 64), hw).estimate(candidate).time["compute"]
    assert slowed == pytest.approx(4 * fast)
