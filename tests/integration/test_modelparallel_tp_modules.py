"""smp.nn's transformer modules under the real mpirun equal the single-process reference
(``transformer_reference.py``) with the same weights: each TP rank feeds its own rows of a
global batch (or, with ``prescaled_batch``, the whole batch), runs backward from fixed
output gradients, and compares its output, its input gradients and its parameters'
gradients (narrowed to its shard) with the reference's (atol = rtol = 1e-5). Both
``optimize`` layouts at tp 2 and 4 (6 heads and 18 intermediate channels over 4 ranks,
10 hidden channels over 4 in the memory layout), prescaled at tp 2; causal masks, cross
attention, the LM head's loss. With dropout on and a prescaled batch, every TP rank drops
the same elements.

This file is also the worker: ``python test_modelparallel_tp_modules.py worker``.
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
ROWS, SEQ, TOL = 2, 5, 1e-5


def sizes(tp: int) -> dict:
    if tp == 4:  # uneven: heads 2,2,1,1; intermediate 5,5,4,4; hidden 3,3,2,2
        return {"heads": 6, "head_size": 2, "hidden": 10, "inter": 18}
    return {"heads": 4, "head_size": 3, "hidden": 12, "inter": 20}


def module_cases(s: dict) -> list[tuple]:
    """(name, distributed module's kwargs, reference kwargs, what the forward takes)."""
    nn_args = {"num_attention_heads": s["heads"], "attention_head_size": s["head_size"],
               "hidden_size": s["hidden"], "attention_dropout_prob": 0.0,
               "hidden_dropout_prob": 0.0}
    ref = {"heads": s["heads"], "head_size": s["head_size"], "hidden": s["hidden"]}
    layer = {**nn_args, "intermediate_size": s["inter"]}
    ref_layer = {**ref, "inter": s["inter"]}
    out_args = {"hidden_size": s["hidden"], "intermediate_size": s["inter"],
                "hidden_dropout_prob": 0.0}
    return [
        ("attention-causal", "DistributedAttentionLayer", {**nn_args, "causal_mask_size": 8},
         ("RefAttention", {**ref, "causal": 8}), "attn"),
        ("attention-cross-pre-post", "DistributedAttentionLayer",
         {**nn_args, "cross_attention": True, "pre_layernorm": True},
         ("RefAttention", {**ref, "cross": True, "pre": True}), "cross_attn"),
        ("output-gelu", "DistributedTransformerOutputLayer", out_args,
         ("RefOutput", {"hidden": s["hidden"], "inter": s["inter"]}), "plain"),
        ("output-relu-pre", "DistributedTransformerOutputLayer",
         {**out_args, "activation": "relu", "pre_layernorm": True, "post_layernorm": False},
         ("RefOutput", {"hidden": s["hidden"], "inter": s["inter"], "activation": "relu",
                        "pre": True, "post": False}), "plain"),
        ("layer-cross-pre", "DistributedTransformerLayer",
         {**layer, "add_cross_attention": True, "pre_layernorm": True, "post_layernorm": False},
         ("RefLayer", {**ref_layer, "cross": True, "pre": True, "post": False}), "cross_layer"),
        ("transformer-causal", "DistributedTransformer",
         {**layer, "num_layers": 2, "causal_mask_size": SEQ},
         ("RefTransformer", {**ref_layer, "num_layers": 2, "causal": SEQ}), "layer"),
    ]


def make_inputs(kind: str, rows: int, hidden: int, gen):
    import torch

    def states():
        return torch.randn(rows, SEQ, hidden, generator=gen).requires_grad_()

    def mask():
        return (torch.rand(rows, 1, 1, SEQ, generator=gen) < 0.3).float() * -1e4

    if kind == "plain":
        return states()
    if kind in ("attn", "layer"):
        return (states(), mask())
    if kind == "cross_attn":
        return (states(), states(), mask())
    return (states(), states(), mask(), mask())  # cross_layer


def rows_of(value, mine):

    if isinstance(value, tuple):
        return tuple(rows_of(v, mine) for v in value)
    part = value[mine].detach()
    return part.requires_grad_() if part.is_floating_point() and value.requires_grad else part


def leaves(value):
    items = value if isinstance(value, tuple) else (value,)
    return [v for v in items if v.requires_grad]


def close(what: str, got, want) -> None:
    import torch

    assert got.shape == want.shape, (what, got.shape, want.shape)
    assert torch.allclose(got, want, atol=TOL, rtol=TOL), \
        (what, (got - want).abs().max().item())


def compare_grads(case: str, dist, ref) -> None:
    from transformer_reference import shard_of

    full = dict(ref.named_parameters())
    for name, param in dist.named_parameters():
        close(f"{case}: grad of {name}", param.grad, shard_of(dist, name, full[name].grad))


def check_module(smp, case, tp: int, prescaled: bool) -> None:
    import torch
    import transformer_reference as reference
    from transformer_reference import load_shards

    name, cls, args, (ref_cls, ref_args), kind = case
    torch.manual_seed(0)
    ref = getattr(reference, ref_cls)(**ref_args)
    dist = getattr(smp.nn, cls)(**args)
    load_shards(dist, ref)
    gen = torch.Generator().manual_seed(1)
    group_rows = ROWS if prescaled else ROWS * tp
    inputs = make_inputs(kind, group_rows, args.get("hidden_size"), gen)
    mine = slice(0, group_rows) if prescaled else slice(smp.tp_rank() * ROWS,
                                                       (smp.tp_rank() + 1) * ROWS)
    local = rows_of(inputs, mine)
    ref_out, out = ref(inputs), dist(local)
    if isinstance(out, tuple):
        assert all(torch.equal(a, b) for a, b in zip(out[1:], local[1:])), "inputs come back"
        ref_out, out = ref_out[0], out[0]
    grad = torch.randn(ref_out.shape, generator=gen)
    ref_out.backward(grad)
    out.backward(grad[mine])
    close(f"{name}: output", out, ref_out[mine])
    for got, want in zip(leaves(local), leaves(inputs)):
        close(f"{name}: input grad", got.grad, want.grad[mine])
    compare_grads(name, dist, ref)


def check_lm_head(smp, tp: int, prescaled: bool) -> None:
    """Non-prescaled, each rank's loss is the mean over its rows: the reference's objective
    is the sum of those means. Prescaled, each rank holds its positions of the sequence
    (logits ``[S/tp, N, vocab]``), its loss the mean over their tokens, and the group's
    gradients add up to the whole batch's mean loss."""
    import torch
    from transformer_reference import RefLMHead, load_shards

    s = sizes(2)  # the word embedding splits the hidden channels evenly
    vocab, positions = 17, 8
    torch.manual_seed(0)
    ref = RefLMHead(2, vocab, positions, 3, final_layernorm=True, heads=s["heads"],
                    head_size=s["head_size"], hidden=s["hidden"], inter=s["inter"],
                    causal=positions, pre=True, post=False)
    dist = smp.nn.DistributedTransformerLMHead(
        num_layers=2, num_attention_heads=s["heads"], attention_head_size=s["head_size"],
        hidden_size=s["hidden"], intermediate_size=s["inter"], vocab_size=vocab,
        num_positions=positions, num_token_types=3, causal_mask_size=positions,
        pre_layernorm=True, post_layernorm=False, attention_dropout_prob=0.0,
        hidden_dropout_prob=0.0, embedding_dropout_prob=0.0)
    assert dist.layernorm is not None  # pre-layernorm stacks end normalised
    load_shards(dist, ref)
    gen = torch.Generator().manual_seed(2)
    group_rows = ROWS if prescaled else ROWS * tp
    seq = 6 if prescaled else SEQ  # prescaled: split over the group, a multiple of tp
    ids = torch.randint(0, vocab, (group_rows, seq), generator=gen)
    ids[0, 3] = -100  # a label to ignore
    labels = ids.clone()
    ids = ids.clamp(min=0)
    mask = (torch.rand(group_rows, seq, generator=gen) < 0.2).long()
    types = torch.randint(0, 3, (group_rows, seq), generator=gen)
    mine = slice(0, group_rows) if prescaled else slice(smp.tp_rank() * ROWS,
                                                       (smp.tp_rank() + 1) * ROWS)
    loss, logits = dist((ids[mine], mask[mine], types[mine], None, labels[mine]))
    blocks = [slice(0, group_rows)] if prescaled else [slice(r * ROWS, (r + 1) * ROWS)
                                                      for r in range(tp)]
    ref_losses = [ref((ids[b], mask[b], types[b], None, labels[b]))[0] for b in blocks]
    ref_logits = ref((ids, mask, types, None, None))
    grad = torch.randn(ref_logits.shape, generator=gen)
    (sum(ref_losses) + (ref_logits * grad).sum()).backward()
    if prescaled:  # SMP's layout: this rank's positions, sequence first
        width = seq // tp
        positions = slice(smp.tp_rank() * width, (smp.tp_rank() + 1) * width)
        want_logits = ref_logits[:, positions].transpose(0, 1).detach()
        my_grad = grad[:, positions].transpose(0, 1)
        targets = torch.nn.functional.pad(labels[:, 1:], (0, 1), value=-100)[:, positions]
        want_loss = torch.nn.functional.cross_entropy(
            want_logits.reshape(-1, vocab), targets.transpose(0, 1).reshape(-1))
    else:
        want_logits, my_grad = ref_logits[mine].detach(), grad[mine]
        want_loss = ref_losses[smp.tp_rank()].detach()
    (loss + (logits * my_grad).sum()).backward()
    close("lm head: logits", logits, want_logits)
    close("lm head: loss", loss, want_loss)
    compare_grads("lm head", dist, ref)
    shape = (seq // tp, group_rows, vocab) if prescaled else (ROWS, seq, vocab)
    assert dist((ids[mine], mask[mine])).shape == shape
    if prescaled:
        from shoal.modelparallel.errors import InvalidSeqLenPrescaledBatchError

        try:
            dist((ids[:, :5], mask[:, :5]))
        except InvalidSeqLenPrescaledBatchError as exc:
            assert str(exc) == ("Sequence length must be greater than and divisible by the "
                                "tensor parallelism degree when prescaled_batch is True.")
        else:
            raise AssertionError("a sequence of 5 at tp 2 was taken")


def check_prescaled_dropout(smp) -> None:
    """Same batch, dropout on: every TP rank drops the same elements."""
    import torch

    torch.manual_seed(0)
    s = sizes(2)
    layer = smp.nn.DistributedTransformerLayer(
        num_attention_heads=s["heads"], attention_head_size=s["head_size"],
        hidden_size=s["hidden"], intermediate_size=s["inter"], attention_dropout_prob=0.5,
        hidden_dropout_prob=0.5)
    x = torch.randn(ROWS, SEQ, s["hidden"], generator=torch.Generator().manual_seed(3))
    out = layer((x, None))[0]
    layer.eval()
    assert not torch.allclose(out, layer((x, None))[0])  # the dropout did something
    everyone = smp.allgather(out.detach(), smp.TP_GROUP)
    assert all(torch.equal(o, everyone[0]) for o in everyone)


def worker() -> None:
    import smdistributed.modelparallel.torch as smp

    case = json.loads(os.environ["MP_CASE"])
    tp, prescaled = case["tp"], case["prescaled"]
    smp.init({"tensor_parallel_degree": tp, "ddp": True, "optimize": case["optimize"],
              "prescaled_batch": prescaled})
    count = 0
    for module_case in module_cases(sizes(tp)):
        check_module(smp, module_case, tp, prescaled)
        count += 1
    if tp == 2:
        check_lm_head(smp, tp, prescaled)
        count += 1
    if prescaled:
        check_prescaled_dropout(smp)
        count += 1
    smp.barrier()
    print(f"rank {smp.rank()} tp {smp.tp_rank()}: {count} cases ok", flush=True)


RUNS = {
    "tp2-speed": {"tp": 2, "optimize": "speed", "prescaled": False},
    "tp2-memory": {"tp": 2, "optimize": "memory", "prescaled": False},
    "tp2-speed-prescaled": {"tp": 2, "optimize": "speed", "prescaled": True},
    "tp4-speed-uneven": {"tp": 4, "optimize": "speed", "prescaled": False},
    "tp4-memory-uneven": {"tp": 4, "optimize": "memory", "prescaled": False},
}


@pytest.mark.parametrize("name", list(RUNS))
def test_transformer_modules_match_one_process(name):
    case = RUNS[name]
    run_mpi(case["tp"], {"MP_CASE": json.dumps(case)}, script=HERE, timeout=120)


if __name__ == "__main__" and sys.argv[1:] == ["worker"]:
    worker()
