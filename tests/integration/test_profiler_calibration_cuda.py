"""The calibration probe on a GPU: its figures are the GPU's, in the precision planned.

Needs a CUDA device; skipped, saying so, where torch sees none.
"""

import pytest

torch = pytest.importorskip("torch")
from shoal.profiler import calibration  # noqa: E402

pytestmark = [
    pytest.mark.torch, pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(),
                       reason="needs a CUDA device: torch.cuda.is_available() is False here"),
]


def test_the_probe_measures_the_gpu_in_the_planned_precision():
    torch.backends.cuda.matmul.allow_tf32 = False  # fp32 as fp32, so 16 bits must be faster
    device = calibration.pick_device(0, "bf16")
    assert device.kind == "cuda" and device.dtype == "bfloat16"
    half = calibration.device_figures(device, repeats=3)
    full = calibration.matmul_rate(4096, 3, calibration.pick_device(0, "fp32"))
    # tensor cores: a 16-bit matmul runs several times faster than an fp32 one on any GPU
    # since Volta; a CPU reaches neither figure
    assert half["flops"] > 3 * full > 3e12
    # an optimizer step over 256 MiB of weights on the GPU's memory, not the host's
    assert half["hbm"] > 100e9
    assert 0 < half["layer_overhead"] < 1e-3


def test_timing_waits_for_the_gpu():
    device = calibration.pick_device(0, "fp32")
    a = torch.randn(8192, 8192, device=device.name)
    # 20 products of 8192^3: about a TFLOP, which no GPU finishes in a millisecond, however
    # fast it queues them
    seconds = calibration.timed(lambda: [a @ a for _ in range(20)], 2, device)
    assert seconds > 1e-3
