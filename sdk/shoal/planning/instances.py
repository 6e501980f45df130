"""What an instance type brings to a training job: GPUs, their memory, speed and links.

One table, read by the advisor and the sizing plans (GPUs per instance) and by the strategy
planner (memory, peak FLOP/s, memory bandwidth, the links inside a host and between hosts).
Figures are the vendors' dense peaks (NVIDIA's data sheets for the GPUs, AWS's instance pages
for the network); what a job reaches of them is the planner's efficiency, calibrated once per
instance type or measured with ``shoal plan strategy --calibrate``.

``intra_gbps`` is the bus bandwidth an AllReduce reaches inside one host, in GB/s per GPU
(NVSwitch, NVLink or PCIe); ``network_gbits`` is the host's network in Gbit/s (EFA where the
instance has it).
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Mapping
from types import MappingProxyType

import attrs

from shoal.errors import ValidationError


@attrs.frozen
class Instance:
    """One instance type's accelerators and links."""

    name: str
    gpus: int
    gpu: str
    memory_gib: float  # per GPU
    fp32_tflops: float  # per GPU, dense
    half_tflops: float  # per GPU, dense fp16/bf16 (tensor cores where the GPU has them)
    hbm_gbps: float  # GPU memory bandwidth, GB/s
    intra_gbps: float  # AllReduce bus bandwidth inside the host, GB/s per GPU
    network_gbits: float  # per host
    nvlink: bool
    bf16: bool = True  # the GPU computes in bfloat16

    def tflops(self, precision: str) -> float:
        """Peak dense TFLOP/s for ``precision`` ("fp32", "fp16", "bf16")."""
        if precision == "fp32" or (precision == "bf16" and not self.bf16):
            return self.fp32_tflops
        return self.half_tflops


def _family(prefix: str, gpu: str, memory: float, fp32: float, half: float, hbm: float,
            intra: float, nvlink: bool, sizes: Mapping[str, tuple[int, float]],
            bf16: bool = True) -> dict[str, Instance]:
    return {f"ml.{prefix}.{size}": Instance(f"ml.{prefix}.{size}", gpus, gpu, memory, fp32, half,
                                           hbm, intra, net, nvlink, bf16)
            for size, (gpus, net) in sizes.items()}


_PCIE3, _PCIE4 = 10.0, 20.0  # GB/s an AllReduce reaches over PCIe within a host

INSTANCES: Mapping[str, Instance] = MappingProxyType({
    **_family("p2", "K80", 12, 4.4, 4.4, 240, _PCIE3, False,
              {"xlarge": (1, 1), "8xlarge": (8, 10), "16xlarge": (16, 25)}, bf16=False),
    **_family("p3", "V100", 16, 15.7, 125, 900, 130, True,
              {"2xlarge": (1, 10), "8xlarge": (4, 10), "16xlarge": (8, 25)}, bf16=False),
    **_family("p3dn", "V100", 32, 15.7, 125, 900, 130, True, {"24xlarge": (8, 100)}, bf16=False),
    **_family("p4d", "A100", 40, 19.5, 312, 1555, 230, True, {"24xlarge": (8, 400)}),
    **_family("p4de", "A100", 80, 19.5, 312, 2039, 230, True, {"24xlarge": (8, 400)}),
    **_family("p5", "H100", 80, 67, 989, 3350, 360, True, {"48xlarge": (8, 3200)}),
    **_family("p5e", "H200", 141, 67, 989, 4800, 360, True, {"48xlarge": (8, 3200)}),
    **_family("g4dn", "T4", 16, 8.1, 65, 320, _PCIE3, False,
              {"xlarge": (1, 25), "2xlarge": (1, 25), "4xlarge": (1, 25), "8xlarge": (1, 50),
               "16xlarge": (1, 50), "12xlarge": (4, 50), "metal": (8, 100)}, bf16=False),
    **_family("g5", "A10G", 24, 31.2, 70, 600, _PCIE4, False,
              {"xlarge": (1, 10), "2xlarge": (1, 10), "4xlarge": (1, 25), "8xlarge": (1, 25),
               "16xlarge": (1, 25), "12xlarge": (4, 40), "24xlarge": (4, 50),
               "48xlarge": (8, 100)}),
})  # fmt: skip


def gpus_per_instance(instance_type: str | None) -> int | None:
    """GPUs of an instance type, None when unknown (CPU types, "local")."""
    found = INSTANCES.get(instance_type or "")
    return found.gpus if found else None


def instance(instance_type: str) -> Instance:
    """The table's entry, or a ValidationError naming the closest known types."""
    found = INSTANCES.get(instance_type)
    if found is not None:
        return found
    close = difflib.get_close_matches(str(instance_type), list(INSTANCES), n=3, cutoff=0.6)
    hint = f"; did you mean {' or '.join(map(repr, close))}?" if close else "."
    raise ValidationError(
        f"unknown GPU instance type {instance_type!r}{hint} The planner knows "
        f"{', '.join(sorted({i.name.rsplit('.', 1)[0] + '.*' for i in INSTANCES.values()}))}; "
        "for another machine, give measured figures with --calibration")


LOCAL_INSTANCE_TYPES = ("local", "local_gpu")


def local_machine(processes: int) -> Instance:
    """This machine as ``processes`` CPU ranks (local mode): memory shared between them.

    The speeds are conservative CPU figures; a calibration replaces them with measured ones.
    """
    import psutil

    memory_gib = psutil.virtual_memory().total / 1024**3 * 0.8 / processes
    return Instance("local", processes, "cpu", memory_gib, fp32_tflops=0.05, half_tflops=0.05,
                    hbm_gbps=10, intra_gbps=2, network_gbits=10, nvlink=False)


def local_contention(ranks: int) -> float:
    """CPU ranks per core of this machine when ``ranks`` run on it (at least 1)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1.0, ranks / max(1, cores or 1))
