"""The model-parallel parameter table shared by the SDK and the runtime: entries, defaults."""

from __future__ import annotations

import ast
import math
import subprocess
import sys

import pytest
from shoal import smp as sdk_smp
from shoal.modelparallel import parameters
from shoal.modelparallel.parameters import (
    ALIASES,
    PLACEMENT_ALIASES,
    PLACEMENT_ORDERS,
    TENSOR_PLACEMENTS,
    V1_PARAMETERS,
    V2_PARAMETERS,
    Param,
    parameter_table,
    v1_defaults,
    v1_parameters,
)

SMP_V1_PYTORCH_DEFAULTS = {
    "pipeline_parallel_degree": 1,
    "microbatches": 1,
    "pipeline": "interleaved",
    "optimize": "speed",
    "placement_strategy": "cluster",
    "auto_partition": True,
    "default_partition": None,
    "load_partition": False,
    "partition_file": None,
    "deterministic_server": False,
    "memory_weight": 0.8,
    "ddp": False,
    "ddp_port": None,
    "ddp_dist_backend": "auto",
    "active_microbatches": None,
    "offload_activations": False,
    "activation_loading_horizon": 4,
    "tensor_parallel_degree": 1,
    "fp16": False,
    "bf16": False,
    "fp16_params": False,
    "shard_optimizer_state": False,
    "prescaled_batch": False,
    "tensor_parallel_seed": 0,  # SMP's config table; not in its documentation
    "skip_tracing": False,
    "delayed_parameter_initialization": False,
    "static_mode": False,
    "fast_mode": False,
    "predefined_hooks": True,
    "sharded_data_parallel_degree": 1,
    "sdp_reduce_bucket_size": 500_000_000,
    "sdp_param_persistence_threshold": 1_000_000,
    "sdp_max_live_parameters": 1_000_000_000,
    "sdp_hierarchical_allgather": True,
    "sdp_gradient_clipping": 1.0,
}


def test_pytorch_defaults_are_smp_v1s():
    assert v1_defaults("pytorch") == SMP_V1_PYTORCH_DEFAULTS


def test_tensorflow_has_partitions_and_its_own_parameters():
    tf = v1_defaults("tensorflow")
    assert tf["partitions"] == 1 and tf["contiguous"] is True and tf["horovod"] is False
    assert "pipeline_parallel_degree" not in tf and "ddp" not in tf


def test_pytorch_table_leaves_out_tensorflow_only_parameters():
    table = v1_parameters("pytorch")
    assert "contiguous" not in table and "horovod" not in table
    assert "partitions" in table  # the alias is accepted on PyTorch too
    assert ALIASES == {"partitions": "pipeline_parallel_degree"}


@pytest.mark.parametrize("key", sorted(V1_PARAMETERS))
def test_every_default_is_allowed_by_its_own_entry(key):
    param = V1_PARAMETERS[key]
    value = param.default
    if value is None:  # unset, or derived from other parameters
        assert key in ("default_partition", "partition_file", "ddp_port", "active_microbatches")
        return
    kinds = {
        "int": int, "count": int, "float": float, "bool": bool, "str": str, "choice": str,
    }  # fmt: skip
    assert type(value) is kinds[param.kind]
    if param.choices:
        assert value in param.choices
    if param.minimum is not None:
        assert value >= param.minimum
    if param.maximum is not None:
        assert value <= param.maximum
    assert not isinstance(value, float) or math.isfinite(value)


def test_placements():
    assert sorted(TENSOR_PLACEMENTS) == ["DPT", "DTP", "PDT", "PTD", "TDP", "TPD"]
    assert PLACEMENT_ALIASES == ("cluster", "spread")
    assert PLACEMENT_ORDERS == {"cluster": "DPT", "spread": "TPD"}
    assert V1_PARAMETERS["placement_strategy"].default in PLACEMENT_ALIASES


def test_tables_are_read_only():
    assert parameter_table() is V1_PARAMETERS
    assert parameter_table(torchrun=True) is V2_PARAMETERS
    for table in (V1_PARAMETERS, V2_PARAMETERS, v1_parameters("pytorch"), ALIASES):
        with pytest.raises(TypeError):
            table["microbatches"] = Param("int")


def test_the_sdk_reads_this_table():
    assert sdk_smp.Param is Param
    assert sdk_smp._V1_PARAMETERS is V1_PARAMETERS
    assert sdk_smp._V2_PARAMETERS is V2_PARAMETERS
    assert sdk_smp._TENSOR_PLACEMENTS is TENSOR_PLACEMENTS
    assert sdk_smp._PLACEMENT_ALIASES is PLACEMENT_ALIASES
    assert sdk_smp.parameter_table is parameter_table


def test_v2_table_is_apart_from_v1():
    assert "hybrid_shard_degree" in V2_PARAMETERS and "hybrid_shard_degree" not in V1_PARAMETERS
    assert "microbatches" not in V2_PARAMETERS


def test_runtime_modules_import_nothing_from_the_sdk():
    code = (
        "import sys\n"
        "import shoal.modelparallel.parameters, shoal.modelparallel.config, "
        "shoal.modelparallel.topology\n"
        "print(sorted(m for m in sys.modules if m == 'shoal' or m.startswith('shoal.')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    loaded = ast.literal_eval(out.stdout)
    outside = [m for m in loaded if m != "shoal" and not m.startswith("shoal.modelparallel")]
    assert outside == [], outside
    assert parameters.__name__ in loaded
