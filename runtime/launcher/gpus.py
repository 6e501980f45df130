"""The GPUs a host offers its ranks: the machine's, as ``nvidia-smi`` lists them, narrowed
by ``CUDA_VISIBLE_DEVICES`` with CUDA's own rules, so that ``SM_NUM_GPUS`` and the one
rank per GPU the launcher starts match what ``torch.cuda.device_count()`` will say.

CUDA's rules: unset, every device; set, a comma-separated list of indices or UUIDs
(``GPU-...``, ``MIG-...``, a unique prefix will do) read up to its first invalid entry
(so ``""`` and ``"-1"`` hide every device); a device named twice ends the list.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Mapping, Sequence

import attrs

# "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-2c1f...)"; MIG devices are indented beneath.
_GPU_LINE = re.compile(r"^GPU (\d+): .*\(UUID: (GPU-[0-9a-fA-F-]+)\)")
_MIG_LINE = re.compile(r"^\s+MIG .*\(UUID: (MIG-[0-9a-zA-Z/-]+)\)")


@attrs.frozen
class Device:
    index: int
    uuid: str


def list_devices() -> list[Device]:
    """The machine's GPUs, from ``nvidia-smi --list-gpus`` (none without the tool)."""
    if not shutil.which("nvidia-smi"):
        return []
    try:
        out = subprocess.run(["nvidia-smi", "--list-gpus"], capture_output=True, text=True,
                             check=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return parse_list(out)


def parse_list(text: str) -> list[Device]:
    """Devices of ``nvidia-smi --list-gpus`` output (MIG instances as devices of their own,
    numbered after the GPUs, as CUDA enumerates them)."""
    gpus, migs = [], []
    for line in text.splitlines():
        if match := _GPU_LINE.match(line):
            gpus.append(Device(int(match[1]), match[2]))
        elif match := _MIG_LINE.match(line):
            migs.append(match[1])
    return gpus + [Device(len(gpus) + n, uuid) for n, uuid in enumerate(migs)]


def visible(devices: Sequence[Device], setting: str | None) -> list[Device]:
    """The devices a process sees under ``CUDA_VISIBLE_DEVICES=setting`` (None: unset)."""
    if setting is None:
        return list(devices)
    seen: list[Device] = []
    for entry in (part.strip() for part in setting.split(",")):
        device = _lookup(devices, entry)
        if device is None or device in seen:
            break
        seen.append(device)
    return seen


def _lookup(devices: Sequence[Device], entry: str) -> Device | None:
    if entry.isdigit():
        return next((d for d in devices if d.index == int(entry)), None)
    if entry.startswith(("GPU-", "MIG-")):
        matches = [d for d in devices if d.uuid.startswith(entry)]
        return matches[0] if len(matches) == 1 else None
    return None


def count(environ: Mapping[str, str], devices: Sequence[Device] | None = None) -> int:
    """How many GPUs the host's ranks can use."""
    devices = list_devices() if devices is None else devices
    return len(visible(devices, environ.get("CUDA_VISIBLE_DEVICES")))
