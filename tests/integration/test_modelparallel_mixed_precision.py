"""fp16 and bf16 training under the real mpirun: a small language model trained 10 steps
with pipeline parallelism 2 or tensor parallelism 2 (2 ranks each) must track the same
model trained in float32 in one process on the same batches. Tolerances, per step, on the
loss (relative) and on ``clip_master_grads``'s global norm against
``torch.nn.utils.clip_grad_norm_`` of the float32 model (relative): bf16 2e-2 (8 bits of
mantissa), fp16 5e-3 (11 bits).

Before training, the fp16 runs start from a loss scale of 2**24: the backward's first
gradient (the scale over the batch's token count) is beyond float16's range, so the steps
overflow until the dynamic scale has come down. Each such step must be skipped on every
rank (16-bit parameters and float32 masters unchanged, ``optimizer.overflow`` True) and
halve the scale. After training, the optimizer's state dict (masters of every stage and
the scaler) must load back what it saved.

This file is also the worker: ``python test_modelparallel_mixed_precision.py worker``.
"""

from __future__ import annotations

import json
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_collectives import MPI_MARKS, run_mpi  # noqa: E402

HERE = os.path.abspath(__file__)
pytestmark = [*MPI_MARKS, pytest.mark.torch]
VOCAB, WIDTH, SEQ, BATCH, STEPS, CLIP = 30, 16, 5, 4, 10, 0.5
TOLERANCE = {"bf16": 2e-2, "fp16": 5e-3}


def build_model(seed, smp=None):
    import contextlib

    import torch
    from torch import nn

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(VOCAB, WIDTH)
            with smp.tensor_parallelism() if smp is not None else contextlib.nullcontext():
                self.up = nn.Linear(WIDTH, 2 * WIDTH)
                self.down = nn.Linear(2 * WIDTH, WIDTH)
            self.norm = nn.LayerNorm(WIDTH)
            self.head = nn.Linear(WIDTH, VOCAB, bias=False)

        def forward(self, tokens):
            x = self.embed(tokens)
            x = self.norm(x + self.down(torch.nn.functional.gelu(self.up(x))))
            return self.head(x)

    torch.manual_seed(seed)
    return Net()


def worker() -> None:
    import smdistributed.modelparallel.torch as smp
    import torch
    import torch.nn.functional as F

    case = json.loads(os.environ["MP_CASE"])
    precision = case["precision"]
    half = {"fp16": torch.float16, "bf16": torch.bfloat16}[precision]
    smp.init({**case["config"], precision: True})
    net = build_model(1, smp)
    reference = build_model(1)
    if smp.pp_size() > 1:
        for name in ("embed", "up"):
            smp.set_partition(getattr(net, name), 0)
        for name in ("down", "norm", "head"):
            smp.set_partition(getattr(net, name), 1)
    model = smp.DistributedModel(net)
    assert all(p.dtype == half for p in model.parameters())
    optimizer = smp.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.5),
        static_loss_scale=None, dynamic_loss_scale=True,
        dynamic_loss_args={"init_scale": 2.0**24, "scale_window": 1000})
    ref_optimizer = torch.optim.SGD(reference.parameters(), lr=0.1, momentum=0.5)
    assert optimizer.optimizer is not ref_optimizer and optimizer.param_groups[0]["lr"] == 0.1
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer.optimizer, 100)  # SMP's tip

    @smp.step
    def train_step(model, tokens, targets):
        logits = model(tokens)
        assert logits.dtype == torch.float32  # upscaled
        loss = F.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1))
        model.backward(loss)
        return loss

    generator = torch.Generator().manual_seed(7)

    def batch():
        tokens = torch.randint(0, VOCAB, (BATCH, SEQ), generator=generator)
        return tokens, torch.roll(tokens, 1, dims=1)

    overflows = 0
    if precision == "fp16":
        tokens, targets = batch()
        for _ in range(12):
            before = [p.detach().clone() for p in model.parameters()]
            masters = [m.detach().clone() for _, m in optimizer._pairs]
            scale = optimizer.loss_scale
            optimizer.zero_grad()
            train_step(model, tokens, targets)
            optimizer.step()
            if not optimizer.overflow:
                break
            overflows += 1
            assert optimizer.loss_scale == scale / 2, (optimizer.loss_scale, scale)
            # (the first step partitions: other stages' parameters are released, empty)
            assert all(a.equal(b) for a, b in zip(before, model.parameters()) if b.numel())
            assert all(a.equal(m) for a, (_, m) in zip(masters, optimizer._pairs) if m.numel())
        assert overflows >= 1 and not optimizer.overflow, overflows
        ref_optimizer.zero_grad()
        F.cross_entropy(reference(tokens).reshape(-1, VOCAB), targets.reshape(-1)).backward()
        ref_optimizer.step()  # the step that went through
    tolerance = TOLERANCE[precision]
    worst = worst_norm = 0.0
    for _ in range(STEPS):
        tokens, targets = batch()
        optimizer.zero_grad(set_to_none=True)
        loss = train_step(model, tokens, targets).reduce_mean().item()
        scale = optimizer.loss_scale
        norm = float(optimizer.clip_master_grads(CLIP))
        optimizer.step()
        ref_optimizer.zero_grad()
        ref_loss = F.cross_entropy(reference(tokens).reshape(-1, VOCAB), targets.reshape(-1))
        ref_loss.backward()
        ref_norm = float(torch.nn.utils.clip_grad_norm_(reference.parameters(), CLIP))
        rel = abs(loss - ref_loss.item()) / abs(ref_loss.item())
        worst = max(worst, rel)
        assert rel <= tolerance, (loss, ref_loss.item(), rel)
        if optimizer.overflow:  # the scale still high enough to overflow: skipped, halved
            assert precision == "fp16" and norm == -1 and optimizer.loss_scale == scale / 2
            overflows += 1
            continue
        scheduler.step()  # as SMP's scripts: not after a skipped step
        ref_optimizer.step()
        rel_norm = abs(norm - ref_norm) / ref_norm
        worst_norm = max(worst_norm, rel_norm)
        assert rel_norm <= tolerance, (norm, ref_norm, rel_norm)
    check_state_round_trip(smp, model, optimizer, train_step, batch)
    smp.barrier()
    print(f"rank {smp.rank()} {precision} tp {smp.tp_rank()} pp {smp.pp_rank()}: overflows "
          f"{overflows} loss rel {worst:.2e} norm rel {worst_norm:.2e}: 1 cases ok", flush=True)


def check_state_round_trip(smp, model, optimizer, train_step, batch):
    import torch

    saved = optimizer.state_dict()
    assert all(m is not None and m.dtype == torch.float32 for m in saved["fp32_from_fp16"])
    masters = [m.detach().clone() for _, m in optimizer._pairs]
    scale = optimizer.loss_scale
    tokens, targets = batch()
    optimizer.zero_grad()
    train_step(model, tokens, targets)
    optimizer.step()
    assert any(not a.equal(m) for a, (_, m) in zip(masters, optimizer._pairs) if m.numel())
    optimizer.load_state_dict(saved)
    assert all(a.equal(m) for a, (_, m) in zip(masters, optimizer._pairs) if m.numel())
    assert optimizer.loss_scale == scale


CASES = {
    "pp2-bf16": ("bf16", {"pipeline_parallel_degree": 2, "microbatches": 2, "ddp": True,
                          "auto_partition": False, "default_partition": 0}),
    "pp2-fp16": ("fp16", {"pipeline_parallel_degree": 2, "microbatches": 2, "ddp": True,
                          "auto_partition": False, "default_partition": 0}),
    "tp2-bf16": ("bf16", {"tensor_parallel_degree": 2, "ddp": True}),
    "tp2-fp16": ("fp16", {"tensor_parallel_degree": 2, "ddp": True, "microbatches": 2}),
}


@pytest.mark.parametrize("name", list(CASES))
def test_mixed_precision_tracks_float32(name):
    precision, config = CASES[name]
    run_mpi(2, {"MP_CASE": json.dumps({"precision": precision, "config": config})},
            script=HERE, timeout=300)


if __name__ == "__main__" and sys.argv[1:] == ["worker"]:
    worker()
