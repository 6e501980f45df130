"""Checkpoints under sharded data parallelism: one file per shard, or the whole model.

Partial (``smp.save_checkpoint(..., partial=True)``), SMP's layout: the ranks of the first
sharding group of each tensor-parallel rank write ``{path}/{tag}_partial/model_{r}.pt``
(``{"module": this rank's chunks and the buffers, "_smp_zero2d": True, "shard_size": s,
"param_shapes": ..., "buffer_names": ...}``) and ``optimizer_{r}.pt`` (the optimizer's
shard: ``fp32_flat_groups``, ``partition_count``, the inner optimizer's state), ``r`` being
the shard rank (``{tp}_{r}`` with tensor parallelism); rank 0 writes ``user_content.pt`` and
``{path}/newest``. Resuming needs the same degree and reads the rank's own files; the
optimizer's part waits for ``smp.DistributedOptimizer`` if it does not exist yet.

Full (``partial=False``): the model's state gathered whole (under the original model's
names where a Hugging Face model was translated) in ``{path}/{tag}`` from rank 0, for
fine-tuning or inference elsewhere; the optimizer's state is not in it (it is per shard).
"""

from __future__ import annotations

import logging
import os
from typing import Any

import torch
from shoal.modelparallel.errors import SMPCheckpointError

log = logging.getLogger("shoal.modelparallel")


def _suffix(st) -> str:
    groups = st.shard_groups
    if st.topology.tp_size > 1:
        return f"{st.topology.tp_rank}_{groups.rank}"
    return str(groups.rank)


def save(st, path: str, tag: str, partial: bool, model, optimizer, user_content: Any,
         translate_if_full: bool) -> None:
    """Writes the checkpoint (every rank calls it); ``newest`` is the caller's."""
    groups = st.shard_groups
    if not partial:
        state = model.state_dict() if model is not None else None
        if state is not None and translate_if_full:
            from shoal.modelparallel.torch.tensorparallel.registry import translators

            for translate in translators(model.get_module(), back=True):
                state = translate(state)
        if st.topology.rank == 0:
            os.makedirs(str(path), exist_ok=True)
            torch.save({"model": state, "optimizer": None, "user_content": user_content},
                       os.path.join(str(path), str(tag)))
        return
    folder = os.path.join(str(path), f"{tag}_partial")
    os.makedirs(folder, exist_ok=True)
    if groups.replicas.index(st.topology.rank) == 0:
        suffix = _suffix(st)
        if model is not None:
            torch.save(_model_file(model, groups.degree),
                       os.path.join(folder, f"model_{suffix}.pt"))
        if optimizer is not None:
            torch.save(optimizer.state_dict(), os.path.join(folder, f"optimizer_{suffix}.pt"))
    if st.topology.rank == 0:
        torch.save(user_content, os.path.join(folder, "user_content.pt"))


def _model_file(model, degree: int) -> dict[str, Any]:
    local = model.local_state_dict()
    named = model._named_tensors()
    module = {k: v.detach().clone() for k, v in local.items() if not k.startswith("_smp")
              and k != "shard_size"}
    return {
        "module": module,
        "_smp_zero2d": True,
        "shard_size": degree,
        "param_shapes": {k: tuple(v.ds_shape) for k, v in named.items()
                         if hasattr(v, "ds_shape")},
        "buffer_names": [k for k, v in named.items() if not hasattr(v, "ds_shape")],
    }


def resume(st, path: str, tag: str, strict: bool, load_optimizer: bool) -> Any:
    """Loads this rank's files of a partial checkpoint; returns the user content."""
    folder = os.path.join(str(path), f"{tag}_partial")
    suffix = _suffix(st)
    model_file = os.path.join(folder, f"model_{suffix}.pt")
    if not os.path.exists(model_file):
        raise SMPCheckpointError(f"{model_file} is missing: the checkpoint was not written "
                                 "with sharded data parallelism of this layout")
    saved = torch.load(model_file, weights_only=False)
    if not isinstance(saved, dict) or not saved.get("_smp_zero2d"):
        raise SMPCheckpointError("Error: trying to load a non-sharded checkpoint into sharded "
                                 "data parallelism model!")
    degree, size = st.shard_groups.degree, st.topology.size
    if size % int(saved["shard_size"]):
        raise SMPCheckpointError(
            f"Error: the checkpoint being loaded used a shard_size of {saved['shard_size']} but "
            f"the current world size of {size} is not divisive by the shard size.")
    if int(saved["shard_size"]) != degree:
        raise SMPCheckpointError(
            f"the checkpoint being loaded used a shard_size of {saved['shard_size']}; this "
            f"job's sharded_data_parallel_degree is {degree}: resume on the same degree "
            "(or save a full checkpoint with partial=False)")
    if st.model is not None:
        st.model.load_state_dict({**saved["module"], "_smp_is_partial": True,
                                  "_smp_zero2d": True}, strict)
    optimizer_file = os.path.join(folder, f"optimizer_{suffix}.pt")
    if load_optimizer and os.path.exists(optimizer_file):
        state = torch.load(optimizer_file, weights_only=False)
        if st.optimizer is not None:
            st.optimizer.load_state_dict(state)
        else:
            st.model.pending_optimizer_state = state
    content = os.path.join(folder, "user_content.pt")
    return torch.load(content, weights_only=False) if os.path.exists(content) else None
