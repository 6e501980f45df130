"""Tensor parallelism with ``smp.nn``'s transformer layers inside a whole model, combined with
the pipeline and data parallelism, under the real mpirun: a small causal language model
(a distributed embedding, two ``DistributedTransformerLayer``s, a distributed output layer)
trained 6 steps through ``smp.step`` ends with the loss and the gathered weights of the
same model built from the reference layers and trained in one process on the same global
batches (loss relative 1e-5, weights atol 1e-5): TP 2 x PP 2 with 4 microbatches in flight
(the TP peers take their microbatches in their own orders), TP 2 x DP 2 with a prescaled
batch on 2 simulated hosts, and TP 2 in the ``memory`` layout. A run with dropout checks
that every replica of every parameter still agrees after training (the TP peers drew the
same masks).

This file is also the worker: ``python test_modelparallel_tp_transformer.py worker``.
"""

from __future__ import annotations

import json
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_collectives import MPI_MARKS, run_mpi  # noqa: E402
from test_modelparallel_tensor_parallel import check_replicas_agree  # noqa: E402

HERE = os.path.abspath(__file__)
pytestmark = [*MPI_MARKS, pytest.mark.torch]
VOCAB, HEADS, HEAD_SIZE, HIDDEN, INTER, SEQ, STEPS = 24, 4, 4, 16, 32, 6, 6


def build_model(distributed: bool, dropout: float = 0.0):
    import torch
    from torch import nn

    if distributed:
        import smdistributed.modelparallel.torch as smp

        def layer():
            return smp.nn.DistributedTransformerLayer(
                num_attention_heads=HEADS, attention_head_size=HEAD_SIZE, hidden_size=HIDDEN,
                intermediate_size=INTER, attention_dropout_prob=dropout,
                hidden_dropout_prob=dropout, causal_mask_size=SEQ, pre_layernorm=True,
                post_layernorm=False)
    else:
        from transformer_reference import RefLayer

        def layer():
            return RefLayer(HEADS, HEAD_SIZE, HIDDEN, INTER, causal=SEQ, pre=True, post=False)

    class TinyGPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(VOCAB, HIDDEN)
            self.layers = nn.ModuleList(layer() for _ in range(2))
            self.norm = nn.LayerNorm(HIDDEN)
            self.head = nn.Linear(HIDDEN, VOCAB)

        def forward(self, tokens):
            x = self.embed(tokens)
            mask = torch.zeros(tokens.shape[0], 1, 1, tokens.shape[1])
            for block in self.layers:
                x, mask = block((x, mask))
            return self.head(self.norm(x))

    return TinyGPT()


def worker() -> None:
    import smdistributed.modelparallel.torch as smp
    import torch
    import torch.nn.functional as F

    case = json.loads(os.environ["MP_CASE"])
    smp.init(case["config"])
    torch.manual_seed(3)
    with smp.tensor_parallelism():
        net = build_model(True, case.get("dropout", 0.0))
    if smp.pp_size() > 1:
        smp.set_partition(net.embed, 0)
        smp.set_partition(net.layers[0], 0)
        for module in (net.layers[1], net.norm, net.head):
            smp.set_partition(module, 1)
    torch.manual_seed(4)
    reference = build_model(False)
    model = smp.DistributedModel(net)
    model.load_state_dict(reference.state_dict())
    optimizer = smp.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.2))
    ref_optimizer = torch.optim.SGD(reference.parameters(), lr=0.2)

    @smp.step
    def train_step(model, tokens, targets):
        logits = model(tokens)
        loss = F.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1))
        model.backward(loss)
        return loss

    prescaled = case["config"].get("prescaled_batch", False)
    shards, shard = (smp.rdp_size(), smp.rdp_rank()) if prescaled else (smp.dp_size(), smp.dp_rank())
    batch = case["batch"]
    generator = torch.Generator().manual_seed(11)
    for _ in range(STEPS):
        tokens = torch.randint(0, VOCAB, (batch * shards, SEQ), generator=generator)
        targets = torch.roll(tokens, -1, dims=1)
        mine = slice(shard * batch, (shard + 1) * batch)
        optimizer.zero_grad()
        loss = train_step(model, tokens[mine], targets[mine]).reduce_mean().item()
        optimizer.step()
        losses = smp.allgather(loss, smp.RDP_GROUP if prescaled else smp.DP_GROUP)
        global_loss = sum(losses) / len(losses)
        if case.get("dropout"):
            continue  # other masks than the reference's: only the replicas' agreement counts
        ref_optimizer.zero_grad()
        ref_loss = F.cross_entropy(reference(tokens).reshape(-1, VOCAB), targets.reshape(-1))
        ref_loss.backward()
        ref_optimizer.step()
        rel = abs(global_loss - ref_loss.item()) / abs(ref_loss.item())
        assert rel <= 1e-5, (global_loss, ref_loss.item())
    check_replicas_agree(smp, model)
    full = model.state_dict()
    if not case.get("dropout"):
        expected = reference.state_dict()
        assert set(full) == set(expected), set(full) ^ set(expected)
        worst = max((full[k] - v).abs().max().item() for k, v in expected.items())
        assert worst <= 1e-5, worst
    smp.barrier()
    print(f"rank {smp.rank()} tp {smp.tp_rank()} pp {smp.pp_rank()} rdp {smp.rdp_rank()}: "
          f"loss {global_loss:.6f}: 1 cases ok", flush=True)


CASES = {
    # name: (ranks, config, per-rank batch, hosts, dropout)
    "tp2-pp2-mb4": (4, {"tensor_parallel_degree": 2, "pipeline_parallel_degree": 2,
                        "microbatches": 4, "ddp": True, "auto_partition": False,
                        "default_partition": 0}, 4, 1, 0.0),
    "tp2-dp2-prescaled-two-hosts": (4, {"tensor_parallel_degree": 2, "ddp": True,
                                        "prescaled_batch": True, "microbatches": 2}, 4, 2, 0.0),
    "tp2-memory": (2, {"tensor_parallel_degree": 2, "ddp": True, "optimize": "memory"}, 3, 1, 0.0),
    "tp2-pp2-mb4-dropout": (4, {"tensor_parallel_degree": 2, "pipeline_parallel_degree": 2,
                                "microbatches": 4, "ddp": True, "auto_partition": False,
                                "default_partition": 0}, 4, 1, 0.2),
}


@pytest.mark.parametrize("name", list(CASES))
def test_tensor_parallel_transformer_matches_one_process(name):
    ranks, config, batch, hosts, dropout = CASES[name]
    case = {"config": config, "batch": batch, "dropout": dropout}
    host = (lambda r: f"h{r // (ranks // hosts)}") if hosts > 1 else None
    run_mpi(ranks, {"MP_CASE": json.dumps(case)}, per_rank_host=host, script=HERE, timeout=300)


if __name__ == "__main__" and sys.argv[1:] == ["worker"]:
    worker()
