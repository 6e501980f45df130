"""Model-parallel parameters: types, ranges, allowed values, cross-parameter rules, files."""

from __future__ import annotations

import json
import pathlib
import re

import pytest
from shoal.errors import DistributionError
from shoal.smp import ModelParallelParameters, parameter_table, parse_parameters

from tests.unit.messages import assert_message

W = "distribution['smdistributed']['modelparallel']['parameters']"


def parse(params, framework="pytorch", torchrun=False):
    return parse_parameters(params, where=W, framework=framework, torchrun=torchrun)


def rejects(params, message, framework="pytorch", torchrun=False):
    with pytest.raises(DistributionError) as info:
        parse(params, framework, torchrun)
    text = str(info.value)
    return assert_message(text, message)


# ---------------------------------------------------------------- types


@pytest.mark.parametrize("key,value,kind", [
    ("auto_partition", "yes", "a bool"),
    ("ddp", 1, "a bool"),
    ("offload_activations", None, "a bool"),
    ("partitions", 2.0, "an int"),
    ("microbatches", "4", "an int"),
    ("tensor_parallel_degree", True, "an int"),
    ("memory_weight", "0.5", "a finite number"),
    ("memory_weight", False, "a finite number"),
    ("memory_weight", float("nan"), "a finite number"),
    ("sdp_gradient_clipping", float("inf"), "a finite number"),
    ("sdp_reduce_bucket_size", 5.5e8 + 0.5, "a whole number"),
    ("sdp_max_live_parameters", True, "a whole number"),
    ("partition_file", 3, "a str"),
    ("pipeline", 1, "a str"),
])  # fmt: skip
def test_types(key, value, kind):
    rejects({key: value}, f"{W}[{key!r}] must be {kind} (got {value!r})")


def test_whole_numbers_may_be_written_as_floats():
    params = parse({"sdp_reduce_bucket_size": 5e8, "sdp_param_persistence_threshold": 0})
    assert params.to_dict() == {"sdp_reduce_bucket_size": 5e8, "sdp_param_persistence_threshold": 0}


def test_float_accepts_ints():
    assert parse({"memory_weight": 1}).get("memory_weight") == 1


# ---------------------------------------------------------------- ranges and choices


@pytest.mark.parametrize("key,value,message", [
    ("partitions", 0, "must be >= 1 (got 0)"),
    ("pipeline_parallel_degree", -2, "must be >= 1 (got -2)"),
    ("microbatches", 0, "must be >= 1 (got 0)"),
    ("active_microbatches", 0, "must be >= 1 (got 0)"),
    ("activation_loading_horizon", 0, "must be >= 1 (got 0)"),
    ("tensor_parallel_degree", 0, "must be >= 1 (got 0)"),
    ("sharded_data_parallel_degree", 0, "must be >= 1 (got 0)"),
    ("default_partition", -1, "must be >= 0 (got -1)"),
    ("memory_weight", -0.1, "must be >= 0.0 (got -0.1)"),
    ("memory_weight", 1.5, "must be <= 1.0 (got 1.5)"),
    ("sdp_gradient_clipping", -1.0, "must be >= 0.0 (got -1.0)"),
])  # fmt: skip
def test_ranges(key, value, message):
    rejects({key: value, "ddp": True}, f"{W}[{key!r}] {message}")


def test_ddp_port_range():
    rejects({"ddp": True, "ddp_port": 70000}, f"{W}['ddp_port'] must be <= 65535 (got 70000)")
    rejects({"ddp": True, "ddp_port": -1}, f"{W}['ddp_port'] must be >= 0 (got -1)")


@pytest.mark.parametrize("key,value,allowed", [
    ("pipeline", "fast", ["simple", "interleaved", "_only_forward"]),
    ("optimize", "balanced", ["speed", "memory"]),
    ("ddp_dist_backend", "mpi", ["auto", "nccl", "gloo"]),
])  # fmt: skip
def test_choices(key, value, allowed):
    rejects({key: value, "ddp": True}, f"{W}[{key!r}] must be one of {allowed} (got {value!r})")


def test_choices_accepted():
    for pipeline in ("simple", "interleaved", "_only_forward"):
        assert parse({"pipeline": pipeline}).get("pipeline") == pipeline
    for optimize in ("speed", "memory"):
        assert parse({"optimize": optimize}).get("optimize") == optimize


def test_placement_strategy():
    for value in ("cluster", "spread", "DPT", "TPD", "PDT"):
        assert parse({"placement_strategy": value}).get("placement_strategy") == value
    rejects({"placement_strategy": "DTT"},
            f"{W}['placement_strategy'] must be one of ['cluster', 'spread', 'DPT', 'DTP', "
            "'PDT', 'PTD', 'TDP', 'TPD'] (got 'DTT')")
    rejects({"partitions": 2, "placement_strategy": "DPT"},
            f"{W}['placement_strategy'] must be one of ['cluster', 'spread'] (got 'DPT')",
            framework="tensorflow")


# ---------------------------------------------------------------- cross-parameter rules


def test_partitions_and_pipeline_parallel_degree_are_one_setting():
    rejects({"partitions": 2, "pipeline_parallel_degree": 4},
            f"{W}: 'partitions' (2) and 'pipeline_parallel_degree' (4) are the same setting and "
            "must agree")
    params = parse({"partitions": 4, "pipeline_parallel_degree": 4})
    assert params.pipeline_parallel_degree == 4
    assert parse({"pipeline_parallel_degree": 3}).pipeline_parallel_degree == 3
    assert parse({}).pipeline_parallel_degree == 1


def test_tensorflow_requires_partitions():
    rejects({"microbatches": 2}, f"{W}['partitions'] is required for TensorFlow",
            framework="tensorflow")
    assert parse({"partitions": 2}, framework="tensorflow").get("partitions") == 2


def test_manual_partitioning_needs_default_partition():
    rejects({"partitions": 2, "auto_partition": False},
            f"{W}['default_partition'] is required when 'auto_partition' is False")
    ok = parse({"partitions": 2, "auto_partition": False, "default_partition": 1})
    assert ok.get("default_partition") == 1


def test_default_partition_below_partitions():
    rejects({"partitions": 2, "default_partition": 2},
            f"{W}['default_partition'] must be < the number of partitions (2) (got 2)")
    rejects({"pipeline_parallel_degree": 3, "default_partition": 5},
            f"{W}['default_partition'] must be < the number of partitions (3) (got 5)")
    rejects({"default_partition": 1},
            f"{W}['default_partition'] must be < the number of partitions (1) (got 1)")
    assert parse({"default_partition": 0}).get("default_partition") == 0


def test_ddp_and_horovod_exclusive():
    rejects({"ddp": True, "horovod": True}, f"{W}: 'ddp' and 'horovod' cannot both be True",
            framework=None)
    assert parse({"ddp": True, "horovod": False}, framework=None).get("ddp") is True


def test_ddp_for_pytorch_and_horovod_for_tensorflow():
    rejects({"horovod": True}, f"{W}['horovod'] is a tensorflow parameter; it does not apply to "
            "pytorch")
    rejects({"partitions": 2, "ddp": True},
            f"{W}['ddp'] is a pytorch parameter; it does not apply to tensorflow",
            framework="tensorflow")
    rejects({"partitions": 2, "memory_weight": 0.5},
            f"{W}['memory_weight'] is a pytorch parameter; it does not apply to tensorflow",
            framework="tensorflow")
    assert parse({"partitions": 2, "horovod": True}, framework="tensorflow").get("horovod")


def test_ddp_settings_need_ddp():
    rejects({"ddp_port": 7777}, f"{W}['ddp_port'] needs 'ddp' to be set as well")
    rejects({"ddp_dist_backend": "nccl"}, f"{W}['ddp_dist_backend'] needs 'ddp' to be set as well")
    assert parse({"ddp": True, "ddp_port": 7777, "ddp_dist_backend": "auto"}).get("ddp_port")


def test_fp16_and_bf16_exclusive():
    rejects({"fp16": True, "bf16": True}, f"{W}: 'fp16' and 'bf16' cannot both be True")
    assert parse({"fp16": True, "bf16": False}).get("fp16") is True


def test_tensor_parallelism_needs_ddp():
    rejects({"tensor_parallel_degree": 4},
            f"{W}['ddp'] must be True when 'tensor_parallel_degree' > 1 "
            "(got tensor_parallel_degree=4, ddp=None)")
    rejects({"tensor_parallel_degree": 2, "ddp": False}, "^.*ddp=False\\)$")
    assert parse({"tensor_parallel_degree": 2, "ddp": True}).tensor_parallel_degree == 2


def test_unknown_parameters_suggest():
    rejects({"microbatch": 4}, f"{W} has an unknown parameter 'microbatch': did you mean "
            "'microbatches'?")
    rejects({"tensor_paralel_degree": 2}, "^.*did you mean 'tensor_parallel_degree'\\?$")
    rejects({"zzz": 1}, f"{W} has an unknown parameter 'zzz'")


def test_parameters_of_the_other_launcher():
    rejects({"hybrid_shard_degree": 8},
            f"{W} has an unknown parameter 'hybrid_shard_degree'; 'hybrid_shard_degree' is a "
            "parameter of the library launched with 'torch_distributed'")
    rejects({"partitions": 2},
            f"{W} has an unknown parameter 'partitions'; 'partitions' is a parameter of the "
            "library launched with 'mpi'", torchrun=True)


def test_torchrun_library_parameters():
    params = parse({"hybrid_shard_degree": 0, "tensor_parallel_degree": 4,
                    "context_parallel_degree": 2, "expert_parallel_degree": 1,
                    "sm_activation_offloading": True, "activation_loading_horizon": 2,
                    "fsdp_cache_flush_warnings": False, "allow_empty_shards": True,
                    "random_seed": 12345}, torchrun=True)  # fmt: skip
    assert params.torchrun and params.tensor_parallel_degree == 4
    rejects({"hybrid_shard_degree": -1}, f"{W}['hybrid_shard_degree'] must be >= 0 (got -1)",
            torchrun=True)
    rejects({"random_seed": "7"}, f"{W}['random_seed'] must be an int (got '7')", torchrun=True)


def test_custom_image_accepts_every_framework_parameter():
    params = parse({"partitions": 2, "contiguous": True, "memory_weight": 0.2}, framework=None)
    assert params.to_dict() == {"partitions": 2, "contiguous": True, "memory_weight": 0.2}


# ---------------------------------------------------------------- files and the result


def test_parameters_from_a_json_file(tmp_path):
    path = tmp_path / "smp.json"
    path.write_text(json.dumps({"partitions": 2, "microbatches": 4}))
    assert parse(str(path)).to_dict() == {"partitions": 2, "microbatches": 4}
    assert parse(pathlib.Path(path)).to_dict() == {"partitions": 2, "microbatches": 4}


def test_parameters_file_is_validated(tmp_path):
    path = tmp_path / "smp.json"
    path.write_text(json.dumps({"partitions": 0}))
    rejects(str(path), f"{W}['partitions'] must be >= 1 (got 0)")


def test_bad_parameters_files(tmp_path):
    rejects(str(tmp_path / "missing.json"),
            f"{W} names no existing JSON file (got '{tmp_path / 'missing.json'}')")
    broken = tmp_path / "broken.json"
    broken.write_text("{partitions: 2")
    rejects(str(broken), f"^{re.escape(W)}: '.*broken.json' is not valid JSON \\(")
    listed = tmp_path / "list.json"
    listed.write_text("[1, 2]")
    rejects(str(listed), f"^{re.escape(W)}: '.*list.json' must hold a JSON object \\(got \\[1, 2\\]\\)")
    rejects(42, f"{W} must be a dict or the path of a JSON file (got 42)")


def test_values_are_kept_as_written():
    given = {"partitions": 2, "memory_weight": 1, "sdp_reduce_bucket_size": 5e8, "ddp": True}
    params = parse(given)
    assert params.to_dict() == given
    assert type(params.to_dict()["memory_weight"]) is int


def test_result_is_frozen_and_detached():
    given = {"partitions": 2}
    params = parse(given)
    given["partitions"] = 3
    assert params.get("partitions") == 2
    with pytest.raises(TypeError):
        params.values["partitions"] = 5
    out = params.to_dict()
    out["partitions"] = 9
    assert params.get("partitions") == 2
    with pytest.raises(AttributeError):
        params.torchrun = True
    assert params == ModelParallelParameters({"partitions": 2})


def test_parameters_are_hashable():
    assert hash(parse({"partitions": 2})) == hash(parse({"partitions": 2}))
    assert parse({"partitions": 2}) != parse({"partitions": 4})
    assert len({parse({"partitions": 2}), parse({"partitions": 2})}) == 1


def test_parameter_tables_are_read_only():
    table = parameter_table()
    assert "partitions" in table and "hybrid_shard_degree" not in table
    assert "hybrid_shard_degree" in parameter_table(torchrun=True)
    with pytest.raises(TypeError):
        table["partitions"] = None
