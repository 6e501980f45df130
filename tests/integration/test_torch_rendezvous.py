"""The shoal backend starts from torch's store whatever the init method: ranks spawned by
torch.multiprocessing (no mpirun, no launcher) with ``env://``, ``tcp://`` and ``file://``,
and a world re-created after ``destroy_process_group`` on a fresh store. No port is chosen
by one process and bound later by another, so nothing collides with torch's own store.
"""

import os
import sys

import pytest
from shoal.launcher.ports import free_port

pytestmark = [pytest.mark.torch, pytest.mark.runtime, pytest.mark.slow]


def rank_main(rank, world, init_method, results):
    import shoal.dataparallel.torch  # noqa: F401 - registers the backend
    import torch
    import torch.distributed as dist

    for round_ in range(2):  # the second round re-creates the world on a new store
        method = init_method if round_ == 0 or not init_method.startswith("file://") else (
            init_method + "-again")
        if method == "env://":
            os.environ["MASTER_PORT"] = os.environ[f"PORT_{round_}"]
        dist.init_process_group("shoal", init_method=method, rank=rank, world_size=world)
        tensor = torch.full((1000,), float(rank + 1))
        dist.all_reduce(tensor)
        pair = dist.new_group([0, world - 1])
        if rank in (0, world - 1):
            dist.all_reduce(tensor, group=pair)
        dist.barrier()
        dist.destroy_process_group()
        results.put((rank, round_, float(tensor[0])))


@pytest.mark.parametrize("method", ["env", "tcp", "file"])
def test_spawned_ranks_start_from_the_store(method, tmp_path):
    import torch.multiprocessing as mp

    world = 3
    ports = [free_port(), free_port()]
    os.environ.update(MASTER_ADDR="127.0.0.1", PORT_0=str(ports[0]), PORT_1=str(ports[1]))
    # tcp:// names its port: round 2 starts a new store on the same port.
    init_method = {"env": "env://", "tcp": f"tcp://127.0.0.1:{ports[0]}",
                   "file": f"file://{tmp_path}/store"}[method]
    ctx = mp.get_context("spawn")
    results = ctx.SimpleQueue()
    mp.start_processes(rank_main, args=(world, init_method, results), nprocs=world,
                       start_method="spawn", join=True)
    got = sorted(results.get() for _ in range(2 * world))
    total = world * (world + 1) / 2
    for rank, round_, value in got:
        expected = total * 2 if rank in (0, world - 1) else total
        assert value == expected, (rank, round_, value)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
