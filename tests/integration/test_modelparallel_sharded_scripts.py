"""The shape of SMP's sharded-data-parallel GPT-NeoX script (its 2023 ``train.py``), on a
tiny ``GPTNeoXForCausalLM`` under the real mpirun (2 ranks, ``sharded_data_parallel_degree``
2), CUDA lines aside: the script's ``smp.init`` keys, ``smp.model_creation`` with delayed
parameter initialization, ``smp.DistributedModel(trace_device="gpu",
backward_passes_per_step=...)``, activation checkpointing per layer, AdamW with two weight
decay groups, ``smp.DistributedOptimizer`` with SMP's dynamic loss-scale arguments, and
the script's own bookkeeping on DeepSpeed's attributes: each parameter's offset in its
group's ``optimizer.fp32_partitioned_groups_flat[i]`` from ``p.ds_tensor.ds_numel`` before
the optimizer exists, then the norms of those slices summed with
``torch.distributed.all_reduce(group=optimizer.ds_param_shard_group)``, which must equal
the norms of the one-process model's parameters.

``use_distributed_transformer`` 0 keeps the Hugging Face modules; 1 creates the model under
``tensor_parallelism=True`` at tensor parallel degree 1 (SMP's distributed transformer,
weights translated). Losses track the same model trained in one process in float32 on the
global batch (fp32 relative 1e-5, bf16 2e-2); a per-shard checkpoint, resumed, continues
bit for bit; a full checkpoint holds the Hugging Face names.

This file is also the worker: ``python test_modelparallel_sharded_scripts.py worker``.
"""

from __future__ import annotations

import copy
import json
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_collectives import MPI_MARKS, run_mpi  # noqa: E402

HERE = os.path.abspath(__file__)
pytestmark = [*MPI_MARKS, pytest.mark.torch]
VOCAB, SEQ, BATCH, STEPS = 64, 8, 2, 6


def offsets_by_ds_numel(param_groups):
    """Where each parameter's chunk sits in its group's flat partition, read as the
    scripts read it: from ``ds_numel``, in the group's order."""
    found = []
    for group in param_groups:
        at, places = 0, {}
        for p in group["params"]:
            places[id(p)] = (at, p.ds_tensor.ds_numel)
            at += p.ds_tensor.ds_numel
        found.append(places)
    return found


def worker() -> None:
    import smdistributed.modelparallel.torch as smp
    import torch
    import torch.distributed as dist
    import transformers
    from shoal.modelparallel.torch.nn.huggingface import gptneox

    case = json.loads(os.environ["SDP_CASE"])
    precision, distributed = case["precision"], case["use_distributed_transformer"]
    smp.init({"ddp": True, "tensor_parallel_degree": 1, "pipeline_parallel_degree": 1,
              "microbatches": 1, "shard_optimizer_state": False, "prescaled_batch": False,
              "fp16": False, "bf16": precision == "bf16", "offload_activations": False,
              "delayed_parameter_initialization": True, "optimize": "speed",
              "placement_strategy": "cluster", "activation_loading_horizon": 4,
              "skip_tracing": True, "auto_partition": False, "default_partition": 0,
              "static_mode": False, "fast_mode": False, "sharded_data_parallel_degree": 2,
              "ddp_dist_backend": "auto", "sdp_hierarchical_allgather": False,
              "sdp_gradient_clipping": 1.0, "sdp_param_persistence_threshold": 100})
    config = transformers.GPTNeoXConfig(
        vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=64, max_position_embeddings=32, rotary_pct=0.5, hidden_dropout=0.0,
        attention_dropout=0.0)
    config._attn_implementation = "eager"
    torch.manual_seed(1)
    reference = transformers.GPTNeoXForCausalLM(config)
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    with smp.model_creation(tensor_parallelism=distributed == 1, zero_init=True, dtype=dtype,
                            distribute_embedding=False):
        net = transformers.AutoModelForCausalLM.from_config(config)
    model = smp.DistributedModel(net, trace_device="gpu", backward_passes_per_step=1)
    hf = reference.state_dict()
    model.load_state_dict(copy.deepcopy(hf))  # Hugging Face names (translated for 1)
    inner = model.get_module()
    layers = inner.transformer.seq_layers if distributed else inner.gpt_neox.layers
    for layer in layers:
        smp.set_activation_checkpointing(layer)
    decay = [p for n, p in model.named_parameters() if "bias" not in n and "norm" not in n]
    rest = [p for n, p in model.named_parameters() if "bias" in n or "norm" in n]
    groups = [{"params": decay, "weight_decay": 0.01}, {"params": rest, "weight_decay": 0.0}]
    offsets = offsets_by_ds_numel(groups)  # before the optimizer, as the script does
    optimizer = smp.DistributedOptimizer(
        torch.optim.AdamW(groups, lr=1e-3, betas=(0.9, 0.95)), static_loss_scale=None,
        dynamic_loss_scale=True,
        dynamic_loss_args={"scale_window": 1000, "min_scale": 1, "delayed_shift": 2})
    ref_optimizer = torch.optim.AdamW(
        [{"params": [p for n, p in reference.named_parameters()
                     if "bias" not in n and "norm" not in n], "weight_decay": 0.01},
         {"params": [p for n, p in reference.named_parameters()
                     if "bias" in n or "norm" in n], "weight_decay": 0.0}],
        lr=1e-3, betas=(0.9, 0.95))
    if not distributed:
        check_flat_partitions(smp, torch, dist, model, optimizer, offsets, reference)

    @smp.step
    def train_step(model, ids, mask):
        loss = model(input_ids=ids, attention_mask=mask, labels=ids)["loss"]
        model.backward(loss)
        return loss

    generator = torch.Generator().manual_seed(7)
    mine = slice(smp.dp_rank() * BATCH, (smp.dp_rank() + 1) * BATCH)
    tolerance = 1e-5 if precision == "fp32" else 2e-2
    folder = os.environ["SDP_FOLDER"]
    def distributed_step(ids, mask):
        """One step of the script; the loss averaged over the data-parallel ranks."""
        optimizer.zero_grad(set_to_none=True)
        loss = train_step(model, ids[mine], mask[mine]).reduce_mean()
        optimizer.step()
        mean = loss.detach().double().reshape(1)
        dist.all_reduce(mean, group=smp.get_dp_process_group())
        return float(mean) / smp.dp_size()

    batches, losses = [], []
    for step in range(STEPS):
        ids = torch.randint(2, VOCAB, (2 * BATCH, SEQ), generator=generator)
        mask = torch.ones_like(ids)
        batches.append((ids, mask))
        losses.append(distributed_step(ids, mask))
        ref_optimizer.zero_grad()
        ref_loss = reference(input_ids=ids, attention_mask=mask, labels=ids)["loss"]
        ref_loss.backward()
        torch.nn.utils.clip_grad_norm_(reference.parameters(), 1.0)
        ref_optimizer.step()
        rel = abs(losses[-1] - ref_loss.item()) / ref_loss.item()
        assert rel <= tolerance, (step, losses[-1], ref_loss.item(), rel)
        if step == 2:
            smp.save_checkpoint(folder, "step2", partial=True, model=model, optimizer=optimizer,
                                user_content={"step": step})
    smp.resume_from_checkpoint(folder, tag="step2", partial=True)
    again = [distributed_step(ids, mask) for ids, mask in batches[3:]]
    assert again == losses[3:], (again, losses[3:])
    smp.save_checkpoint(folder, "fullmodel.pt", partial=False, model=model)
    saved = torch.load(os.path.join(folder, "fullmodel.pt"), weights_only=False)["model"]
    assert set(saved) == set(hf), sorted(set(saved) ^ set(hf))
    gathered = model.state_dict()
    if distributed:
        gathered = gptneox.translate_state_dict_to_hf_gptneox(gathered)
    assert all(torch.equal(saved[k], gathered[k]) for k in saved)
    smp.barrier()
    print(f"rank {smp.rank()} neox distributed={distributed} {precision}: worst loss rel "
          f"{rel:.1e}: 1 cases ok", flush=True)


def check_flat_partitions(smp, torch, dist, model, optimizer, offsets, reference):
    """The script's norm logging: slices of the flat partitions by the offsets it computed,
    their squared norms summed over the shard group, against the whole parameters."""
    names = {id(p): n for n, p in model.get_module().named_parameters()}
    expected = dict(reference.named_parameters())
    for i, places in enumerate(offsets):
        flat = optimizer.fp32_partitioned_groups_flat[i]
        assert flat.dtype == torch.float32 and flat.numel() == sum(n for _, n in places.values())
        for key, (at, size) in places.items():
            square = (flat.narrow(0, at, size).detach().double() ** 2).sum().reshape(1)
            dist.all_reduce(square, group=optimizer.ds_param_shard_group)
            want = float((expected[names[key]].detach().double() ** 2).sum())
            assert abs(float(square) - want) <= 1e-3 * max(want, 1e-6), (names[key], square, want)


CASES = {
    "hf-modules-bf16": {"precision": "bf16", "use_distributed_transformer": 0},
    "distributed-transformer-fp32": {"precision": "fp32", "use_distributed_transformer": 1},
}


@pytest.mark.parametrize("name", list(CASES))
def test_gpt_neox_sharded_data_parallel_script_shape(name, tmp_path):
    pytest.importorskip("transformers", reason="the GPT-NeoX script needs transformers")
    run_mpi(2, {"SDP_CASE": json.dumps(CASES[name]), "SDP_FOLDER": str(tmp_path)},
            script=HERE, timeout=300)


if __name__ == "__main__" and sys.argv[1:] == ["worker"]:
    worker()
