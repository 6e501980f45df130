"""The model-parallel library's parameters: one table, read by the SDK and by the runtime.

``sdk/shoal/smp.py`` checks a job's ``parameters`` against it before the job starts;
``shoal.modelparallel.config`` parses the same parameters again inside the training
process, at ``smp.init``. Both sides read this one table, so they cannot drift apart.

Two tables exist: the MPI-launched library (SMP v1, ``smdistributed.modelparallel``) and
the torchrun-launched one (SMP v2, ``torch.sagemaker``). Each entry says what a parameter
accepts (kind, bounds, choices, frameworks) and, for v1, the value SMP v1 uses when the
parameter is not given.

This module is plain data. It imports nothing from the SDK (the runtime never imports
upward) and nothing from any framework.
"""

from __future__ import annotations

from collections.abc import Mapping
from itertools import permutations
from types import MappingProxyType
from typing import Any

import attrs

PYTORCH = ("pytorch",)
TENSORFLOW = ("tensorflow",)
BOTH = ("pytorch", "tensorflow")

# The placement strategies: the two named ones, and every ordering of the letters
# D (reduced data parallelism), P (pipeline) and T (tensor parallelism).
TENSOR_PLACEMENTS: tuple[str, ...] = tuple("".join(p) for p in permutations("DPT"))
PLACEMENT_ALIASES: tuple[str, ...] = ("cluster", "spread")
PLACEMENT_ORDERS: Mapping[str, str] = MappingProxyType({"cluster": "DPT", "spread": "TPD"})

# SMP v1 takes ``partitions`` as another name for ``pipeline_parallel_degree``.
ALIASES: Mapping[str, str] = MappingProxyType({"partitions": "pipeline_parallel_degree"})


@attrs.frozen
class Param:
    """What one parameter accepts: its kind, bounds, allowed values and frameworks.

    ``default`` is the value the library uses when the parameter is not given (None where
    the library's default is "unset" or depends on other parameters; see the table).
    """

    kind: str  # "int" | "count" (int, or a float such as 5e8 with no fraction) | "float" | "bool" | "str" | "choice"
    minimum: float | None = None
    maximum: float | None = None
    choices: tuple[str, ...] = ()
    frameworks: tuple[str, ...] = BOTH
    default: Any = None


# Defaults are SMP v1's PyTorch ones, where the library's code and its documentation
# disagree the code wins (``optimize`` "speed", ``memory_weight`` 0.8, ``default_partition``
# unset).
V1_PARAMETERS: Mapping[str, Param] = MappingProxyType({
    # Common to TensorFlow and PyTorch.
    "partitions": Param("int", minimum=1, default=1),
    "microbatches": Param("int", minimum=1, default=1),
    "pipeline": Param(
        "choice", choices=("simple", "interleaved", "_only_forward"), default="interleaved"
    ),
    "optimize": Param("choice", choices=("speed", "memory"), default="speed"),
    "placement_strategy": Param("str", default="cluster"),  # one of the placements above
    "auto_partition": Param("bool", default=True),
    "default_partition": Param("int", minimum=0, default=None),  # unset; < partitions
    "load_partition": Param("bool", default=False),
    "partition_file": Param("str", default=None),
    "deterministic_server": Param("bool", default=False),
    # TensorFlow only.
    "contiguous": Param("bool", frameworks=TENSORFLOW, default=True),
    "horovod": Param("bool", frameworks=TENSORFLOW, default=False),
    # PyTorch only.
    "pipeline_parallel_degree": Param("int", minimum=1, frameworks=PYTORCH, default=1),
    "memory_weight": Param(
        "float", minimum=0.0, maximum=1.0, frameworks=PYTORCH, default=0.8
    ),
    "ddp": Param("bool", frameworks=PYTORCH, default=False),
    # None: the launcher's MASTER_PORT, as in SMP.
    "ddp_port": Param("int", minimum=0, maximum=65535, frameworks=PYTORCH, default=None),
    # "auto" since SMP 1.13 (SMDDP collectives where possible, else NCCL).
    "ddp_dist_backend": Param(
        "choice", choices=("auto", "nccl", "gloo"), frameworks=PYTORCH, default="auto"
    ),
    # None: min(pipeline_parallel_degree + 2, microbatches), resolved by the runtime.
    "active_microbatches": Param("int", minimum=1, frameworks=PYTORCH, default=None),
    "offload_activations": Param("bool", frameworks=PYTORCH, default=False),
    "activation_loading_horizon": Param("int", minimum=1, frameworks=PYTORCH, default=4),
    "tensor_parallel_degree": Param("int", minimum=1, frameworks=PYTORCH, default=1),
    "fp16": Param("bool", frameworks=PYTORCH, default=False),
    "bf16": Param("bool", frameworks=PYTORCH, default=False),
    "fp16_params": Param("bool", frameworks=PYTORCH, default=False),
    "shard_optimizer_state": Param("bool", frameworks=PYTORCH, default=False),
    "prescaled_batch": Param("bool", frameworks=PYTORCH, default=False),
    # Seeds the RNG of dropout inside distributed modules when the TP group shares a batch.
    "tensor_parallel_seed": Param("int", minimum=0, frameworks=PYTORCH, default=0),
    "skip_tracing": Param("bool", frameworks=PYTORCH, default=False),
    "delayed_parameter_initialization": Param("bool", frameworks=PYTORCH, default=False),
    "static_mode": Param("bool", frameworks=PYTORCH, default=False),
    "fast_mode": Param("bool", frameworks=PYTORCH, default=False),
    "predefined_hooks": Param("bool", frameworks=PYTORCH, default=True),
    "sharded_data_parallel_degree": Param("int", minimum=1, frameworks=PYTORCH, default=1),
    "sdp_reduce_bucket_size": Param("count", minimum=1, frameworks=PYTORCH, default=500_000_000),
    "sdp_param_persistence_threshold": Param(
        "count", minimum=0, frameworks=PYTORCH, default=1_000_000
    ),
    "sdp_max_live_parameters": Param(
        "count", minimum=1, frameworks=PYTORCH, default=1_000_000_000
    ),
    "sdp_hierarchical_allgather": Param("bool", frameworks=PYTORCH, default=True),
    "sdp_gradient_clipping": Param("float", minimum=0.0, frameworks=PYTORCH, default=1.0),
})  # fmt: skip

# The torchrun-launched library (PyTorch >= 2.0 with torch_distributed). Its defaults are
# not recorded: nothing in Shoal runs that library's parameters.
V2_PARAMETERS: Mapping[str, Param] = MappingProxyType({
    "hybrid_shard_degree": Param("int", minimum=0, frameworks=PYTORCH),
    "sm_activation_offloading": Param("bool", frameworks=PYTORCH),
    "activation_loading_horizon": Param("int", minimum=1, frameworks=PYTORCH),
    "fsdp_cache_flush_warnings": Param("bool", frameworks=PYTORCH),
    "allow_empty_shards": Param("bool", frameworks=PYTORCH),
    "tensor_parallel_degree": Param("int", minimum=1, frameworks=PYTORCH),
    "context_parallel_degree": Param("int", minimum=1, frameworks=PYTORCH),
    "expert_parallel_degree": Param("int", minimum=1, frameworks=PYTORCH),
    "random_seed": Param("int", minimum=0, frameworks=PYTORCH),
})  # fmt: skip


def parameter_table(torchrun: bool = False) -> Mapping[str, Param]:
    """The accepted parameters: the MPI-launched library's, or with ``torchrun`` the v2 one's."""
    return V2_PARAMETERS if torchrun else V1_PARAMETERS


def v1_parameters(framework: str) -> Mapping[str, Param]:
    """The v1 parameters ``framework`` ("pytorch" or "tensorflow") takes, in table order."""
    return MappingProxyType(
        {key: p for key, p in V1_PARAMETERS.items() if framework in p.frameworks}
    )


def v1_defaults(framework: str = "pytorch") -> dict[str, Any]:
    """Every v1 parameter of ``framework`` with its default.

    An alias is left out where its parameter exists too (PyTorch's ``partitions``);
    TensorFlow has ``partitions`` alone.
    """
    table = v1_parameters(framework)
    return {key: p.default for key, p in table.items() if ALIASES.get(key) not in table}
