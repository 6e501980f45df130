"""A traced model's block, timed on this machine: how fast it computes next to a matmul.

The planner prices a layer's FLOPs at the device's matmul rate. Blocks that are not matmul
bound (convolutions of few channels, normalisations, element-wise work) run slower than that.
``measure_block_speed`` builds one block of the model with real weights on the CPU, times its
forward and backward on the traced block input, and divides the time a matmul would take for
the same FLOPs by it: the block's ``speed``, which the cost model applies on the target
device too (the ratio carries over; the absolute time does not).
"""

from __future__ import annotations

import copy

import attrs

from shoal.planning.models import ModelProfile
from shoal.planning.tracing import main_stack
from shoal.profiler.calibration import matmul_rate, timed

SPEED_RANGE = (0.01, 2.0)


def _materialised(block):
    import torch

    real = copy.deepcopy(block).to_empty(device="cpu")
    with torch.no_grad():
        for param in real.parameters():
            param.normal_(0.0, 0.02)
    return real


def _inputs(shapes):
    import torch

    return [torch.zeros(shape, dtype=getattr(torch, dtype)) if not dtype.startswith("float")
            else torch.randn(shape, dtype=getattr(torch, dtype), requires_grad=True)
            for shape, dtype in shapes]


def measure_block_speed(model, profile: ModelProfile, repeats: int = 3) -> ModelProfile:
    """``profile`` with each repeated block's ``speed`` measured (unchanged without a stack)."""
    stack = main_stack(model)
    shapes = profile.description.get("block_input")
    if stack is None or not shapes:
        return profile
    block = _materialised(stack[1][0])
    inputs = _inputs(shapes)

    def step():
        out = block(*inputs)
        outs = out if isinstance(out, (tuple, list)) else (out,)
        sum(o.float().sum() for o in outs if hasattr(o, "is_floating_point")
            and o.is_floating_point()).backward()

    seconds = timed(step, repeats)
    flops = next(layer.flops for layer in profile.layers if layer.repeated)
    batch = profile.description.get("sample_batch", 1)
    ideal = 3 * flops * batch / matmul_rate(512, repeats)
    speed = min(max(ideal / seconds, SPEED_RANGE[0]), SPEED_RANGE[1])
    # the time measured includes the block's dispatch of its operations: not priced again
    layers = [attrs.evolve(layer, speed=speed, ops=0) if layer.repeated else layer
              for layer in profile.layers]
    description = {**profile.description, "block_speed": speed, "block_seconds": seconds}
    return attrs.evolve(profile, layers=layers, description=description)
