"""Sharded data parallelism under the real mpirun: a small language model trained 10 steps
with ``sharded_data_parallel_degree`` 2 or 4 (with replicas, microbatches, tensor
parallelism) must equal the same model trained in one process on the global batch, with
the gradient clipped inside ``optimizer.step()`` as ``torch.nn.utils.clip_grad_norm_``
clips it: the loss averaged over the data-parallel ranks relative 1e-5, the gathered
weights (``model.state_dict()``) atol 1e-5. A per-shard checkpoint saved after 5 steps
and loaded back makes steps 6-10 again bit for bit. Per-rank parameter + gradient +
optimizer bytes are measured against the unsharded figure (``shard_bytes`` below).

bf16 runs track the float32 reference within 2e-2; fp16 starts from a loss scale of
2**24 whose steps overflow: each is skipped on every rank and halves the scale.

This file is also the worker: ``python test_modelparallel_sharded.py worker``.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_collectives import MPI_MARKS, run_mpi  # noqa: E402

HERE = os.path.abspath(__file__)
pytestmark = [*MPI_MARKS, pytest.mark.torch]
VOCAB, WIDTH, SEQ, BATCH, STEPS, LAYERS, CLIP = 30, 16, 5, 2, 10, 3, 0.5


def build_model(seed, smp=None, width=WIDTH):
    import contextlib

    import torch
    from torch import nn

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            with smp.tensor_parallelism() if smp is not None else contextlib.nullcontext():
                self.up = nn.Linear(width, 3 * width)
                self.down = nn.Linear(3 * width, width)
            self.norm = nn.LayerNorm(width)

        def forward(self, x):
            return self.norm(x + self.down(torch.nn.functional.gelu(self.up(x))))

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(VOCAB, width)
            self.blocks = nn.Sequential(*[Block() for _ in range(LAYERS)])
            self.head = nn.Linear(width, VOCAB, bias=False)

        def forward(self, tokens):
            return self.head(self.blocks(self.embed(tokens)))

    torch.manual_seed(seed)
    return Net()


def check_refusals(smp, model):
    """SMP's refusals around sharded data parallelism."""
    from shoal.modelparallel.errors import SMPCheckpointError

    try:
        model.load_state_dict({"_smp_is_partial": True})
    except SMPCheckpointError as exc:
        assert str(exc) == ("Error: trying to load a non-sharded checkpoint into sharded data "
                            "parallelism model!"), exc
    else:
        raise AssertionError("a partial state without _smp_zero2d was loaded")


def shard_bytes(model, optimizer):
    """This rank's parameter + gradient + optimizer-state bytes, each storage once."""
    import torch

    seen, total = set(), 0

    def add(t):  # the storage behind ``t`` (views of a flat buffer count with it)
        nonlocal total
        if isinstance(t, torch.Tensor) and t.numel():
            storage = t.untyped_storage()
            if storage.data_ptr() not in seen:
                seen.add(storage.data_ptr())
                total += storage.nbytes()

    for p in model.parameters():
        add(p.ds_tensor)
        add(p.data)  # persistent parameters (the others hold nothing between steps)
    add(model.sharded.reducer.flat)
    for flat in optimizer.fp32_partitioned_groups_flat:
        add(flat)
    for state in optimizer.state.values():
        for value in state.values():
            if isinstance(value, torch.Tensor) and value.numel() > 1:
                add(value)
    return total


def worker() -> None:
    import smdistributed.modelparallel.torch as smp
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    case = json.loads(os.environ["MP_CASE"])
    precision = case.get("precision", "fp32")
    config = dict(case["config"])
    if precision != "fp32":
        config[precision] = True
    smp.init(config)

    def make_optimizer(params):
        if os.environ.get("SDP_SGD"):
            return torch.optim.SGD(params, lr=0.1, momentum=0.5)
        return torch.optim.AdamW(params, lr=1e-3, weight_decay=0.01)

    width = case.get("width", WIDTH)
    with smp.model_creation():  # delayed_parameter_initialization: on meta until wrapped
        net = build_model(1, smp, width)
    reference = build_model(1, None, width)
    passes = case.get("accumulate", 1)
    model = smp.DistributedModel(net, backward_passes_per_step=passes)
    check_refusals(smp, model)
    if case.get("delayed"):
        assert not any(p.is_meta for p in net.parameters())
        assert all(p.numel() == 0 for p in net.parameters() if not p.ds_persist)
        model.load_state_dict(reference.state_dict())  # whole tensors, cut into chunks
        smp.set_activation_checkpointing(net.blocks, strategy="each")
    # What SMP's SDP scripts read before the optimizer: each chunk's length.
    offsets = [sum(p.ds_tensor.ds_numel for p in model.parameters())]
    assert offsets[0] > 0
    optimizer = smp.DistributedOptimizer(
        make_optimizer(model.parameters()),
        static_loss_scale=None, dynamic_loss_scale=True,
        dynamic_loss_args={"init_scale": 2.0**24 if precision == "fp16" else 1.0})
    ref_optimizer = make_optimizer(reference.parameters())
    assert len(optimizer.fp32_partitioned_groups_flat[0]) == offsets[0]
    dp = smp.dp_size()
    # prescaled_batch: a tensor-parallel group shares one batch (SMP: shard by rdp_rank)
    prescaled = smp.state.cfg.prescaled_batch
    readers, reader = (smp.rdp_size(), smp.rdp_rank()) if prescaled else (dp, smp.dp_rank())

    @smp.step
    def train_step(model, tokens, targets):
        logits = model(tokens)
        loss = F.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1))
        model.backward(loss)
        return loss

    generator = torch.Generator().manual_seed(7)

    def batch():
        tokens = torch.randint(0, VOCAB, (BATCH * readers, SEQ), generator=generator)
        return tokens, torch.roll(tokens, 1, dims=1)

    def mean_over_dp(value):
        t = torch.tensor([value], dtype=torch.float64)
        dist.all_reduce(t, group=smp.get_dp_process_group())
        return float(t) / dp

    def distributed_step(tokens, targets):
        """One optimizer step; with gradient accumulation, pass j takes row j of each
        rank's rows (the gradients add up over the passes)."""
        mine = slice(reader * BATCH, (reader + 1) * BATCH)
        optimizer.zero_grad(set_to_none=True)
        losses = []
        for j in range(passes):
            rows = slice(j, BATCH, passes)
            losses.append(train_step(model, tokens[mine][rows],
                                     targets[mine][rows]).reduce_mean().item())
        optimizer.step()
        return mean_over_dp(sum(losses) / passes)

    def reference_loss(tokens, targets):
        """The same on the global batch, in one process (the gradients of the passes add)."""
        losses = []
        for j in range(passes):
            rows = [r * BATCH + i for r in range(readers) for i in range(j, BATCH, passes)]
            logits = reference(tokens[rows])
            losses.append(F.cross_entropy(logits.reshape(-1, VOCAB), targets[rows].reshape(-1)))
        sum(losses).backward()
        return sum(loss.item() for loss in losses) / passes

    overflows = 0
    if precision == "fp16":
        tokens, targets = batch()
        for _ in range(12):
            scale = optimizer.loss_scale
            chunks = [p.ds_tensor.clone() for p in model.parameters()]
            distributed_step(tokens, targets)
            if not optimizer.overflow:
                break
            overflows += 1
            assert optimizer.loss_scale == scale / 2, (optimizer.loss_scale, scale)
            assert all(a.equal(p.ds_tensor) for a, p in zip(chunks, model.parameters()))
        assert overflows >= 1 and not optimizer.overflow, overflows
        ref_optimizer.zero_grad()
        reference_loss(tokens, targets)
        torch.nn.utils.clip_grad_norm_(reference.parameters(), CLIP)
        ref_optimizer.step()
    tolerance = {"fp32": 1e-5, "bf16": 2e-2, "fp16": 5e-3}[precision]
    folder = case.get("folder")
    batches, losses, worst = [], [], 0.0
    for step in range(STEPS):
        tokens, targets = batch()
        batches.append((tokens, targets))
        loss = distributed_step(tokens, targets)
        losses.append(loss)
        ref_optimizer.zero_grad()
        ref_loss = reference_loss(tokens, targets)
        torch.nn.utils.clip_grad_norm_(reference.parameters(), CLIP)
        rel = abs(loss - ref_loss) / abs(ref_loss)
        worst = max(worst, rel)
        if os.environ.get("SDP_TRACE"):
            print(f"step {step} rel {rel:.3e}", flush=True)
        assert rel <= tolerance, (step, loss, ref_loss, rel)
        if optimizer.overflow:  # the dynamic scale still too high: skipped, halved
            assert precision == "fp16"
            overflows += 1
            continue
        ref_optimizer.step()
        if step == 4 and folder:
            smp.save_checkpoint(folder, "mid", partial=True, model=model, optimizer=optimizer,
                                user_content={"step": step})
    gathered = model.state_dict()
    expected = reference.state_dict()
    assert sorted(gathered) == sorted(expected), (list(gathered), list(expected))
    atol = 1e-5 if precision == "fp32" else 0.1
    for key, value in expected.items():
        assert torch.allclose(gathered[key].float(), value, atol=atol, rtol=0), (
            key, float((gathered[key].float() - value).abs().max()))
    report = f"loss rel {worst:.2e}, overflows {overflows}, gathers {model.sharded.gathers}"
    if case.get("prefetch"):  # from the second step on, gathers run ahead of the modules
        assert model.sharded.gathers["prefetched"] > 0, model.sharded.gathers
    if folder:
        assert smp.resume_from_checkpoint(folder, tag="mid", partial=True) == {"step": 4}
        again = [distributed_step(*b) for b in batches[5:]]
        assert again == losses[5:], (again, losses[5:])
        report += ", resumed bit-exact"
    if case.get("measure"):
        mine = shard_bytes(model, optimizer)
        whole = sum(p.numel() for p in reference.parameters()) * (4 + 4 + 8)
        ratio = mine / (whole / smp.state.cfg.sharded_data_parallel_degree)
        report += f", param+grad+optimizer bytes {mine} of {whole} unsharded ({ratio:.3f} x 1/sdp)"
        assert ratio <= 1.3, ratio
    smp.barrier()
    print(f"rank {smp.rank()} {precision}: {report}: 1 cases ok", flush=True)


SDP = {"ddp": True, "sdp_param_persistence_threshold": 40, "sdp_gradient_clipping": CLIP}
CASES = {  # SDP 2 and 4, replicas, TP, 16 bits; each case also resumes a checkpoint
    "sdp2-delayed-checkpointed": (2, {**SDP, "sharded_data_parallel_degree": 2,
                                      "delayed_parameter_initialization": True}, "fp32"),
    "sdp4-microbatches": (4, {**SDP, "sharded_data_parallel_degree": 4, "microbatches": 2,
                              "sdp_max_live_parameters": 20000, "sdp_reduce_bucket_size": 9000},
                          "fp32"),
    "sdp2-replicas2-ring-accumulate2": (4, {**SDP, "sharded_data_parallel_degree": 2,
                                            "sdp_hierarchical_allgather": False}, "fp32"),
    "tp2-sdp2": (4, {**SDP, "sharded_data_parallel_degree": 2, "tensor_parallel_degree": 2},
                 "fp32"),
    "tp2-sdp2-prescaled": (4, {**SDP, "sharded_data_parallel_degree": 2,
                               "tensor_parallel_degree": 2, "prescaled_batch": True}, "fp32"),
    "sdp2-bf16": (2, {**SDP, "sharded_data_parallel_degree": 2}, "bf16"),
    "sdp2-fp16": (2, {**SDP, "sharded_data_parallel_degree": 2}, "fp16"),
}


@pytest.mark.parametrize("name", list(CASES))
def test_sharded_data_parallel_matches_one_process(name):
    ranks, config, precision = CASES[name]
    with tempfile.TemporaryDirectory() as folder:
        measure = name == "sdp4-microbatches"  # a wider model: padding is what it is
        case = {"config": config, "precision": precision, "folder": folder,
                "measure": measure, "width": 64 if measure else WIDTH, "prefetch": measure,
                "delayed": "delayed" in name, "accumulate": 2 if "accumulate" in name else 1}
        proc = run_mpi(ranks, {"MP_CASE": json.dumps(case)}, script=HERE, timeout=300)
    print(proc.stdout)


if __name__ == "__main__" and sys.argv[1:] == ["worker"]:
    worker()
