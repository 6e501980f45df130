"""The model-parallel runtime under the real mpirun: a small language model with a tied
embedding and output layer, nested modules and keyword arguments, trained 20 steps through
``smp.step`` must end with the loss and the parameters of the same model trained in one
process on the same global batches (relative difference <= 1e-5), for pipeline 2 and
4, data parallel 1 and 2, both schedules, 1 to 8 microbatches, auto and manual partitions,
on one host and on 2 simulated hosts. Each rank also checks what its step returned (the same on
every pipeline rank) and that it holds only its partition's parameters.

This file is also the worker: ``python test_modelparallel_pipeline.py worker``.
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
VOCAB, WIDTH, SEQ, STEPS = 32, 16, 6, 20


def build_model():
    import torch
    from torch import nn

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.mix = nn.Linear(WIDTH, WIDTH)
            self.norm = nn.LayerNorm(WIDTH)

        def forward(self, x, scale=1.0):
            return self.norm(x + scale * torch.tanh(self.mix(x)))

    class TinyLM(nn.Module):
        def __init__(self, blocks=4):
            super().__init__()
            self.embed = nn.Embedding(VOCAB, WIDTH)
            self.blocks = nn.ModuleList(Block() for _ in range(blocks))
            # A Sequential whose children live on several ranks: runs of children on one
            # rank go there in one call.
            self.tail = nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.Tanh(), nn.Linear(WIDTH, WIDTH))
            self.head = nn.Linear(WIDTH, VOCAB, bias=False)
            self.head.weight = self.embed.weight  # tied: must stay with the embedding

        def forward(self, tokens):
            x = self.embed(tokens)
            for block in self.blocks:
                x = block(x, scale=0.5)
            return self.head(x + 0.1 * self.tail(x))

    return TinyLM()


def worker() -> None:
    import smdistributed.modelparallel.torch as smp
    import torch
    import torch.nn.functional as F

    case = json.loads(os.environ["MP_CASE"])
    smp.init(case["config"])
    torch.manual_seed(0)
    net = build_model()
    if case.get("manual"):
        pp = smp.pp_size()
        for i, block in enumerate(net.blocks):
            smp.set_partition(block, i * pp // len(net.blocks))
        smp.set_partition(net.tail[1], pp - 1)
        smp.set_partition(net.tail[2], pp - 1)
    reference = build_model()
    reference.load_state_dict(net.state_dict())
    model = smp.DistributedModel(net)
    optimizer = smp.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.5))
    ref_optimizer = torch.optim.SGD(reference.parameters(), lr=0.05, momentum=0.5)

    @smp.step
    def train_step(model, tokens, targets):
        logits = model(tokens)
        loss = F.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1))
        model.backward(loss)
        return loss, logits, loss.item()

    dp, dp_rank = smp.dp_size(), smp.dp_rank()
    per_replica = case["batch"]
    generator = torch.Generator().manual_seed(7)
    live = []  # tensors alive after steps 3-7 and the last five: a step must not keep the
    # last one's graph (counted only there: a count scans every object of the process)
    counted = set(range(2, 7)) | set(range(STEPS - 5, STEPS))
    for step in range(STEPS):
        tokens = torch.randint(0, VOCAB, (per_replica * dp, SEQ), generator=generator)
        targets = torch.roll(tokens, 1, dims=1)
        mine = slice(dp_rank * per_replica, (dp_rank + 1) * per_replica)
        optimizer.zero_grad()
        loss_mb, logits_mb, floats = train_step(model, tokens[mine], targets[mine])
        optimizer.step()
        ref_optimizer.zero_grad()
        ref_logits = reference(tokens)
        ref_loss = F.cross_entropy(ref_logits.reshape(-1, VOCAB), targets.reshape(-1))
        ref_loss.backward()
        ref_optimizer.step()
        m = smp.num_microbatches()
        assert len(loss_mb.outputs) == m and isinstance(floats, list) and len(floats) == m
        # Each microbatch's float is its own output, in microbatch order; the mean is taken in
        # float32, so it may differ from the float64 mean by float32 rounding of m additions.
        assert floats == [o.item() for o in loss_mb.outputs]
        mean = sum(floats) / m
        assert abs(mean - loss_mb.reduce_mean().item()) <= m * torch.finfo(torch.float32).eps * abs(mean)
        assert not loss_mb.reduce_mean().requires_grad  # detached outputs
        # The replica's logits before this step's update equal the reference's rows.
        gap = (logits_mb.concat() - ref_logits[mine].detach()).abs().max().item()
        assert gap <= 1e-5 * max(1.0, ref_logits.abs().max().item()), gap
        if step in counted:
            live.append(live_tensors())
    # A step must not keep the last one's graph (dozens of tensors a step). The count moves
    # by a few from step to step (messages in flight on the transport's threads), so the
    # fewest of the last five steps is held against the most of steps 3-7, with that margin.
    assert min(live[-5:]) <= max(live[:5]) + STEPS // 2, (
        f"tensors alive after each step grew: {live}")
    losses = smp.allgather(loss_mb.reduce_mean().item(), smp.DP_GROUP)
    global_loss = sum(losses) / len(losses)
    # The reference's loss on the last batch, before its last update, is ref_loss.
    rel = abs(global_loss - ref_loss.item()) / abs(ref_loss.item())
    assert rel <= 1e-5, (global_loss, ref_loss.item())
    full = model.state_dict()
    worst = 0.0
    for key, value in reference.state_dict().items():
        diff = (full[key] - value).abs().max().item() / max(value.abs().max().item(), 1e-12)
        worst = max(worst, diff)
    assert worst <= 1e-5, worst
    local = model.local_state_dict()
    assert local["_smp_is_partial"] is True
    owned = {k for k in local if k != "_smp_is_partial"}
    if smp.pp_size() > 1:
        assert owned and owned != set(full), "each rank holds only its partition"
    owner = model.owner
    assert owner["embed"] == owner["head"], owner  # the tied pair stayed together
    check_checkpoints(smp, model, optimizer, os.environ["SHOAL_MP_TIMELINE"])
    smp.barrier()
    print(f"rank {smp.rank()} pp {smp.pp_rank()} dp {smp.dp_rank()}: loss {global_loss:.6f} "
          f"rel {rel:.2e} params {worst:.2e} owners {sorted(set(owner.values()))}: "
          f"1 cases ok", flush=True)


def live_tensors() -> int:
    import gc

    import torch

    gc.collect()
    return sum(1 for o in gc.get_objects() if isinstance(o, torch.Tensor))


def check_checkpoints(smp, model, optimizer, folder):
    """save_checkpoint then resume_from_checkpoint restores this rank's parameters and
    optimizer state; smp.save/smp.load with partial=True round-trip the local state."""
    import torch

    saved = {k: v.clone() for k, v in model.local_state_dict().items() if k != "_smp_is_partial"}
    momentum = {k: v["momentum_buffer"].clone() for k, v in optimizer.state.items()
                if "momentum_buffer" in v}
    smp.save_checkpoint(folder, "step20", partial=True, user_content={"epoch": 3})
    with torch.no_grad():
        for param in model.local_parameters():
            param.zero_()
    assert smp.resume_from_checkpoint(folder) == {"epoch": 3}
    restored = model.local_state_dict()
    assert all(torch.equal(restored[k], v) for k, v in saved.items())
    assert all(torch.equal(optimizer.state[k]["momentum_buffer"], v) for k, v in momentum.items())
    if smp.dp_rank() == 0:
        smp.save(model.local_state_dict(), os.path.join(folder, "weights"), partial=True)
    smp.barrier()
    loaded = smp.load(os.path.join(folder, "weights"), partial=True)
    assert loaded["_smp_is_partial"] and set(loaded) == set(model.local_state_dict())


CASES = {
    "pp2-dp1-interleaved-mb1-auto": (2, {"partitions": 2, "microbatches": 1}, 4, False),
    "pp2-dp1-interleaved-mb8-auto": (2, {"partitions": 2, "microbatches": 8}, 8, False),
    "pp2-dp1-simple-mb4-manual": (2, {"partitions": 2, "microbatches": 4, "pipeline": "simple",
                                      "active_microbatches": 4, "auto_partition": False,
                                      "default_partition": 0}, 8, True),
    "pp4-dp1-interleaved-mb4-manual": (4, {"partitions": 4, "microbatches": 4,
                                           "auto_partition": False, "default_partition": 0},
                                       4, True),
    "pp4-dp1-simple-mb8-auto": (4, {"partitions": 4, "microbatches": 8, "pipeline": "simple",
                                    "active_microbatches": 8}, 8, False),
    "pp2-dp2-interleaved-mb2-auto": (4, {"partitions": 2, "microbatches": 2, "ddp": True}, 4, False),
    "pp2-dp2-simple-mb4-manual-spread": (4, {"partitions": 2, "microbatches": 4, "ddp": True,
                                             "pipeline": "simple", "active_microbatches": 4,
                                             "placement_strategy": "spread",
                                             "auto_partition": False, "default_partition": 0},
                                         4, True),
}


@pytest.mark.parametrize("name", list(CASES))
def test_pipeline_matches_one_process(name, tmp_path):
    ranks, config, batch, manual = CASES[name]
    case = {"config": config, "batch": batch, "manual": manual}
    run_mpi(ranks, {"MP_CASE": json.dumps(case), "SHOAL_MP_TIMELINE": str(tmp_path)},
            script=HERE, timeout=300)
    from shoal.modelparallel.torch.timeline import idle_fraction

    for rank in range(ranks):
        events = json.loads((tmp_path / f"timeline-rank{rank}.json").read_text())["traceEvents"]
        steps = [e for e in events if e["cat"] == "step"]
        assert len(steps) == 20  # one span per smp.step call
        tasks = [e for e in events if e["cat"] == "task"]
        assert {e["args"]["task"] for e in tasks}  # the rank did work in its turns
        assert all(0.0 <= f < 1.0 for f in idle_fraction(events))
        if config.get("ddp"):
            check_buckets_start_inside_their_step(rank, events)
    leader = json.loads((tmp_path / "timeline-rank0.json").read_text())["traceEvents"]
    assert any(e["cat"] == "transfer" and e["name"] == "call" for e in leader)


def check_buckets_start_inside_their_step(rank, events):
    """With ``ddp``, from the second step on (the first has nothing to go by), a rank's
    first gradient bucket starts before its step's last task has ended: the allreduce
    overlaps the backward."""
    steps = sorted((e["ts"], e["ts"] + e["dur"]) for e in events if e["cat"] == "step")
    tasks = [e for e in events if e["cat"] == "task"]
    starts = sorted(e["ts"] for e in events if e["name"] == "allreduce" and e["ph"] == "i")
    for begin, end in steps[1:]:
        last_task_end = max(e["ts"] + e["dur"] for e in tasks if begin <= e["ts"] <= end)
        first = min(t for t in starts if t >= begin)
        assert first < last_task_end, (rank, begin, first, last_task_end)


def test_two_simulated_hosts_pipeline_across_hosts(tmp_path):
    """pipeline 2 x data 2 as 2 hosts x 2 processes: with ``cluster`` placement each host
    holds one pipeline, with ``spread`` each pipeline crosses the hosts."""
    for placement in ("cluster", "spread"):
        case = {"config": {"partitions": 2, "microbatches": 4, "ddp": True,
                           "placement_strategy": placement}, "batch": 4, "manual": False}
        folder = tmp_path / placement
        run_mpi(4, {"MP_CASE": json.dumps(case), "SHOAL_MP_TIMELINE": str(folder)},
                per_rank_host=lambda r: f"h{r // 2}", script=HERE, timeout=300)


if __name__ == "__main__" and sys.argv[1:] == ["worker"]:
    worker()
