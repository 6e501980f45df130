"""``smp.save`` / ``smp.load``: checkpoints written per pipeline rank, or whole by rank 0.

``partial=True`` (what ``local_state_dict`` holds): every calling rank writes
``{f}_{pp_rank}_{tp_rank}.pt`` and reads its own part back; a checkpoint whose parts do not
match this job's pipeline is refused. ``partial=False``: only rank 0 writes ``f``.
"""

from __future__ import annotations

import glob
import os
import re
from typing import Any

import torch

from shoal.modelparallel.errors import SMPCheckpointError
from shoal.modelparallel.torch import state as _state


def _part_path(f: str, pp_rank: int, tp_rank: int) -> str:
    return f"{f}_{pp_rank}_{tp_rank}.pt"


def save(obj: Any, f: str, partial: bool = True, pickle_module=None, pickle_protocol: int = 2,
         v3: bool = False) -> None:
    topo = _state.require().topology
    kwargs = {"pickle_protocol": pickle_protocol}
    if pickle_module is not None:
        kwargs["pickle_module"] = pickle_module
    if partial:
        path = _part_path(str(f), topo.pp_rank, topo.tp_rank)
        if v3:
            path = f"{f}_{topo.pp_rank}_{topo.tp_rank}_{topo.rdp_rank}.pt"
        torch.save(obj, path, **kwargs)
    elif topo.rank == 0:
        torch.save(obj, str(f), **kwargs)


def load(f: str, map_location=None, pickle_module=None, pickle_load_args=None,
         partial: bool = True, back_compat: bool = False) -> Any:
    topo = _state.require().topology
    kwargs = dict(pickle_load_args or {})
    if pickle_module is not None:
        kwargs["pickle_module"] = pickle_module
    kwargs.setdefault("weights_only", False)  # SMP checkpoints hold optimizer state and more
    if not partial:
        return torch.load(str(f), map_location=map_location, **kwargs)
    _check_parts(str(f), topo.pp_size, topo.tp_size)
    path = _part_path(str(f), topo.pp_rank, topo.tp_rank)
    if back_compat and not os.path.exists(path):
        path = f"{f}_{topo.pp_rank}"
    return torch.load(path, map_location=map_location, **kwargs)


def _check_parts(f: str, pp: int, tp: int) -> None:
    pattern = re.compile(re.escape(os.path.basename(f)) + r"_(\d+)_(\d+)\.pt$")
    found = [m for m in (pattern.match(os.path.basename(p)) for p in glob.glob(f"{glob.escape(f)}_*.pt")) if m]
    if not found:
        return  # a single part or the old naming: torch.load says what is missing
    parts = {int(m.group(1)) for m in found}
    tps = {int(m.group(2)) for m in found}
    if len(parts) != pp or len(tps) != tp:
        raise SMPCheckpointError(
            f"Can not load a {len(parts)} parts checkpoint to a model with {pp} pipeline "
            f"parallel partitions and tensor parallel degree {tp} ({f}_*.pt)")
