"""Delayed parameter initialization and activation offloading under the real mpirun, on 2
ranks with pipeline 2 and 2 microbatches. The model is created inside ``smp.model_creation``
with ``delayed_parameter_initialization: True``: every parameter is on ``meta`` until the
first step, when each rank materialises exactly the parameters of the modules it owns (the
others' storage stays empty). Loaded with a reference model's weights, 3 steps of training
match the same model trained in one process (loss relative 1e-5, weights atol 1e-5). The
blocks are checkpointed; the run is done without and with ``offload_activations`` (horizon
2), which must give exactly the same losses and gradients, the hooks having packed and
unpacked every checkpointed block's inputs. A third run partitions automatically (world
rank 0 traces the whole model, materialised for the trace); a fourth uses tensor parallel 2
alone, where the replaced Linear layers are created anew and the weights loaded after.

This file is also the worker: ``python test_modelparallel_memory_features.py worker``.
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
WIDTH, HIDDEN, STEPS, BLOCKS = 8, 16, 3, 4


def build(seed=None):
    import torch
    from torch import nn

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.inp = nn.Linear(4, WIDTH)
            self.blocks = nn.Sequential(*[
                nn.Sequential(nn.Linear(WIDTH, HIDDEN), nn.Tanh(), nn.Linear(HIDDEN, WIDTH))
                for _ in range(BLOCKS)])
            self.head = nn.Linear(WIDTH, 1)

        def forward(self, x):
            return self.head(self.blocks(self.inp(x)))

    if seed is not None:
        torch.manual_seed(seed)
    return Net()


def worker() -> None:
    import smdistributed.modelparallel.torch as smp
    import torch
    import torch.nn.functional as F
    from shoal.modelparallel.torch import delayed, offload

    case = json.loads(os.environ["MP_CASE"])
    smp.init(case["config"])
    materialised: list[str] = []
    original = delayed.materialise

    def recording(root, owns=lambda _name: True, each=None):
        names = original(root, owns, each)
        materialised.extend(names)
        return names

    delayed.materialise = recording  # model.py calls it through the module
    tp = case["config"].get("tensor_parallel_degree", 1) > 1
    with smp.model_creation(tensor_parallelism=tp):
        net = build()
    assert all(p.is_meta for p in net.parameters())
    if not tp and not case["config"]["auto_partition"]:
        smp.set_partition(net.inp, 0)
        for i, block in enumerate(net.blocks):
            smp.set_partition(block, i * 2 // BLOCKS)
        smp.set_partition(net.head, 1)
    reference = build(seed=2)
    model = smp.DistributedModel(net)
    smp.set_activation_checkpointing(net.blocks, strategy="each")
    model.load_state_dict(reference.state_dict())
    optimizer = smp.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1))
    ref_optimizer = torch.optim.SGD(reference.parameters(), lr=0.1)

    @smp.step
    def train_step(model, x, target):
        loss = F.mse_loss(model(x), target)
        model.backward(loss)
        return loss

    generator = torch.Generator().manual_seed(7)
    record = {"losses": [], "grads": []}
    for step in range(STEPS):
        x = torch.randn(4, 4, generator=generator)
        target = torch.randn(4, 1, generator=generator)
        optimizer.zero_grad()
        loss = train_step(model, x, target).reduce_mean().item()
        if step == 0:
            check_materialised(smp, model, reference, materialised, case)
        record["losses"].append(loss)
        record["grads"].append({n: p.grad.clone() for n, p in model.local_named_parameters()})
        optimizer.step()
        ref_optimizer.zero_grad()
        ref_loss = F.mse_loss(reference(x), target)
        ref_loss.backward()
        ref_optimizer.step()
        rel = abs(loss - ref_loss.item()) / abs(ref_loss.item())
        assert rel <= 1e-5, (step, loss, ref_loss.item())
    full, expected = model.state_dict(), reference.state_dict()
    worst = max((full[k] - v).abs().max().item() for k, v in expected.items())
    assert worst <= 1e-5, worst
    stats = offload.stats
    if case["config"].get("offload_activations"):
        mine = sum(1 for i in range(BLOCKS) if model.owner[f"blocks.{i}"] == smp.pp_rank())
        # Each owned block's input, per microbatch and step, packed and unpacked once.
        assert stats.packed == stats.unpacked == mine * 2 * STEPS, (stats, mine)
        assert stats.moved == 0  # host memory already
    else:
        assert stats.packed == 0, stats
    record["packed"] = stats.packed
    torch.save(record, os.path.join(os.environ["MF_FOLDER"], f"{case['tag']}-{smp.rank()}.pt"))
    smp.barrier()
    print(f"rank {smp.rank()} {case['tag']}: loss {loss:.6f}, {len(materialised)} parameters "
          f"materialised, {stats.packed} offloaded: 1 cases ok", flush=True)


def check_materialised(smp, model, reference, materialised, case):
    import torch

    """This rank materialised its own modules' parameters, and only those."""
    if case["config"].get("tensor_parallel_degree", 1) > 1:
        # Every Linear was replaced by a DistributedLinear created (initialised) anew.
        assert materialised == [], materialised
        assert all(isinstance(m, smp.nn.DistributedLinear) for m in model.get_module().modules()
                   if isinstance(m, torch.nn.Linear) or "Linear" in type(m).__name__)
        assert not any(p.is_meta for p in model.get_module().parameters())
        return
    owned = {n for n, _ in model.local_named_parameters()}
    assert owned and set(materialised) >= owned, (materialised, owned)
    if smp.rank() != 0 or not case["config"]["auto_partition"]:  # rank 0 traced: all
        assert sorted(materialised) == sorted(owned), (materialised, owned)
    shapes = dict(reference.named_parameters())
    for name, param in model.get_module().named_parameters():
        assert not param.is_meta, name
        if name in owned:
            assert param.shape == shapes[name].shape, name
        else:
            assert param.numel() == 0, name


BASE = {"pipeline_parallel_degree": 2, "microbatches": 2, "ddp": True,
        "delayed_parameter_initialization": True, "auto_partition": False,
        "default_partition": 0}
CASES = {
    "plain": BASE,
    "offload": {**BASE, "offload_activations": True, "activation_loading_horizon": 2},
    "auto": {**BASE, "auto_partition": True},
    "tp": {"tensor_parallel_degree": 2, "ddp": True, "delayed_parameter_initialization": True},
}


def test_delayed_initialization_and_offloading(tmp_path):
    import torch

    for tag, config in CASES.items():
        case = {"config": config, "tag": tag}
        run_mpi(2, {"MP_CASE": json.dumps(case), "MF_FOLDER": str(tmp_path)},
                script=HERE, timeout=300)
    for rank in range(2):
        plain = torch.load(tmp_path / f"plain-{rank}.pt")
        offloaded = torch.load(tmp_path / f"offload-{rank}.pt")
        assert offloaded["losses"] == plain["losses"]
        for got, want in zip(offloaded["grads"], plain["grads"]):
            assert got.keys() == want.keys() and got
            assert all(got[k].equal(want[k]) for k in want)
        assert offloaded["packed"] > 0 == plain["packed"]


if __name__ == "__main__" and sys.argv[1:] == ["worker"]:
    worker()
