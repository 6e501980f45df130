"""Optimizer-state sharding (``shard_optimizer_state``) under the real mpirun, 4 ranks.

A small language model trained 10 steps with Adam must end with the loss and the gathered
weights of the same model trained in one process on the same global batches (loss relative
1e-5 per step, weights atol 1e-5): pipeline 2 x data parallel 2, and tensor parallel 2 x
reduced data parallel 2 (the scaled-batch parameters sharded over RDP_GROUP, the others
over DP_GROUP). In bf16 and fp16 (pipeline 2 x data parallel 2) the loss and
``clip_master_grads``'s norm track the float32 run within the mixed-precision test's bounds
(relative 2e-2 and 5e-3); fp16 starts from a loss scale of 2**24, so its first steps
overflow: each is skipped on every rank (the weights unchanged) and halves the scale.

Each rank measures the bytes its optimizer holds (Adam's moments and step counts, plus the
float32 masters in bf16): the replicas' shares must add up to exactly the unsharded figure,
and each be 1/dp of it within 30%. ``state_dict()`` warns that it returns this stage's state
only (gathered from the replicas), ``local_state_dict(gather_if_shard=False)`` holds this
rank's shard only, and loading the gathered state back leaves each rank its shard.

SMP's refusals, with its messages, in one process: ``ddp`` off, ``DistributedModel`` without
``gradient_as_bucket_view=True``, parameters of two dtypes.

A partial checkpoint saved after step 5 (every rank writes its optimizer part,
``optimizer_{pp}_{tp}_{rdp}.pt``) and resumed by a fresh mpirun on the same layout must
continue bit for bit, the same losses and the same final weights: pipeline 2 x data
parallel 2 in fp32, tensor parallel 2 x reduced data parallel 2 in bf16. The shard saved
as Hugging Face's Trainer saves it (``smp.save(partial=True, v3=True)``) must come back
from ``smp.load(partial=True)``.

This file is also the worker: ``python test_modelparallel_optimizer_sharding.py worker``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_collectives import MPI_MARKS, run_mpi  # noqa: E402

HERE = os.path.abspath(__file__)
pytestmark = [*MPI_MARKS, pytest.mark.torch]
VOCAB, WIDTH, SEQ, BATCH, STEPS, SAVE_AFTER, CLIP = 30, 16, 5, 4, 10, 5, 0.5
TOLERANCE = {None: 1e-5, "bf16": 2e-2, "fp16": 5e-3}  # test_modelparallel_mixed_precision.py's
PIPELINE = {"pipeline_parallel_degree": 2, "microbatches": 2, "ddp": True,
            "auto_partition": False, "default_partition": 0, "shard_optimizer_state": True}
TENSOR = {"tensor_parallel_degree": 2, "ddp": True, "shard_optimizer_state": True}


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


def setup(smp, case):
    """The wrapped model (the reference's weights), its optimizer, the reference and its
    optimizer, the step function."""
    import torch
    import torch.nn.functional as F

    config = dict(case["config"])
    if case.get("precision"):
        config[case["precision"]] = True
    smp.init(config)
    net = build_model(1, smp if smp.tp_size() > 1 else None)
    if smp.pp_size() > 1:
        for name in ("embed", "up"):
            smp.set_partition(getattr(net, name), 0)
        for name in ("down", "norm", "head"):
            smp.set_partition(getattr(net, name), 1)
    reference = build_model(2)
    model = smp.DistributedModel(net, gradient_as_bucket_view=True)
    model.load_state_dict(reference.state_dict())  # before partitioning: applied then
    scale = {"static_loss_scale": None, "dynamic_loss_scale": True,
             "dynamic_loss_args": {"init_scale": 2.0**24, "scale_window": 1000}}
    optimizer = smp.DistributedOptimizer(torch.optim.Adam(model.parameters(), lr=0.01),
                                         **(scale if case.get("precision") == "fp16" else {}))
    ref_optimizer = torch.optim.Adam(reference.parameters(), lr=0.01)

    @smp.step
    def train_step(model, tokens, targets):
        loss = F.cross_entropy(model(tokens).reshape(-1, VOCAB), targets.reshape(-1))
        model.backward(loss)
        return loss

    return model, optimizer, reference, ref_optimizer, train_step


def batches(smp):
    """This rank's part of each step's global batch, and the global batch."""
    import torch

    generator = torch.Generator().manual_seed(7)
    mine = slice(smp.dp_rank() * BATCH, (smp.dp_rank() + 1) * BATCH)
    for _ in range(STEPS):
        tokens = torch.randint(0, VOCAB, (BATCH * smp.dp_size(), SEQ), generator=generator)
        targets = torch.roll(tokens, 1, dims=1)
        yield tokens[mine], targets[mine], tokens, targets


def worker() -> None:
    import smdistributed.modelparallel.torch as smp
    import torch
    import torch.nn.functional as F

    case = json.loads(os.environ["MP_CASE"])
    if case.get("phase") == "resume":
        return resume_worker(smp, case)
    model, optimizer, reference, ref_optimizer, train_step = setup(smp, case)
    tolerance = TOLERANCE[case.get("precision")]
    losses, worst, overflows = [], 0.0, 0
    for step, (tokens, targets, all_tokens, all_targets) in enumerate(batches(smp), 1):
        optimizer.zero_grad()
        loss = train_step(model, tokens, targets).reduce_mean().item()
        ref_optimizer.zero_grad()
        ref_loss = F.cross_entropy(reference(all_tokens).reshape(-1, VOCAB),
                                   all_targets.reshape(-1))
        ref_loss.backward()
        if case.get("precision"):
            norm = float(optimizer.clip_master_grads(CLIP))
            ref_norm = float(torch.nn.utils.clip_grad_norm_(reference.parameters(), CLIP))
            assert optimizer.overflow or abs(norm - ref_norm) / ref_norm <= tolerance, (
                norm, ref_norm)
        if getattr(optimizer, "overflow", False):
            overflows += check_skipped(model, optimizer, norm)
        else:
            optimizer.step()
            ref_optimizer.step()
        parts = smp.allgather(loss, smp.DP_GROUP)
        losses.append(sum(parts) / len(parts))
        rel = abs(losses[-1] - ref_loss.item()) / abs(ref_loss.item())
        worst = max(worst, rel)
        assert rel <= tolerance, (step, losses[-1], ref_loss.item(), rel)
        if step == SAVE_AFTER and case.get("folder"):
            smp.save_checkpoint(case["folder"], "mid", partial=True)
            check_save_v3(smp, optimizer, os.path.join(case["folder"], "trainer_optimizer"))
    full = model.state_dict()
    weights = max((full[k].float() - v).abs().max().item()
                  for k, v in reference.state_dict().items())
    assert case.get("precision") or weights <= 1e-5, weights
    assert (case.get("precision") == "fp16") == (0 < overflows < STEPS), overflows
    measured = check_memory(smp, model, optimizer) if smp.tp_size() == 1 else ""
    check_state_dicts(smp, model, optimizer)
    if case.get("folder") and smp.rank() == 0:
        torch.save({"losses": losses[SAVE_AFTER:], "weights": full},
                   os.path.join(case["folder"], "expected.pt"))
    smp.barrier()
    print(f"rank {smp.rank()} pp {smp.pp_rank()} tp {smp.tp_rank()} rdp {smp.rdp_rank()}: "
          f"loss rel {worst:.2e} weights {weights:.2e} overflows {overflows}{measured}: "
          "1 cases ok", flush=True)


def resume_worker(smp, case) -> None:
    """A fresh job on the same layout: resumes after step SAVE_AFTER, and must end where
    the job that saved the checkpoint ended, bit for bit."""
    import torch

    model, optimizer, _, _, train_step = setup(smp, case)
    smp.resume_from_checkpoint(case["folder"], tag="mid", partial=True)
    losses = []
    for step, (tokens, targets, _, _) in enumerate(batches(smp), 1):
        if step <= SAVE_AFTER:
            continue
        optimizer.zero_grad()
        loss = train_step(model, tokens, targets).reduce_mean().item()
        optimizer.step()
        parts = smp.allgather(loss, smp.DP_GROUP)
        losses.append(sum(parts) / len(parts))
    expected = torch.load(os.path.join(case["folder"], "expected.pt"), weights_only=False)
    assert losses == expected["losses"], (losses, expected["losses"])
    full = model.state_dict()
    assert all(full[k].equal(v) for k, v in expected["weights"].items())
    smp.barrier()
    print(f"rank {smp.rank()}: resumed, {len(losses)} losses and the weights equal: "
          f"1 cases ok", flush=True)


def check_skipped(model, optimizer, norm) -> int:
    """An overflowed fp16 step: skipped on every rank, the loss scale halved."""
    before = [p.detach().clone() for p in model.local_parameters()]
    scale = optimizer.loss_scale
    optimizer.step()
    assert optimizer.overflow and norm == -1 and optimizer.loss_scale == scale / 2
    assert all(a.equal(b) for a, b in zip(before, model.local_parameters()))
    return 1


def check_memory(smp, model, optimizer) -> str:
    """This rank's optimizer bytes against the unsharded figure of its stage."""
    from shoal.modelparallel.torch.optstate import state_bytes

    mine = state_bytes(optimizer)
    params = [p for p in model.local_parameters() if p.requires_grad]
    half = smp.state.cfg.bf16 or smp.state.cfg.fp16
    per_element = 2 * 4 + (4 if half else 0)  # moments (+ master), float32
    unsharded = sum(p.numel() * per_element + 4 for p in params)  # + the step count
    shares = smp.allgather(mine, smp.DP_GROUP)
    assert sum(shares) == unsharded, (shares, unsharded)
    ideal = unsharded / smp.dp_size()
    assert abs(mine - ideal) <= 0.3 * ideal, (mine, ideal, shares)
    return f" optimizer bytes {mine} of {unsharded} unsharded ({mine / unsharded:.3f})"


def check_state_dicts(smp, model, optimizer) -> None:
    import re

    import pytest
    from shoal.modelparallel.torch.optstate import LOCAL_ONLY, state_bytes

    with pytest.warns(UserWarning, match=re.escape(LOCAL_ONLY)):
        whole = optimizer.state_dict()
    state = whole.get("optimizer_state_dict", whole)["state"]
    stage = [i for i, p in enumerate(model.parameters()) if p.numel()]  # in the optimizer's order
    assert sorted(state) == stage, (sorted(state), stage)
    shard = optimizer.local_state_dict(gather_if_shard=False)
    owned = shard.get("optimizer_state_dict", shard)["state"]
    assert 0 < len(owned) < len(state), (len(owned), len(state))
    before = state_bytes(optimizer)
    optimizer.load_state_dict(whole)  # the whole stage's: each rank keeps its shard only
    assert state_bytes(optimizer) == before, (state_bytes(optimizer), before)
    assert same(optimizer.local_state_dict(gather_if_shard=False), shard)


def check_save_v3(smp, optimizer, path) -> None:
    """What Hugging Face's Trainer does with SMP: every rank saves its shard with
    ``smp.save(partial=True, v3=True)``; ``smp.load(partial=True)`` reads it back."""
    shard = optimizer.local_state_dict(gather_if_shard=False)
    smp.save(shard, path, partial=True, v3=True)
    assert os.path.exists(f"{path}_{smp.pp_rank()}_{smp.tp_rank()}_{smp.rdp_rank()}.pt")
    smp.barrier()
    assert same(smp.load(path, partial=True), shard)


def same(a, b) -> bool:
    """Equal nested state: tensors bit for bit."""
    import torch

    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.equal(b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a == b


CASES = {
    "pp2-dp2-fp32": {"config": PIPELINE},
    "tp2-rdp2-fp32": {"config": TENSOR},
    "pp2-dp2-bf16": {"config": PIPELINE, "precision": "bf16"},
    "pp2-dp2-fp16": {"config": PIPELINE, "precision": "fp16"},
}


def show(proc) -> None:
    for line in proc.stdout.splitlines():
        if "cases ok" in line:
            print(line)


@pytest.mark.parametrize("name", list(CASES))
def test_sharded_training_matches_one_process(name):
    show(run_mpi(4, {"MP_CASE": json.dumps(CASES[name])}, script=HERE, timeout=300))


CHECKPOINTS = {  # (case, the (pp, tp) of the model parts)
    "pp2-dp2-fp32": ({"config": PIPELINE}, [(0, 0), (1, 0)]),
    "tp2-rdp2-bf16": ({"config": TENSOR, "precision": "bf16"}, [(0, 0), (0, 1)]),
}


@pytest.mark.parametrize("name", list(CHECKPOINTS))
def test_partial_checkpoint_resumes_bit_exact(tmp_path, name):
    case, models = CHECKPOINTS[name]
    case = {**case, "folder": str(tmp_path)}
    run_mpi(4, {"MP_CASE": json.dumps(case)}, script=HERE, timeout=300)
    parts = sorted(p.name for p in (tmp_path / "mid_partial").iterdir())
    # the model from each replica's first rank, the optimizer's shards from every rank
    expected = [f"model_{pp}_{tp}_0.pt" for pp, tp in models]
    expected += [f"optimizer_{pp}_{tp}_{rdp}.pt" for pp, tp in models for rdp in (0, 1)]
    assert parts == sorted([*expected, "user_content.pt"]), parts
    show(run_mpi(4, {"MP_CASE": json.dumps({**case, "phase": "resume"})}, script=HERE,
                 timeout=300))


REFUSALS = {
    "ddp": ({"shard_optimizer_state": True},
            "smp.DistributedModel(nn.Linear(4, 2), gradient_as_bucket_view=True)",
            "SMPConfigError: Setting config parameter shard_optimizer_state to non-default value "
            "True requires ddp to be set to True. Found: False"),
    "bucket-view": ({"shard_optimizer_state": True, "ddp": True},
                    "smp.DistributedModel(nn.Linear(4, 2))",
                    "SMPUsageError: gradient_as_bucket_view must be True when "
                    "shard_optimizer_state is True."),
    "dtypes": ({"shard_optimizer_state": True, "ddp": True}, """
                    net = nn.Linear(4, 2)
                    net.scale = nn.Parameter(torch.ones(2, dtype=torch.float64))
                    model = smp.DistributedModel(net, gradient_as_bucket_view=True)
                    smp.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1))""",
               "SMPUsageError: Currently shard_optimizer_state is supported only when all "
               "parameters in the model have the same dtype. Found torch.float32, torch.float64."),
}


@pytest.mark.parametrize("name", list(REFUSALS))
def test_refusals_name_what_is_wrong(name):
    config, body, expected = REFUSALS[name]
    body = f"smp.init({config!r})\n{textwrap.dedent(body).strip()}"  # ddp: refused at init
    script = (f"import torch, torch.nn as nn\nimport smdistributed.modelparallel.torch as smp\n"
              f"try:\n{textwrap.indent(body, '    ')}"
              f"\nexcept Exception as exc:\n    print(f'{{type(exc).__name__}}: {{exc}}')\n")
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_", "SM_HP_"))}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          env=environ, timeout=180)
    assert done.returncode == 0 and done.stdout.strip() == expected, done.stdout + done.stderr


if __name__ == "__main__" and sys.argv[1:] == ["worker"]:
    worker()
