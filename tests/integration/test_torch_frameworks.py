"""torch's FSDP (``fully_shard``; ``FullyShardedDataParallel`` with FULL_SHARD, SHARD_GRAD_OP
and HYBRID_SHARD on a 2-D DeviceMesh) and ``torch.distributed.pipelining`` schedules (GPipe,
1F1B, Interleaved1F1B) train on backend ``shoal`` to exactly the parameters they reach on gloo.

Exact: every reduction here has two members (FSDP's reduce-scatter and allreduce over pairs,
pipelining's point-to-point), and a sum of two floats does not depend on their order.

This file is also the rank program: ``python test_torch_frameworks.py <backend> <mode>``.
"""

import os
import re
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_torch_backend import free_port, run_ranks  # noqa: E402

pytestmark = [pytest.mark.mpi, pytest.mark.torch, pytest.mark.runtime, pytest.mark.slow]

HERE = os.path.abspath(__file__)


def model():
    import torch
    import torch.nn as nn

    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(),
                         nn.Linear(32, 4))


def batch(seed):
    import torch

    g = torch.Generator().manual_seed(seed)
    return torch.randn(8, 16, generator=g), torch.randn(8, 4, generator=g)


def digest(params):
    return sum(float(p.double().sum()) for p in params)


def loss_fn(output, target):
    return ((output - target) ** 2).mean()


def train(module, params, steps, rank):
    import torch

    opt = torch.optim.SGD(params, lr=0.1)
    for step in range(steps):
        x, y = batch(step * 100 + rank)
        loss_fn(module(x), y).backward()
        opt.step()
        opt.zero_grad()


def run_fully_shard(rank, world):
    import torch.nn as nn
    from torch.distributed.fsdp import fully_shard

    m = model()
    for layer in m:
        if isinstance(layer, nn.Linear):
            fully_shard(layer)
    fully_shard(m)
    train(m, m.parameters(), 5, rank)
    return digest(p.full_tensor() for p in m.parameters())


def run_fsdp1(rank, world, strategy):
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp import ShardingStrategy

    kwargs = {"sharding_strategy": getattr(ShardingStrategy, strategy),
              "device_id": torch.device("cpu"), "use_orig_params": True}
    if strategy == "HYBRID_SHARD":  # replicate across the two hosts, shard inside each
        kwargs["device_mesh"] = init_device_mesh("cpu", (2, world // 2),
                                                 mesh_dim_names=("replicate", "shard"))
    m = FSDP(model(), **kwargs)
    train(m, m.parameters(), 5, rank)
    with FSDP.summon_full_params(m):
        return digest(m.parameters())


def run_pipeline(rank, world, schedule):
    import torch
    import torch.distributed.pipelining as pp
    import torch.nn as nn

    layers = list(model())
    if schedule == "Interleaved1F1B":  # 4 stages, 2 per rank
        chunks = [nn.Sequential(layers[0]), nn.Sequential(*layers[1:3]), nn.Sequential(layers[3]),
                  nn.Sequential(layers[4])]
        mine = [chunks[rank], chunks[rank + 2]]
        stages = [pp.PipelineStage(c, i, 4, torch.device("cpu"))
                  for c, i in zip(mine, (rank, rank + 2))]
        sched = pp.ScheduleInterleaved1F1B(stages, n_microbatches=4, loss_fn=loss_fn)
    else:
        mine = [nn.Sequential(*layers[:3]) if rank == 0 else nn.Sequential(*layers[3:])]
        stage = pp.PipelineStage(mine[0], rank, 2, torch.device("cpu"))
        sched = getattr(pp, f"Schedule{schedule}")(stage, n_microbatches=4, loss_fn=loss_fn)
    params = [p for c in mine for p in c.parameters()]
    opt = torch.optim.SGD(params, lr=0.1)
    for step in range(3):
        x, y = batch(step)
        sched.step(x) if rank == 0 else sched.step(target=y)
        opt.step()
        opt.zero_grad()
    return digest(params)


def main(backend, mode):
    import shoal.dataparallel.torch  # noqa: F401 - registers the backend
    import torch.distributed as dist

    rank, world = int(os.environ["OMPI_COMM_WORLD_RANK"]), int(os.environ["OMPI_COMM_WORLD_SIZE"])
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    dist.init_process_group(backend, rank=rank, world_size=world)
    kind, _, variant = mode.partition(":")
    runs = {"fully_shard": lambda: run_fully_shard(rank, world),
            "fsdp1": lambda: run_fsdp1(rank, world, variant),
            "pipeline": lambda: run_pipeline(rank, world, variant)}
    value = runs[kind]()
    dist.destroy_process_group()
    print(f"rank {rank} digest {value!r}", flush=True)
    sys.stderr.flush()
    # What is compared ends here. The interpreter's finalization is not under test, and torch
    # with gloo groups (FSDP's) can abort in it on a loaded machine ("terminate called
    # without an active exception", SIGABRT after the digest was printed: a CI failure).
    os._exit(0)


def digests(backend, mode, ranks):
    env = {"MASTER_PORT": str(free_port())}
    argv = ["bash", "-c", f'SHOAL_HOST=h$((OMPI_COMM_WORLD_RANK / 2)) exec "{sys.executable}" '
                          f'"{HERE}" {backend} {mode}'] if ranks == 4 else [sys.executable, HERE,
                                                                            backend, mode]
    out = run_ranks(ranks, argv, env=env, timeout=600)
    # Ranks' lines may reach mpirun's output unseparated: match the number, not the line.
    found = dict(re.findall(r"rank (\d+) digest (-?\d+\.\d+(?:e[-+]?\d+)?)", out))
    assert len(found) == ranks, out
    return found


@pytest.mark.parametrize("mode, ranks", [
    ("fully_shard", 2),
    ("fsdp1:FULL_SHARD", 2),
    ("fsdp1:SHARD_GRAD_OP", 2),
    ("fsdp1:HYBRID_SHARD", 4),
    ("pipeline:GPipe", 2),
    ("pipeline:1F1B", 2),
    ("pipeline:Interleaved1F1B", 2),
])
def test_trains_to_the_parameters_gloo_reaches(mode, ranks):
    shoal = digests("shoal", mode, ranks)
    assert shoal == digests("gloo", mode, ranks)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
