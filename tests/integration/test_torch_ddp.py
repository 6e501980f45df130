"""Training on Shoal under the real mpirun: torch's DDP on backend ``shoal`` ends where it
ends on gloo; the module API with Shoal's DDP wrapper (and no_sync) trains the same model to
the same parameters; an unchanged smdistributed-style script runs, also across two
simulated hosts.

This file is also the rank program: ``python test_torch_ddp.py <mode>`` runs one rank.
"""

import os
import sys
import textwrap

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_torch_backend import free_port, mpirun, run_ranks, setup_env_like_shoal_rank  # noqa: E402

pytestmark = [pytest.mark.mpi, pytest.mark.torch, pytest.mark.runtime, pytest.mark.slow]

HERE = os.path.abspath(__file__)
STEPS = 20


@pytest.mark.parametrize("ranks", [2, 3, 4])
def test_torch_ddp_on_shoal_matches_gloo(ranks):
    out = mpirun(ranks, HERE, "torch-ddp", env={"MASTER_PORT": str(free_port())})
    assert out.count("torch ddp ok") == ranks


def test_module_api_and_wrapper_match_torch_ddp():
    out = mpirun(2, HERE, "wrapper")
    assert out.count("wrapper ok") == 2


SMDDP_SCRIPT = textwrap.dedent(
    """
    import torch
    import torch.nn as nn

    import smdistributed.dataparallel.torch.distributed as dist
    from smdistributed.dataparallel.torch.parallel.distributed import DistributedDataParallel as DDP

    dist.init_process_group()

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1 = nn.Linear(20, 32)
            self.fc2 = nn.Linear(32, 3)

        def forward(self, x):
            return self.fc2(torch.relu(self.fc1(x)))

    def main():
        torch.manual_seed(dist.get_rank())  # different replicas: DDP must broadcast rank 0's
        batch_size = max(64 // dist.get_world_size(), 1)
        model = DDP(Net())
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01 * dist.get_world_size())
        data = torch.randn(batch_size * 10, 20)
        target = torch.randint(0, 3, (batch_size * 10,))
        for step in range(10):
            x = data[step * batch_size:(step + 1) * batch_size]
            y = target[step * batch_size:(step + 1) * batch_size]
            optimizer.zero_grad()
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()
        flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
        copies = [torch.empty_like(flat) for _ in range(dist.get_world_size())]
        dist.all_gather(copies, flat)
        assert all(torch.equal(c, flat) for c in copies), "replicas diverged"
        print(f"rank {dist.get_rank()} local {dist.get_local_rank()}/{dist.get_local_size()} "
              f"world {dist.get_world_size()} loss {loss.item():.4f}", flush=True)
        if dist.get_rank() == 0:
            print("smddp script ok", flush=True)

    if __name__ == "__main__":
        main()
    """
)


def test_unchanged_smdistributed_script_runs(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(SMDDP_SCRIPT)
    out = mpirun(2, str(script))
    assert "smddp script ok" in out
    assert "local 1/2 world 2" in out


def test_unchanged_smdistributed_script_across_simulated_hosts(tmp_path):
    """Four ranks as two hosts of two (SHOAL_HOST per rank): the local view comes from
    the core's grouping, and the inter-host path carries the gradients."""
    script = tmp_path / "train.py"
    script.write_text(SMDDP_SCRIPT)
    wrapper = tmp_path / "as_host.sh"
    wrapper.write_text(
        'export SHOAL_HOST="algo-$((OMPI_COMM_WORLD_RANK / 2 + 1))"\n'
        f'exec "{sys.executable}" "{script}"\n'
    )
    command_env = {"SHOAL_JOB_ID": f"ddp-hosts-{os.getpid()}"}
    out = run_ranks(4, ["bash", str(wrapper)], env=command_env)
    assert "smddp script ok" in out
    assert out.count("local 0/2 world 4") == 2
    assert out.count("local 1/2 world 4") == 2


SMDDP_BACKEND_SCRIPT = textwrap.dedent(
    """
    import os

    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    import smdistributed.dataparallel.torch.torch_smddp  # noqa: F401

    dist.init_process_group(backend="smddp")
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.manual_seed(dist.get_rank())
    model = DDP(torch.nn.Linear(10, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(5):
        optimizer.zero_grad()
        model(torch.randn(4, 10)).pow(2).mean().backward()
        optimizer.step()
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    copies = [torch.empty_like(flat) for _ in range(dist.get_world_size())]
    dist.all_gather(copies, flat)
    assert all(torch.equal(c, flat) for c in copies), "replicas diverged"
    print(f"rank {dist.get_rank()} local {local_rank} backend {dist.get_backend()}: smddp backend ok")
    """
)


@pytest.mark.parametrize("script_text", [SMDDP_SCRIPT, SMDDP_BACKEND_SCRIPT], ids=["module-api", "backend"])
def test_unchanged_scripts_under_shoal_rank(tmp_path, script_text):
    """The launcher's per-rank wrapper sets the rank environment (MASTER_PORT included)."""
    import shutil

    script = tmp_path / "train.py"
    script.write_text(script_text)
    shoal_rank = shutil.which("shoal-rank", path=os.path.dirname(sys.executable))
    assert shoal_rank, "the shoal-rank console script is not installed"
    out = run_ranks(2, [shoal_rank, sys.executable, str(script)],
                    env={"SHOAL_MASTER_PORT": str(free_port())})
    assert "smddp script ok" in out or out.count("smddp backend ok") == 2


# ---- rank program ---------------------------------------------------------------------


def make_model():
    import torch

    torch.manual_seed(1234)
    return torch.nn.Sequential(
        torch.nn.Linear(32, 128),
        torch.nn.ReLU(),
        torch.nn.Linear(128, 128),
        torch.nn.ReLU(),
        torch.nn.Linear(128, 10),
    )


def train(wrapped, model, rank, accumulate=1, no_sync=None):
    """SGD with momentum for STEPS steps on rank-specific data; the final flat parameters."""
    import torch

    optimizer = torch.optim.SGD(wrapped.parameters(), lr=0.05, momentum=0.9)
    generator = torch.Generator().manual_seed(100 + rank)
    for _ in range(STEPS):
        optimizer.zero_grad()
        for micro in range(accumulate):
            x = torch.randn(16, 32, generator=generator)
            y = torch.randint(0, 10, (16,), generator=generator)
            loss = torch.nn.functional.cross_entropy(wrapped(x), y)
            if micro < accumulate - 1:
                with no_sync():
                    loss.backward()
            else:
                loss.backward()
        optimizer.step()
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def perturbed_model(rank):
    """Rank-dependent initial weights: construction must broadcast rank 0's."""
    import torch

    model = make_model()
    with torch.no_grad():
        for param in model.parameters():
            param.add_(0.01 * rank)
    return model


def main_torch_ddp():
    import shoal.dataparallel.torch  # noqa: F401 - registers the backend
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    setup_env_like_shoal_rank()
    dist.init_process_group(backend="shoal")
    gloo = dist.new_group(backend="gloo")
    rank = dist.get_rank()
    results, views = {}, {}
    for name, group, options in (
        ("shoal", None, {}),
        ("shoal-copies", None, {"gradient_as_bucket_view": False}),
        ("gloo", gloo, {}),
    ):
        model = perturbed_model(rank)
        wrapped = DDP(model, process_group=group, bucket_cap_mb=0.1, **options)
        results[name] = train(wrapped, model, rank)
        views[name] = wrapped.gradient_as_bucket_view
    # On Shoal's groups DDP keeps gradients in its buckets unless told otherwise: the
    # same arithmetic as with torch's copies, so the same bits.
    assert views == {"shoal": True, "shoal-copies": False, "gloo": False}, views
    assert torch.equal(results["shoal"], results["shoal-copies"])
    torch.testing.assert_close(results["shoal"], results["gloo"], rtol=1e-5, atol=1e-6)
    assert not torch.equal(results["shoal"], make_model_flat()), "the model did not train"
    # With a comm hook chained on the backend's futures (as DDP's hooks do).
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    model = perturbed_model(rank)
    wrapped = DDP(model, bucket_cap_mb=0.1)
    wrapped.register_comm_hook(None, default_hooks.allreduce_hook)
    hooked = train(wrapped, model, rank)
    torch.testing.assert_close(hooked, results["gloo"], rtol=1e-5, atol=1e-6)
    check_uneven_inputs_under_join(rank, gloo)
    dist.destroy_process_group()
    print(f"rank {rank}: torch ddp ok", flush=True)


def check_uneven_inputs_under_join(rank, gloo):
    """torch's Join (ranks with fewer batches shadow the others' allreduces through the
    communication hook) ends where it ends on gloo, dividing by the initial world size or
    by the ranks still training."""
    import torch
    from torch.distributed.algorithms.join import Join
    from torch.nn.parallel import DistributedDataParallel as DDP

    for by_world_size in (True, False):
        results = {}
        for name, group in (("shoal", None), ("gloo", gloo)):
            model = perturbed_model(rank)
            wrapped = DDP(model, process_group=group)
            optimizer = torch.optim.SGD(wrapped.parameters(), lr=0.05)
            generator = torch.Generator().manual_seed(rank)
            with Join([wrapped], divide_by_initial_world_size=by_world_size):
                for _ in range(3 + 2 * rank):
                    optimizer.zero_grad()
                    wrapped(torch.randn(8, 32, generator=generator)).square().mean().backward()
                    optimizer.step()
            results[name] = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
        torch.testing.assert_close(results["shoal"], results["gloo"], rtol=1e-5, atol=1e-6)


def make_model_flat():
    import torch

    return torch.cat([p.detach().reshape(-1) for p in make_model().parameters()])


def main_wrapper():
    import smdistributed.dataparallel.torch.distributed as dist
    import torch
    import torch.distributed as torch_dist
    from smdistributed.dataparallel.torch.parallel.distributed import (
        DistributedDataParallel as DDP,
    )
    from torch.nn.parallel import DistributedDataParallel as TorchDDP

    dist.init_process_group()
    rank = dist.get_rank()
    gloo = torch_dist.new_group(backend="gloo")
    for accumulate in (1, 3):
        model = perturbed_model(rank)
        ours = DDP(model, bucket_cap_mb=0.1)
        mine = train(ours, model, rank, accumulate, ours.no_sync)
        model = perturbed_model(rank)
        reference = TorchDDP(model, process_group=gloo)
        theirs = train(reference, model, rank, accumulate, reference.no_sync)
        torch.testing.assert_close(mine, theirs, rtol=1e-5, atol=1e-6)
    print(f"rank {rank}: wrapper ok", flush=True)


if __name__ == "__main__":
    {"torch-ddp": main_torch_ddp, "wrapper": main_wrapper}[sys.argv[1]]()
