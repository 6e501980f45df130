"""``smp.save`` / ``smp.load``: checkpoints written per pipeline rank, or whole by rank 0.

``partial=True`` (what ``local_state_dict`` holds): every calling rank writes
``{f}_{pp_rank}_{tp_rank}.pt`` and reads its own part back; a checkpoint whose parts do not
match this job's pipeline is refused. ``partial=False``: only rank 0 writes ``f``.

With ``shard_optimizer_state`` each data-parallel replica holds a different part of the
optimizer state, so every rank saves its own (``v3=True``:
``{f}_{pp_rank}_{tp_rank}_{rdp_rank}.pt``, what ``save_checkpoint`` does for the optimizer)
and a partial load takes this rank's v3 file where there is one.
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
    v3 = f"{f}_{_rank_suffix(topo)}.pt"
    if _state.require().cfg.shard_optimizer_state and os.path.exists(v3):
        path = v3  # this replica's shard of the optimizer state
    elif back_compat and not os.path.exists(path):
        path = f"{f}_{topo.pp_rank}"
    return torch.load(path, map_location=map_location, **kwargs)


def _check_parts(f: str, pp: int, tp: int) -> None:
    pattern = re.compile(re.escape(os.path.basename(f)) + r"_(\d+)_(\d+)(?:_\d+)?\.pt$")
    found = [m for m in (pattern.match(os.path.basename(p)) for p in glob.glob(f"{glob.escape(f)}_*.pt")) if m]
    if not found:
        return  # a single part or the old naming: torch.load says what is missing
    parts = {int(m.group(1)) for m in found}
    tps = {int(m.group(2)) for m in found}
    if len(parts) != pp or len(tps) != tp:
        raise SMPCheckpointError(
            f"Can not load a {len(parts)} parts checkpoint to a model with {pp} pipeline "
            f"parallel partitions and tensor parallel degree {tp} ({f}_*.pt)")


def _rank_suffix(topo) -> str:
    return f"{topo.pp_rank}_{topo.tp_rank}_{topo.rdp_rank}"


def save_checkpoint(path: str, tag: str, partial: bool = True, model=None, optimizer=None,
                    user_content: Any = None, translate_if_full: bool = True,
                    num_kept_partial_checkpoints: int | None = None) -> None:
    """Writes a checkpoint under ``path`` (every rank calls it).

    Partial: ``{path}/{tag}_partial/model_{pp}_{tp}_{rdp}.pt`` and ``optimizer_...pt`` from
    each data-parallel replica's first rank (with ``shard_optimizer_state``, the optimizer
    part from every rank: its shard), ``user_content.pt`` from rank 0. Full: the
    gathered model and optimizer state in ``{path}/{tag}`` from rank 0, the model under the
    original's names where tensor parallelism replaced a translated (Hugging Face) model and
    ``translate_if_full`` holds. ``{path}/newest``
    names the tag; ``num_kept_partial_checkpoints`` removes the oldest partial ones.
    """
    from shoal.modelparallel.torch import comm

    st = _state.require()
    topo = st.topology
    model = model if model is not None else st.model
    optimizer = optimizer if optimizer is not None else st.optimizer
    if st.shard_groups is not None:  # sharded data parallelism: a file per shard
        from shoal.modelparallel.torch.sharded import checkpoint as sharded_checkpoint

        sharded_checkpoint.save(st, path, tag, partial, model, optimizer, user_content,
                                translate_if_full)
    elif partial:
        folder = os.path.join(str(path), f"{tag}_partial")
        os.makedirs(folder, exist_ok=True)
        suffix = _rank_suffix(topo)
        if topo.rdp_rank == 0 and model is not None:
            torch.save(model.local_state_dict(), os.path.join(folder, f"model_{suffix}.pt"))
        if optimizer is not None and st.cfg.shard_optimizer_state:
            torch.save(optimizer.local_state_dict(gather_if_shard=False),
                       os.path.join(folder, f"optimizer_{suffix}.pt"))
        elif optimizer is not None and topo.rdp_rank == 0:
            torch.save(optimizer.local_state_dict(),
                       os.path.join(folder, f"optimizer_{suffix}.pt"))
        if topo.rank == 0:
            torch.save(user_content, os.path.join(folder, "user_content.pt"))
    else:
        state = model.state_dict() if model is not None else None
        if state is not None and translate_if_full:  # under the original model's names (HF)
            from shoal.modelparallel.torch.tensorparallel.registry import translators

            for translate in translators(model.get_module(), back=True):
                state = translate(state)
        whole = {"model": state,
                 "optimizer": optimizer.state_dict() if optimizer is not None else None,
                 "user_content": user_content}
        if topo.rank == 0:
            os.makedirs(str(path), exist_ok=True)
            torch.save(whole, os.path.join(str(path), str(tag)))
    comm.barrier()
    if topo.rank == 0:
        with open(os.path.join(str(path), "newest"), "w", encoding="utf-8") as handle:
            handle.write(f"{tag}_partial" if partial else str(tag))
        if partial and num_kept_partial_checkpoints:
            _remove_oldest(str(path), num_kept_partial_checkpoints)
    comm.barrier()


def _remove_oldest(path: str, keep: int) -> None:
    import shutil

    folders = sorted((p for p in glob.glob(os.path.join(glob.escape(path), "*_partial"))
                      if os.path.isdir(p)), key=os.path.getmtime)
    for folder in folders[:-keep]:
        shutil.rmtree(folder, ignore_errors=True)


def resume_from_checkpoint(path: str, tag: str | None = None, partial: bool = True,
                           strict: bool = True, load_optimizer: bool = True,
                           load_sharded_optimizer_state: bool = True,
                           translate_function=None) -> Any:
    """Loads what ``save_checkpoint`` wrote (``tag`` None: the newest) into the model and
    optimizer (deferred until partitioned, if they are not yet); returns the user content."""
    st = _state.require()
    topo = st.topology
    if tag is None:
        with open(os.path.join(str(path), "newest"), encoding="utf-8") as handle:
            tag = handle.read().strip()
        partial = tag.endswith("_partial")
        tag = tag[: -len("_partial")] if partial else tag
    if not partial:
        whole = torch.load(os.path.join(str(path), str(tag)), weights_only=False)
        if st.model is not None and whole.get("model") is not None:
            st.model.load_state_dict(whole["model"], strict)
        if load_optimizer and st.optimizer is not None and whole.get("optimizer") is not None:
            st.optimizer.load_state_dict(whole["optimizer"])
        return whole.get("user_content")
    if st.shard_groups is not None:
        from shoal.modelparallel.torch.sharded import checkpoint as sharded_checkpoint

        return sharded_checkpoint.resume(st, path, tag, strict,
                                         load_optimizer and load_sharded_optimizer_state)
    folder = os.path.join(str(path), f"{tag}_partial")
    suffix = f"{topo.pp_rank}_{topo.tp_rank}_0"
    model_file = os.path.join(folder, f"model_{suffix}.pt")
    if not os.path.exists(model_file):
        parts = sorted(glob.glob(os.path.join(glob.escape(folder), "model_*.pt")))
        raise SMPCheckpointError(
            f"Can not load a {len(parts)} parts checkpoint to a model with "
            f"{topo.pp_size} pipeline parallel partitions: {model_file} is missing")
    if st.model is not None:
        st.model.load_state_dict(torch.load(model_file, weights_only=False), strict)
    optimizer_file = os.path.join(folder, f"optimizer_{suffix}.pt")
    if st.cfg.shard_optimizer_state:  # this replica's shard
        optimizer_file = os.path.join(folder, f"optimizer_{_rank_suffix(topo)}.pt")
        saved = len(glob.glob(os.path.join(glob.escape(folder), "optimizer_*.pt")))
        if load_optimizer and (saved != topo.size or not os.path.exists(optimizer_file)):
            raise SMPCheckpointError(
                f"{optimizer_file}: a sharded optimizer state loads on the layout that saved "
                f"it, one part per rank ({saved} parts found for {topo.size} ranks)")
    if load_optimizer and st.optimizer is not None and os.path.exists(optimizer_file):
        st.optimizer.load_state_dict(torch.load(optimizer_file, weights_only=False))
    content = os.path.join(folder, "user_content.pt")
    return torch.load(content, weights_only=False) if os.path.exists(content) else None
