"""Data-parallel gradient averaging in the model-parallel runtime (``ddp: True``): buckets
start during the backward, and a model whose parameters are reached a different number of
times from one step to the next still gets exactly the full batch's gradient.

The model applies ``extra`` to a microbatch only when its first value is positive, before
``base``: so ``base``'s gradient arrives before ``extra``'s in each backward, and a replica
that reaches ``extra`` more often than in the step before finds its bucket already started.

Steps (microbatches where ``extra`` runs, replica 0 / replica 1):
1. mb0 / mb0 -- nothing to go by: reduced after the backward;
2. mb0+mb1 / mb0 -- replica 0 starts early, then ``extra`` arrives again: both redo;
3. mb0 / mb0 -- replica 1 starts early (it saw one pass of ``extra``), replica 0 waits for
   a second that never comes (starts at the end): the same allreduces, in the same order;
4. mb0 / mb0 -- both start early.
"""

from __future__ import annotations

import json
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_collectives import MPI_MARKS, run_mpi  # noqa: E402

pytestmark = [*MPI_MARKS, pytest.mark.torch]
HERE = os.path.abspath(__file__)
PATTERN = {1: [(True, False), (True, False)], 2: [(True, True), (True, False)],
           3: [(True, False), (True, False)], 4: [(True, False), (True, False)]}
EXPECTED = {  # step -> (started early on replica 0, on replica 1, redone)
    1: (0, 0, False), 2: (0, 0, True), 3: (0, 1, False), 4: (1, 1, False)}


def batch(step: int, replica: int, torch):
    """A replica's 4 rows (2 microbatches of 2): row 2k's first value says whether
    microbatch k runs ``extra``."""
    generator = torch.Generator().manual_seed(100 * step + replica)
    x = torch.randn(4, 4, generator=generator)
    y = torch.randn(4, 1, generator=generator)
    for mb, runs_extra in enumerate(PATTERN[step][replica]):
        x[2 * mb, 0] = 1.0 if runs_extra else -1.0
    return x, y


def worker() -> None:
    import smdistributed.modelparallel.torch as smp
    import torch
    import torch.nn.functional as F

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.extra = torch.nn.Linear(4, 4)
            self.base = torch.nn.Linear(4, 1)

        def forward(self, x):
            if x[0, 0] > 0:  # data-dependent: a microbatch decides
                x = self.extra(x)
            return self.base(x)

    smp.init({"partitions": 1, "microbatches": 2, "ddp": True})
    torch.manual_seed(0)
    net, reference = Net(), Net()
    reference.load_state_dict(net.state_dict())
    model = smp.DistributedModel(net)

    @smp.step
    def train_step(model, x, y):
        loss = F.mse_loss(model(x), y)
        model.backward(loss)
        return loss

    for step in PATTERN:
        x, y = batch(step, smp.dp_rank(), torch)
        train_step(model, x, y)
        reference.zero_grad()
        # The full batch: each replica's microbatches, the mean of their losses.
        losses = []
        for replica in range(2):
            rx, ry = batch(step, replica, torch)
            for mb in range(2):
                rows = slice(2 * mb, 2 * mb + 2)
                losses.append(F.mse_loss(reference(rx[rows]), ry[rows]))
        torch.stack(losses).mean().backward()
        for name, param in reference.named_parameters():
            mine = dict(net.named_parameters())[name].grad
            assert torch.allclose(mine, param.grad, rtol=1e-5, atol=1e-7), (step, name)
        model.zero_grad(set_to_none=True)
    smp.barrier()
    print(f"rank {smp.rank()}: gradients equal the full batch's: 1 cases ok", flush=True)


def test_gradients_start_early_and_a_changed_model_is_redone(tmp_path):
    run_mpi(2, {"SHOAL_MP_TIMELINE": str(tmp_path)}, script=HERE, timeout=300)
    for rank in range(2):
        events = json.loads((tmp_path / f"timeline-rank{rank}.json").read_text())["traceEvents"]
        waits = [e["args"] for e in events if e["name"] == "allreduce wait"]
        got = [(w["started_early"], w["redone"]) for w in waits]
        want = [(EXPECTED[s][rank], EXPECTED[s][2]) for s in PATTERN]
        assert got == want, (rank, got)


if __name__ == "__main__" and sys.argv[1:] == ["worker"]:
    worker()
