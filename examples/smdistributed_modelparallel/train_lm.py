"""A small transformer language model trained with SageMaker's model parallel library (SMP v1
API): pipeline parallel over the model's blocks, data parallel over the pipelines, and, with
``tensor_parallel_degree`` > 1, tensor parallel: the model is created inside
``smp.tensor_parallelism()``, so its MLPs' linear layers become ``smp.nn.DistributedLinear``
and its position embedding ``smp.nn.DistributedEmbedding`` (the tied token embedding and
output layer share a weight, so SMP leaves them whole). With
``sharded_data_parallel_degree`` > 1 each sharding group holds one copy of the parameters,
gradients and optimizer state, split among its ranks; the checkpoint is a file per shard.

The script is written as for SageMaker (``import smdistributed.modelparallel.torch as smp``);
on Shoal it runs unchanged, locally or on SageMaker. The tokens are generated: each sequence
counts up from a random start with a random stride, so the next token is predictable from the
two before it, and the loss falls well below that of guessing (log of the vocabulary size).
"""

import argparse
import json
import math
import os

import smdistributed.modelparallel.torch as smp
import torch
import torch.nn.functional as F
from torch import nn


class Block(nn.Module):
    def __init__(self, width: int, heads: int):
        super().__init__()
        self.norm1 = nn.LayerNorm(width)
        self.attention = nn.MultiheadAttention(width, heads, batch_first=True)
        self.norm2 = nn.LayerNorm(width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    def forward(self, x):
        n = x.shape[1]
        causal = torch.triu(torch.ones(n, n, dtype=torch.bool), diagonal=1)
        h = self.norm1(x)
        x = x + self.attention(h, h, h, attn_mask=causal, need_weights=False)[0]
        return x + self.mlp(self.norm2(x))


class TinyGPT(nn.Module):
    def __init__(self, vocab: int, width: int, heads: int, layers: int, length: int):
        super().__init__()
        self.tokens = nn.Embedding(vocab, width)
        self.positions = nn.Embedding(length, width)
        self.blocks = nn.Sequential(*[Block(width, heads) for _ in range(layers)])
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab, bias=False)
        self.head.weight = self.tokens.weight  # tied, as in GPT-2
        nn.init.normal_(self.tokens.weight, std=0.02)
        nn.init.normal_(self.positions.weight, std=0.02)

    def forward(self, ids):
        positions = torch.arange(ids.shape[1]).unsqueeze(0)
        x = self.tokens(ids) + self.positions(positions)
        return self.head(self.norm(self.blocks(x)))


def batches(count, batch, length, vocab, seed):
    generator = torch.Generator().manual_seed(seed)
    for _ in range(count):
        start = torch.randint(0, vocab, (batch, 1), generator=generator)
        stride = torch.randint(1, 4, (batch, 1), generator=generator)
        yield (start + stride * torch.arange(length + 1)) % vocab


@smp.step
def train_step(model, ids, targets):
    logits = model(ids)
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
    model.backward(loss)
    return loss


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--batch-size", type=int, default=16)  # per data-parallel replica
    parser.add_argument("--vocab", type=int, default=64)
    parser.add_argument("--length", type=int, default=16)
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--model-dir", default=os.environ.get("SM_MODEL_DIR", "/tmp/model"))
    args, _ = parser.parse_known_args()

    smp.init()
    torch.manual_seed(1234)  # every rank builds the same model
    with smp.tensor_parallelism(enabled=smp.tp_size() > 1):
        model = TinyGPT(args.vocab, args.width, 4, args.layers, args.length)
    model = smp.DistributedModel(model)
    optimizer = smp.DistributedOptimizer(torch.optim.AdamW(model.parameters(), lr=args.lr))
    sharded = smp.state.cfg.sharded_data_parallel_degree
    if smp.rank() == 0 and sharded > 1:
        held = sum(p.ds_tensor.numel() for p in model.parameters())
        whole = sum(p.ds_numel for p in model.parameters())
        print(f"sharded data parallel: degree {sharded}, this rank holds {held} of {whole} "
              "parameter elements", flush=True)
    if smp.rank() == 0 and smp.tp_size() > 1:
        kinds = sorted({type(m).__name__ for m in model.distributed_modules()})
        print(f"tensor parallel: {len(model.distributed_modules())} modules distributed "
              f"({', '.join(kinds)})", flush=True)

    # Each data-parallel rank trains on its own stream of batches (with tensor parallelism,
    # each rank of a TP group too: SMP's default, without prescaled_batch).
    loss = None
    for step, sequences in enumerate(batches(args.steps, args.batch_size, args.length,
                                             args.vocab, seed=smp.dp_rank())):
        optimizer.zero_grad()
        loss = train_step(model, sequences[:, :-1], sequences[:, 1:]).reduce_mean()
        optimizer.step()
        if smp.rank() == 0 and step % 10 == 0:
            print(f"step {step}: loss {loss.item():.4f}", flush=True)

    losses = smp.allgather(loss.item(), smp.DP_GROUP)
    final = sum(losses) / len(losses)
    if smp.rank() == 0:
        print(f"final loss {final:.4f} (guessing: {math.log(args.vocab):.4f}); "
              f"pipeline {smp.pp_size()} x tensor {smp.tp_size()} x data parallel "
              f"{smp.rdp_size()} ({smp.dp_size()} data-parallel ranks)", flush=True)
    # The whole model, gathered from every pipeline and tensor-parallel rank (a collective:
    # every rank calls it), for use outside the job; rank 0 writes it.
    full = model.state_dict()
    if smp.rank() == 0:
        os.makedirs(args.model_dir, exist_ok=True)
        smp.save(full, os.path.join(args.model_dir, "model_full.pt"), partial=False)
    if sharded > 1:  # a file per shard: final_partial/model_{shard}.pt, optimizer_{shard}.pt
        smp.save_checkpoint(args.model_dir, "final", partial=True, model=model,
                            optimizer=optimizer)
    elif smp.rdp_rank() == 0:  # one copy of each partition: {pp_rank}_{tp_rank}
        os.makedirs(args.model_dir, exist_ok=True)
        smp.save(model.local_state_dict(), os.path.join(args.model_dir, "model.pt"), partial=True)
    if smp.rank() == 0:
        with open(os.path.join(args.model_dir, "metrics.json"), "w") as f:
            json.dump({"loss": final, "pp": smp.pp_size(), "tp": smp.tp_size(),
                       "dp": smp.dp_size(), "sdp": sharded}, f)
    smp.barrier()


if __name__ == "__main__":
    main()
