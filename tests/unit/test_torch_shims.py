"""The smdistributed compatibility names resolve to Shoal's modules, and importing the
packages registers the torch.distributed backend."""

import importlib

import torch.distributed as torch_dist


def test_module_api_is_shoals():
    legacy = importlib.import_module("smdistributed.dataparallel.torch.distributed")
    shoal = importlib.import_module("shoal.dataparallel.torch.distributed")
    assert legacy is shoal


def test_ddp_wrapper_is_shoals_under_both_names():
    from shoal.dataparallel.torch.parallel.distributed import DistributedDataParallel
    from smdistributed.dataparallel.torch.parallel import DistributedDataParallel as short
    from smdistributed.dataparallel.torch.parallel.distributed import (
        DistributedDataParallel as long,
    )

    assert long is DistributedDataParallel
    assert short is DistributedDataParallel


def test_importing_registers_shoal_and_smddp():
    importlib.import_module("smdistributed.dataparallel.torch.torch_smddp")
    for name in ("shoal", "smddp"):
        assert name.upper() in torch_dist.Backend._plugins
        assert torch_dist.Backend.backend_capability[name] == ["cpu"]
        assert torch_dist.Backend(name) == name
    # Registering twice is harmless.
    from shoal.dataparallel.torch import register_backend

    register_backend()
    assert torch_dist.Backend.backend_list.count("shoal") == 1


def test_reduce_ops_of_the_closed_library():
    from smdistributed.dataparallel.torch.distributed import ReduceOp

    assert ReduceOp.AVERAGE == torch_dist.ReduceOp.AVG
    for name in ("SUM", "MIN", "MAX"):
        assert getattr(ReduceOp, name) == getattr(torch_dist.ReduceOp, name)
