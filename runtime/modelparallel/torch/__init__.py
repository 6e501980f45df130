"""``smdistributed.modelparallel.torch`` on Shoal: SMP v1's PyTorch API.

    import smdistributed.modelparallel.torch as smp   # or shoal.modelparallel.torch
    smp.init()
    model = smp.DistributedModel(net)
    optimizer = smp.DistributedOptimizer(torch.optim.Adam(model.parameters()))

    @smp.step
    def train_step(model, x, y):
        loss = F.cross_entropy(model(x), y)
        model.backward(loss)
        return loss

    loss = train_step(model, x, y).reduce_mean()
    optimizer.step()

Under mpirun with ``SM_HP_MP_PARAMETERS`` set (a SageMaker job), importing this package
initializes it, as SMP does; ``SMP_MANUAL_INIT=1`` leaves that to the script.
"""

from __future__ import annotations

import os

from shoal.modelparallel import __version__
from shoal.modelparallel.topology import CommGroup, RankType
from shoal.modelparallel.torch import amp, nn, patches, state
from shoal.modelparallel.torch.activations import set_activation_checkpointing
from shoal.modelparallel.torch.checkpoint import load, resume_from_checkpoint, save, save_checkpoint
from shoal.modelparallel.torch.comm import (
    allgather,
    barrier,
    broadcast,
    dp_barrier,
    gather,
    mp_barrier,
    pp_barrier,
    rdp_barrier,
    recv_from,
    send,
    tp_barrier,
)
from shoal.modelparallel.torch.delayed import delay_param_initialization
from shoal.modelparallel.torch.microbatch import StepOutput
from shoal.modelparallel.torch.model import DistributedModel
from shoal.modelparallel.torch.optimizer import DistributedOptimizer
from shoal.modelparallel.torch.placement import partition, set_partition
from shoal.modelparallel.torch.stepping import step
from shoal.modelparallel.torch.tensorparallel.registry import (
    model_creation,
    set_tensor_parallelism,
    tensor_parallelism,
    tp_register,
    tp_register_with_module,
)

WORLD, PP_GROUP, TP_GROUP, RDP_GROUP, DP_GROUP, MP_GROUP = (
    CommGroup.WORLD, CommGroup.PP_GROUP, CommGroup.TP_GROUP, CommGroup.RDP_GROUP,
    CommGroup.DP_GROUP, CommGroup.MP_GROUP)


def init(config: dict | None = None) -> None:
    """Reads the configuration (``SM_HP_MP_PARAMETERS`` over ``config``) and starts."""
    state.init(config)


def is_initialized() -> bool:
    return state.current() is not None


def is_tracing() -> bool:
    st = state.current()
    return bool(st and st.tracing)


def num_microbatches() -> int:
    return state.require().cfg.microbatches


def _rank(attribute: str):
    def get() -> int:
        return getattr(state.require().topology, attribute)
    get.__name__ = attribute
    get.__doc__ = f"This process's {attribute.replace('_', ' ')}."
    return get


rank, size, local_rank, local_size = (_rank(a) for a in ("rank", "size", "local_rank", "local_size"))
dp_rank, dp_size, pp_rank, pp_size = (_rank(a) for a in ("dp_rank", "dp_size", "pp_rank", "pp_size"))
mp_rank, mp_size, tp_rank, tp_size = (_rank(a) for a in ("mp_rank", "mp_size", "tp_rank", "tp_size"))
rdp_rank, rdp_size = (_rank(a) for a in ("rdp_rank", "rdp_size"))


def _members(group: CommGroup):
    def get() -> list[int]:
        return list(state.require().members(group))
    return get


get_world_group, get_pp_group, get_tp_group = (_members(g) for g in (WORLD, PP_GROUP, TP_GROUP))
get_rdp_group, get_dp_group, get_mp_group = (_members(g) for g in (RDP_GROUP, DP_GROUP, MP_GROUP))


def _process_group(group: CommGroup, needs_ddp: bool = True):
    def get():
        return state.require().torch_group(group)
    return get


get_world_process_group, get_pp_process_group = _process_group(WORLD), _process_group(PP_GROUP)
get_tp_process_group, get_rdp_process_group = _process_group(TP_GROUP), _process_group(RDP_GROUP)
get_dp_process_group, get_mp_process_group = _process_group(DP_GROUP), _process_group(MP_GROUP)


# The public API, as SMP names it (the imports above are re-exports).
__all__ = [
    "__version__", "CommGroup", "RankType", "amp", "state",
    "load", "resume_from_checkpoint", "save", "save_checkpoint",
    "allgather", "barrier", "broadcast", "gather", "recv_from", "send",
    "dp_barrier", "mp_barrier", "pp_barrier", "rdp_barrier", "tp_barrier",
    "StepOutput", "DistributedModel", "DistributedOptimizer", "partition", "set_partition", "step",
    "model_creation", "set_tensor_parallelism", "tensor_parallelism", "tp_register",
    "tp_register_with_module", "nn", "set_activation_checkpointing", "patches",
    "delay_param_initialization",
    "WORLD", "PP_GROUP", "TP_GROUP", "RDP_GROUP", "DP_GROUP", "MP_GROUP",
    "init", "is_initialized", "is_tracing", "num_microbatches",
    "rank", "size", "local_rank", "local_size", "dp_rank", "dp_size", "pp_rank", "pp_size",
    "mp_rank", "mp_size", "tp_rank", "tp_size", "rdp_rank", "rdp_size",
    "get_world_group", "get_pp_group", "get_tp_group", "get_rdp_group", "get_dp_group",
    "get_mp_group", "get_world_process_group", "get_pp_process_group", "get_tp_process_group",
    "get_rdp_process_group", "get_dp_process_group", "get_mp_process_group",
]


if os.environ.get("SM_HP_MP_PARAMETERS") and os.environ.get("OMPI_COMM_WORLD_RANK") \
        and os.environ.get("SMP_MANUAL_INIT") != "1":
    init()
