"""Activation checkpointing under the real mpirun, on 2 ranks: pipeline 2 with 2 microbatches
(a Sequential of blocks over both ranks checkpointed ``contiguous``, so each rank's run of
blocks is one checkpoint on the rank that owns it, and the head, which the second rank owns,
checkpointed there) and tensor parallel 2 (smp.nn transformer layers, each checkpointed).
Each run trains with dropout 0 first, where it must match the same model trained in one
process (loss relative 1e-5, weights atol 1e-5), then with dropout 0.1; the test runs each
case with and without checkpointing and asks for exactly the same losses and gradients, and
for checkpointed blocks to have run again (the recomputation). The pipeline case runs a third
time with ``SHOAL_ACTIVATION_CHECKPOINTING=blocks`` and no call in the script: each of the
four blocks checkpointed where it runs, with the same losses and gradients.

This file is also the worker: ``python test_modelparallel_activations.py worker``.
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
WIDTH, HIDDEN, STEPS, DROPOUT = 8, 16, 2, 0.1


def pipeline_model(seed):
    import torch
    from torch import nn

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.inp = nn.Linear(4, WIDTH)
            self.blocks = nn.Sequential(*[
                nn.Sequential(nn.Linear(WIDTH, HIDDEN), nn.GELU(), nn.Dropout(DROPOUT),
                              nn.Linear(HIDDEN, WIDTH)) for _ in range(4)])
            self.head = nn.Sequential(nn.Linear(WIDTH, HIDDEN), nn.Dropout(DROPOUT),
                                      nn.Tanh(), nn.Linear(HIDDEN, 1))

        def forward(self, x):
            return self.head(self.blocks(self.inp(x)))

    torch.manual_seed(seed)
    return Net()


def dropouts(net, p):
    from shoal.modelparallel.torch.nn.dropout import ParallelDropout
    from torch import nn

    for module in net.modules():
        if isinstance(module, (nn.Dropout, ParallelDropout)):
            module.p = p


def worker() -> None:
    import smdistributed.modelparallel.torch as smp
    import torch
    import torch.nn.functional as F

    case = json.loads(os.environ["MP_CASE"])
    smp.init(case["config"])
    tp = case["kind"] == "tp"
    if tp:
        from test_modelparallel_tp_transformer import SEQ, VOCAB, build_model

        torch.manual_seed(3)
        with smp.tensor_parallelism():
            net = build_model(True, DROPOUT)
        torch.manual_seed(4)
        reference = build_model(False)
        # Submodules called through __call__ (a layer's own recomputation calls its forward)
        counted = [m for layer in net.layers for m in layer.modules() if m is not layer]
    else:
        net = pipeline_model(1)
        smp.set_partition(net.inp, 0)
        for i, block in enumerate(net.blocks):
            smp.set_partition(block, i // 2)
        smp.set_partition(net.head, 1)
        reference = pipeline_model(2)
        counted = [net.blocks[0], net.blocks[3], net.head[0]]
    calls = [0, 0]
    for module in counted:  # a pre-hook: a recomputation may stop before the module's end
        module.register_forward_pre_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
    if not tp:  # a block's first layer runs again when the block alone is checkpointed
        for module in (net.blocks[0][0], net.blocks[3][0]):
            module.register_forward_pre_hook(lambda *_: calls.__setitem__(1, calls[1] + 1))
    model = smp.DistributedModel(net)
    if case["checkpoint"] is True:
        if tp:
            for layer in net.layers:
                smp.set_activation_checkpointing(layer)
        else:
            smp.set_activation_checkpointing(net.blocks, strategy="contiguous")
            smp.set_activation_checkpointing(net.head)
    model.load_state_dict(reference.state_dict())
    optimizer = smp.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1))
    ref_optimizer = torch.optim.SGD(reference.parameters(), lr=0.1)

    def loss_of(out, target):
        if tp:
            return F.cross_entropy(out.reshape(-1, VOCAB), target.reshape(-1))
        return F.mse_loss(out, target)

    @smp.step
    def train_step(model, x, target):
        loss = loss_of(model(x), target)
        model.backward(loss)
        return loss

    generator = torch.Generator().manual_seed(7)
    batch, shards, shard = 4, smp.dp_size(), smp.dp_rank()
    mine = slice(shard * batch, (shard + 1) * batch)
    record = {"losses": [], "grads": []}
    for phase in ("reference", "dropout"):
        dropouts(net, 0.0 if phase == "reference" else DROPOUT)
        dropouts(reference, 0.0)
        for _ in range(STEPS):
            if tp:
                x = torch.randint(0, VOCAB, (batch * shards, SEQ), generator=generator)
                target = torch.roll(x, -1, dims=1)
            else:
                x = torch.randn(batch * shards, 4, generator=generator)
                target = torch.randn(batch * shards, 1, generator=generator)
            optimizer.zero_grad()
            loss = train_step(model, x[mine], target[mine]).reduce_mean().item()
            losses = smp.allgather(loss, smp.DP_GROUP)
            global_loss = sum(losses) / len(losses)
            record["losses"].append(global_loss)
            record["grads"].append({n: p.grad.clone() for n, p in model.local_named_parameters()
                                    if p.grad is not None})
            optimizer.step()
            if phase == "reference":
                ref_optimizer.zero_grad()
                ref_loss = loss_of(reference(x), target)
                ref_loss.backward()
                ref_optimizer.step()
                rel = abs(global_loss - ref_loss.item()) / abs(ref_loss.item())
                assert rel <= 1e-5, (len(record["losses"]), global_loss, ref_loss.item())
        if phase == "reference":
            full, expected = model.state_dict(), reference.state_dict()
            worst = max((full[k] - v).abs().max().item() for k, v in expected.items())
            assert worst <= 1e-5, worst
    record["calls"], record["first_layer_calls"] = calls
    torch.save(record, os.path.join(os.environ["AC_FOLDER"], f"{case['tag']}-{smp.rank()}.pt"))
    smp.barrier()
    print(f"rank {smp.rank()} {case['kind']} checkpoint {case['checkpoint']}: loss "
          f"{global_loss:.6f}, {calls[0]} block calls: 1 cases ok", flush=True)


CASES = {
    "pp2-mb2": {"pipeline_parallel_degree": 2, "microbatches": 2, "ddp": True,
                "auto_partition": False, "default_partition": 0},
    "tp2": {"tensor_parallel_degree": 2, "ddp": True},
}


@pytest.mark.parametrize("name", list(CASES))
def test_checkpointed_training_matches_plain_training(name, tmp_path):
    import torch

    # pipeline: SHOAL_ACTIVATION_CHECKPOINTING=blocks too, which the script does not call
    runs = (False, True, "blocks") if name.startswith("pp") else (False, True)
    for checkpoint in runs:
        case = {"config": CASES[name], "kind": name[:2], "checkpoint": checkpoint,
                "tag": f"{name}-{checkpoint}"}
        env = {"MP_CASE": json.dumps(case), "AC_FOLDER": str(tmp_path)}
        if checkpoint == "blocks":
            env["SHOAL_ACTIVATION_CHECKPOINTING"] = "blocks"
        run_mpi(2, env, script=HERE, timeout=300)
    for rank, checkpoint in ((r, c) for r in range(2) for c in runs[1:]):
        plain = torch.load(tmp_path / f"{name}-False-{rank}.pt")
        checkpointed = torch.load(tmp_path / f"{name}-{checkpoint}-{rank}.pt")
        assert checkpointed["losses"] == plain["losses"]
        for got, want in zip(checkpointed["grads"], plain["grads"]):
            assert got.keys() == want.keys() and got
            assert all(got[k].equal(want[k]) for k in want), [
                k for k in want if not got[k].equal(want[k])]
        calls = (checkpointed["calls"], plain["calls"])
        if checkpoint == "blocks":  # blocks 0 and 3 each checkpointed where it runs
            first = (checkpointed["first_layer_calls"], plain["first_layer_calls"])
            assert first[0] == 2 * first[1] > 0 and calls[0] == calls[1], (first, calls)
        elif name.startswith("pp"):  # each counted module recomputed once
            assert calls[0] == 2 * calls[1] > 0, calls
        else:
            assert calls[0] > calls[1] > 0, calls


if __name__ == "__main__" and sys.argv[1:] == ["worker"]:
    worker()
