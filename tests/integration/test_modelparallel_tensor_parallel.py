"""Tensor parallelism under the real mpirun: a small language model whose embedding and linear
layers are replaced by ``smp.nn``'s distributed modules, trained 10 steps, must end with the
loss and the gathered weights of the same model trained in one process on the same global
batches (loss relative 1e-5, weights atol 1e-5): TP 2 alone (plain ``loss.backward()``, as
SMP allows without pipeline), TP 2 with a prescaled batch through ``smp.step``, TP 4 with
uneven splits, TP 2 x PP 2 and TP 2 x DP 2 on 2 simulated hosts. Each rank also checks the
model's tensor-parallel view (which parameters are distributed, which reduce over which
group), the full ``state_dict`` under the plain module's names, and that a full state dict
loaded into the wrapped model (before partitioning where there is a pipeline) fills the
shards.

This file is also the worker: ``python test_modelparallel_tensor_parallel.py worker``.
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
VOCAB, WIDTH, SEQ, STEPS = 30, 10, 5, 10


def build_model(seed):
    import torch
    from torch import nn

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(VOCAB, WIDTH)
            self.up = nn.Linear(WIDTH, 3 * WIDTH)
            self.down = nn.Linear(3 * WIDTH, WIDTH)
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
    smp.init(case["config"])
    if case["mark"] == "context":
        with smp.tensor_parallelism():
            net = build_model(1)
    else:
        net = build_model(1)
        smp.set_tensor_parallelism(net.up)
        smp.set_tensor_parallelism(net.down)
        smp.set_tensor_parallelism(net.head)
    if smp.pp_size() > 1 and not case["config"].get("auto_partition", True):
        smp.set_partition(net.embed, 0)
        smp.set_partition(net.up, 0)
        for name in ("down", "norm", "head"):
            smp.set_partition(getattr(net, name), 1)
    reference = build_model(2)  # other weights: the wrapped model gets them by load_state_dict
    model = smp.DistributedModel(net)
    check_view(smp, model, case)
    model.load_state_dict(reference.state_dict())
    optimizer = smp.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.5))
    ref_optimizer = torch.optim.SGD(reference.parameters(), lr=0.1, momentum=0.5)

    @smp.step
    def train_step(model, tokens, targets):
        logits = model(tokens)
        loss = F.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1))
        model.backward(loss)
        return loss

    prescaled = case["config"].get("prescaled_batch", False)
    shards, shard = (smp.rdp_size(), smp.rdp_rank()) if prescaled else (smp.dp_size(), smp.dp_rank())
    batch = case["batch"]
    generator = torch.Generator().manual_seed(7)
    for _ in range(STEPS):
        tokens = torch.randint(0, VOCAB, (batch * shards, SEQ), generator=generator)
        targets = torch.roll(tokens, 1, dims=1)
        mine = slice(shard * batch, (shard + 1) * batch)
        optimizer.zero_grad()
        if case["plain"]:  # SMP's tensor parallelism alone: no smp.step needed
            logits = model(tokens[mine])
            loss = F.cross_entropy(logits.reshape(-1, VOCAB), targets[mine].reshape(-1))
            loss.backward()
            loss = loss.item()
        else:
            loss = train_step(model, tokens[mine], targets[mine]).reduce_mean().item()
        optimizer.step()
        ref_optimizer.zero_grad()
        ref_loss = F.cross_entropy(reference(tokens).reshape(-1, VOCAB), targets.reshape(-1))
        ref_loss.backward()
        ref_optimizer.step()
        group = smp.RDP_GROUP if prescaled else smp.DP_GROUP
        losses = smp.allgather(loss, group)
        global_loss = sum(losses) / len(losses)
        rel = abs(global_loss - ref_loss.item()) / abs(ref_loss.item())
        assert rel <= 1e-5, (global_loss, ref_loss.item())
    full = model.state_dict()
    expected = reference.state_dict()
    assert list(full) == list(expected) or set(full) == set(expected), (list(full), list(expected))
    worst = max((full[k] - v).abs().max().item() for k, v in expected.items())
    assert worst <= 1e-5, worst
    check_replicas_agree(smp, model)
    assert set(model.owner.values()) == set(range(smp.pp_size())), model.owner  # every stage
    smp.barrier()
    print(f"rank {smp.rank()} tp {smp.tp_rank()} pp {smp.pp_rank()} rdp {smp.rdp_rank()}: "
          f"loss {global_loss:.6f} rel {rel:.2e} weights {worst:.2e}: 1 cases ok", flush=True)


def api_worker(folder) -> None:
    """The marking and registering API on 2 ranks: what is replaced, with what arguments,
    and SMP's refusals with its messages; partial checkpoints per tp rank."""
    import pytest
    import smdistributed.modelparallel.torch as smp
    import torch
    from shoal.modelparallel.errors import SMPUsageError, TPModuleRegisterError
    from torch import nn

    smp.init({"tensor_parallel_degree": 2, "ddp": True})
    with pytest.raises(TPModuleRegisterError, match=r"^Can only register a sub-class of "
                       r"smp.nn.DistributedModule. Found Linear.$"):
        smp.tp_register_with_module(nn.Sequential, nn.Linear)
    with pytest.raises(SMPUsageError, match="^Modules of type ReLU are not supported"):
        smp.set_tensor_parallelism(nn.ReLU())

    class Scale(nn.Module):  # a user's module with a distributed form of its own
        def __init__(self, width, factor=2.0):
            super().__init__()
            self.proj = nn.Linear(width, width)
            self.factor = factor

        def forward(self, x, extra=0.0):
            return self.proj(x) * self.factor + extra

    class DistributedScale(smp.nn.DistributedModule):
        def __init__(self, width, factor, offset=0.0):
            super().__init__()
            self.proj = smp.nn.DistributedLinear(width, width)
            self.factor, self.offset = factor, offset

        @classmethod
        def can_distribute(cls, width, factor, offset=0.0):
            return width % 2 == 0

        def forward(self, x, extra):
            return self.proj(x) * self.factor + extra + self.offset

    smp.tp_register_with_module(
        Scale, DistributedScale,
        init_hook=lambda width, factor=2.0: ((width, factor), {}),
        forward_hook=lambda x, extra=0.0: ((x,), {"extra": extra}),
        return_hook=lambda out: out * 1.0)

    class Holder(nn.Module):
        def __init__(self):
            super().__init__()
            with smp.tensor_parallelism(offset=1.0):
                self.scale = Scale(4, factor=3.0)
                self.odd = Scale(3)  # cannot be distributed: kept, with a log line
                with smp.tensor_parallelism(enabled=False):
                    self.kept = nn.Linear(4, 4)  # the innermost context wins
                with smp.tensor_parallelism(vocab_parallel=True):
                    self.embed = nn.Embedding(8, 4)
                self.tied_in, self.tied_out = nn.Embedding(8, 4), nn.Linear(4, 8, bias=False)
                self.tied_out.weight = self.tied_in.weight  # shared: both kept, as in SMP
            self.plain = nn.Linear(4, 4)  # outside any context
            with smp.model_creation(tensor_parallelism=True, dtype=torch.float64):
                self.wide = nn.Linear(4, 4)
            assert torch.get_default_dtype() == torch.float32

    torch.manual_seed(0)
    holder = Holder()
    before = holder.scale.proj.weight.detach().clone()
    model = smp.DistributedModel(holder)
    user = model.get_module()
    assert isinstance(user.scale, DistributedScale) and user.scale.offset == 1.0
    assert user.scale.factor == 3.0
    assert isinstance(user.odd, Scale) and isinstance(user.kept, nn.Linear)
    assert isinstance(user.plain, nn.Linear)
    assert isinstance(user.embed, smp.nn.DistributedEmbedding) and user.embed.vocab_parallel
    assert isinstance(user.wide, smp.nn.DistributedLinear)
    assert type(user.tied_in) is nn.Embedding and type(user.tied_out) is nn.Linear
    assert user.tied_out.weight is user.tied_in.weight
    assert user.wide.weight.dtype == torch.float64
    # The original's weights are the shards' (not a fresh initialisation).
    assert user.scale.proj.weight.equal(before[:, 2 * smp.tp_rank(): 2 * smp.tp_rank() + 2])
    x = torch.ones(2, 4)
    assert user.scale(x, extra=5.0).shape == (2, 4)
    with pytest.raises(SMPUsageError, match="^The model needs to be wrapped with "
                       "smp.DistributedModel after using the set_tensor_parallelism API$"):
        smp.set_tensor_parallelism(user.plain)
    # Partial checkpoints: one file per tp rank, each its shards.
    local = model.local_state_dict()
    smp.save(local, os.path.join(folder, "weights"), partial=True)
    smp.barrier()
    assert os.path.exists(os.path.join(folder, f"weights_0_{smp.tp_rank()}.pt"))
    loaded = smp.load(os.path.join(folder, "weights"), partial=True)
    assert loaded["scale.proj.weight"].equal(user.scale.proj.weight)
    smp.save_checkpoint(folder, "tp", partial=True, model=model)
    with torch.no_grad():
        user.scale.proj.weight.zero_()
    smp.resume_from_checkpoint(folder, "tp")
    assert user.scale.proj.weight.equal(local["scale.proj.weight"])
    full = model.state_dict()
    assert full["scale.proj.weight"].shape == (4, 4) and full["embed.weight"].shape == (8, 4)
    assert "scale.proj.bias" in full and "wide.bias" in full  # from tp_rank 0, on every rank
    smp.barrier()
    print(f"rank {smp.rank()}: api: 1 cases ok", flush=True)


def check_view(smp, model, case):
    """The replaced modules, their shards and the reducers SMP documents."""
    from torch import nn

    tp = smp.tp_size()
    user = model.get_module()
    distributed = {type(m).__name__ for m in model.distributed_modules()}
    wanted = {"DistributedLinear"} | ({"DistributedEmbedding"} if case["mark"] == "context" else set())
    assert distributed == wanted, distributed
    assert isinstance(user.norm, nn.LayerNorm)
    assert isinstance(user.up, smp.nn.DistributedLinear)
    local_in = WIDTH // tp + (1 if smp.tp_rank() < WIDTH % tp else 0)
    assert tuple(user.up.weight.shape) == (3 * WIDTH, local_in)
    assert (user.up.bias is not None) == (smp.tp_rank() == 0)  # the bias lives on tp_rank 0
    assert model.is_distributed_parameter(user.up.weight)
    assert model.is_scaled_batch_parameter(user.up.weight)
    assert not model.is_distributed_parameter(user.norm.weight)
    assert not model.is_scaled_batch_parameter(user.norm.weight)
    scaled = {n for n, _ in model.scaled_batch_reducer_named_parameters()}
    default = {n for n, _ in model.default_reducer_named_parameters()}
    assert not scaled & default
    assert all(not n.startswith(("up.", "down.", "head.")) for n in default), default
    if smp.pp_rank() == 0 or smp.pp_size() == 1:
        assert "up.weight" in scaled, scaled


def check_replicas_agree(smp, model):
    """Replicated parameters are equal over their group: the shards over RDP, the others
    over DP."""
    for name, param in model.local_named_parameters():
        group = smp.RDP_GROUP if model.is_scaled_batch_parameter(param) else smp.DP_GROUP
        values = smp.allgather(param.detach().clone(), group)
        assert all(v.equal(values[0]) for v in values), name


CASES = {
    # name: (ranks, config, per-rank batch, plain backward, marking, hosts)
    "tp2-plain": (2, {"tensor_parallel_degree": 2, "ddp": True}, 3, True, "context", 1),
    "tp2-prescaled-step-mb2": (2, {"tensor_parallel_degree": 2, "ddp": True, "microbatches": 2,
                                   "prescaled_batch": True}, 4, False, "set", 1),
    "tp4-uneven-step": (4, {"tensor_parallel_degree": 4, "ddp": True}, 2, False, "context", 1),
    "tp2-pp2-mb2": (4, {"tensor_parallel_degree": 2, "pipeline_parallel_degree": 2,
                        "microbatches": 2, "ddp": True, "auto_partition": False,
                        "default_partition": 0}, 4, False, "context", 1),
    "tp2-dp2-two-hosts": (4, {"tensor_parallel_degree": 2, "ddp": True}, 2, True, "context", 2),
    # Auto-partition traces the first microbatch on world rank 0 alone: the distributed
    # modules run there without their TP peers.
    "tp2-pp2-mb4-auto": (4, {"tensor_parallel_degree": 2, "pipeline_parallel_degree": 2,
                             "microbatches": 4, "ddp": True}, 4, False, "set", 1),
}


@pytest.mark.parametrize("name", list(CASES))
def test_tensor_parallel_matches_one_process(name):
    ranks, config, batch, plain, mark, hosts = CASES[name]
    case = {"config": config, "batch": batch, "plain": plain, "mark": mark}
    host = (lambda r: f"h{r // (ranks // hosts)}") if hosts > 1 else None
    run_mpi(ranks, {"MP_CASE": json.dumps(case)}, per_rank_host=host, script=HERE, timeout=300)


def test_marking_registering_and_partial_checkpoints(tmp_path):
    run_mpi(2, {"MP_CASE": json.dumps({"api": True}), "TP_FOLDER": str(tmp_path)},
            script=HERE, timeout=300)


if __name__ == "__main__" and sys.argv[1:] == ["worker"]:
    if json.loads(os.environ["MP_CASE"]).get("api"):
        api_worker(os.environ["TP_FOLDER"])
    else:
        worker()
