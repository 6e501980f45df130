"""Hugging Face models under tensor parallelism 2 (the real mpirun, 2 ranks): a tiny GPT-2,
BERT, GPT-NeoX and GPT-J created inside ``smp.model_creation(tensor_parallelism=True)``,
wrapped by ``smp.DistributedModel`` (their supported module replaced by SMP's distributed
transformer, weights translated; ``optimize: speed``, GPT-J also ``memory``), trained 3 SGD steps by plain forward/backward, each TP rank
on its rows of the global batch. The losses equal those of the Hugging Face model trained in
one process on the global batch (relative 1e-5), and the gathered state dict, translated
back to Hugging Face's names, equals that model's (atol 1e-5).

This file is also the worker: ``python test_modelparallel_huggingface.py worker``.
"""

from __future__ import annotations

import copy
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_collectives import MPI_MARKS, run_mpi  # noqa: E402

HERE = os.path.abspath(__file__)
pytestmark = [*MPI_MARKS, pytest.mark.torch]
VOCAB, SEQ, BATCH, STEPS = 64, 8, 2, 3


def build(family):
    """The Hugging Face model, the replaced module's path, its translator to HF names, and
    the loss of a batch."""
    import torch
    import transformers
    from shoal.modelparallel.torch.nn.huggingface import bert, gpt2, gptj, gptneox

    def causal(model, ids, mask):
        return model(input_ids=ids, attention_mask=mask, labels=ids)["loss"]

    target = torch.randn(2 * BATCH, SEQ, 32, generator=torch.Generator().manual_seed(3))

    def encoder(model, ids, mask):
        rows = target[: ids.shape[0]] if ids.shape[0] == 2 * BATCH else target[_mine()]
        hidden = model(input_ids=ids, attention_mask=mask).last_hidden_state
        return ((hidden - rows) ** 2).mean()

    common = dict(vocab_size=VOCAB)
    if family == "gpt2":
        config = transformers.GPT2Config(n_positions=32, n_embd=32, n_layer=2, n_head=4,
                                         resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, **common)
        make, loss, to_hf, path = transformers.GPT2LMHeadModel, causal, \
            gpt2.translate_state_dict_to_hf_gpt2, ""
    elif family == "bert":
        config = transformers.BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                         intermediate_size=64, max_position_embeddings=32,
                                         hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                                         **common)
        make = lambda c: transformers.BertModel(c, add_pooling_layer=False)  # noqa: E731
        loss, to_hf, path = encoder, bert.translate_state_dict_to_hf_bert, "encoder"
    elif family == "gptneox":
        config = transformers.GPTNeoXConfig(hidden_size=32, num_hidden_layers=2,
                                            num_attention_heads=4, intermediate_size=64,
                                            max_position_embeddings=32, rotary_pct=0.5,
                                            hidden_dropout=0.0, attention_dropout=0.0, **common)
        make, loss, to_hf, path = transformers.GPTNeoXForCausalLM, causal, \
            gptneox.translate_state_dict_to_hf_gptneox, ""
    else:
        config = transformers.GPTJConfig(n_positions=32, n_embd=32, n_layer=2, n_head=4,
                                         rotary_dim=4, resid_pdrop=0.0, embd_pdrop=0.0,
                                         attn_pdrop=0.0, **common)
        make, loss, to_hf, path = transformers.GPTJForCausalLM, causal, \
            gptj.translate_state_dict_to_hf_gptj, ""
    config._attn_implementation = "eager"
    return config, make, loss, to_hf, path


def _mine():
    import smdistributed.modelparallel.torch as smp

    return slice(smp.dp_rank() * BATCH, (smp.dp_rank() + 1) * BATCH)


def worker() -> None:
    import smdistributed.modelparallel.torch as smp
    import torch

    family, optimize = os.environ["HF_FAMILY"], os.environ["HF_OPTIMIZE"]
    smp.init({"tensor_parallel_degree": 2, "ddp": True, "optimize": optimize})
    config, make, loss_of, to_hf, path = build(family)
    torch.manual_seed(1)
    with smp.model_creation(tensor_parallelism=True):
        net = make(config)
    reference = copy.deepcopy(net)
    model = smp.DistributedModel(net)
    replaced = model.get_module().get_submodule(path) if path else model.get_module()
    assert isinstance(replaced, (smp.nn.DistributedTransformer, smp.nn.DistributedTransformerLMHead))
    optimizer = smp.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.5))
    ref_optimizer = torch.optim.SGD(reference.parameters(), lr=0.5)
    generator = torch.Generator().manual_seed(7)
    for step in range(STEPS):
        ids = torch.randint(2, VOCAB, (2 * BATCH, SEQ), generator=generator)
        mask = torch.ones_like(ids)
        mask[step % (2 * BATCH), -2:] = 0  # a padded row, on one rank or the other
        optimizer.zero_grad()
        loss = loss_of(model, ids[_mine()], mask[_mine()])
        loss.backward()
        optimizer.step()
        ref_optimizer.zero_grad()
        ref_loss = loss_of(reference, ids, mask)
        ref_loss.backward()
        ref_optimizer.step()
        losses = smp.allgather(loss.item(), smp.DP_GROUP)
        rel = abs(sum(losses) / len(losses) - ref_loss.item()) / abs(ref_loss.item())
        assert rel <= 1e-5, (step, losses, ref_loss.item())
    full = to_hf(model.state_dict())
    expected = reference.state_dict()
    assert set(full) == set(expected), sorted(set(full) ^ set(expected))
    worst = max((full[k] - v).abs().max().item() for k, v in expected.items())
    assert worst <= 1e-5, worst
    # A Hugging Face state dict loads as it is: translated to the distributed names.
    fresh = make(config).state_dict()
    model.load_state_dict(fresh)
    back = to_hf(model.state_dict())
    assert all(torch.equal(back[k], v) for k, v in fresh.items())
    # A full checkpoint is written under the Hugging Face names, and resumes.
    folder = os.environ["HF_FOLDER"]
    smp.save_checkpoint(folder, "full", partial=False, model=model)
    saved = torch.load(os.path.join(folder, "full"), weights_only=False)["model"]
    assert set(saved) == set(fresh) and all(torch.equal(saved[k], v) for k, v in fresh.items())
    with torch.no_grad():
        for param in model.parameters():
            param.zero_()
    smp.resume_from_checkpoint(folder, tag="full", partial=False)
    back = to_hf(model.state_dict())
    assert all(torch.equal(back[k], v) for k, v in fresh.items())
    smp.barrier()
    print(f"rank {smp.rank()} {family}: loss rel {rel:.1e} weights {worst:.1e}: 1 cases ok",
          flush=True)


@pytest.mark.parametrize("family,optimize", [("gpt2", "speed"), ("bert", "speed"),
                                             ("gptneox", "speed"), ("gptj", "speed"),
                                             ("gptj", "memory")])
def test_hf_model_at_tp2_matches_one_process(family, optimize, tmp_path):
    pytest.importorskip("transformers", reason="the Hugging Face translations need transformers")
    run_mpi(2, {"HF_FAMILY": family, "HF_OPTIMIZE": optimize, "HF_FOLDER": str(tmp_path)},
            script=HERE, timeout=300)


if __name__ == "__main__" and sys.argv[1:] == ["worker"]:
    worker()
