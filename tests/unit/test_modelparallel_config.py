"""The runtime's configuration: merging, aliases, SMP's messages, refusals, derived values."""

from __future__ import annotations

import json
import logging

import attrs
import pytest
from shoal.modelparallel.config import (
    ACCEPTED_WITHOUT_EFFECT,
    ENV_VAR,
    Config,
    resolve,
    unsupported,
    validate_world,
)
from shoal.modelparallel.errors import SMPConfigError, SMPUnsupportedError
from shoal.modelparallel.parameters import v1_defaults, v1_parameters

from tests.unit.messages import assert_message


def env(**values):
    return {ENV_VAR: json.dumps(values)}


def rejects(config, message, environ=None, error=SMPConfigError):
    with pytest.raises(error) as info:
        resolve(config, environ or {})
    assert type(info.value) is error
    text = str(info.value)
    return assert_message(text, message)


# ---------------------------------------------------------------- defaults and fields


def test_nothing_given_gives_smp_defaults():
    cfg = resolve(None, {})
    assert cfg == Config()
    expected = {**v1_defaults("pytorch"), "active_microbatches": 1}
    assert cfg.to_dict() == expected


def test_every_pytorch_parameter_is_an_attribute():
    cfg = resolve({}, {})
    for key in v1_defaults("pytorch"):
        getattr(cfg, key)
    # What HF transformers reads from smp.state.cfg.
    assert (cfg.fp16, cfg.shard_optimizer_state, cfg.prescaled_batch) == (False, False, False)
    assert (cfg.microbatches, cfg.ddp) == (1, False)


def test_fields_are_the_pytorch_parameters_plus_the_requested_pipeline():
    names = {f.name for f in attrs.fields(Config)}
    table = set(v1_parameters("pytorch")) - {"partitions"}
    assert names == table | {"pipeline_requested"}


def test_config_is_frozen():
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        resolve({}, {}).microbatches = 4


def test_os_environ_is_the_default_environment(monkeypatch):
    monkeypatch.setenv(ENV_VAR, json.dumps({"microbatches": 3}))
    assert resolve({}).microbatches == 3


def test_to_dict_round_trips():
    cfg = resolve({"partitions": 2, "microbatches": 8, "ddp": True, "memory_weight": 0.3}, {})
    # None means "unset"; as in SMP, an explicit None is no int.
    given = {k: v for k, v in cfg.to_dict().items() if v is not None}
    assert resolve(given, {}) == cfg
    assert json.loads(json.dumps(cfg.to_dict())) == cfg.to_dict()


# ---------------------------------------------------------------- merging and aliases


def test_environment_wins_per_key():
    cfg = resolve({"microbatches": 2, "ddp": True}, env(microbatches=4, optimize="memory"))
    assert (cfg.microbatches, cfg.ddp, cfg.optimize) == (4, True, "memory")


def test_the_callers_dict_is_not_changed():
    given = {"partitions": 2}
    resolve(given, env(microbatches=4))
    assert given == {"partitions": 2}


def test_partitions_is_an_alias():
    assert resolve({"partitions": 4}, {}).pipeline_parallel_degree == 4
    assert resolve({"pipeline_parallel_degree": 4}, {}).partitions == 4
    assert resolve({"partitions": 2, "pipeline_parallel_degree": 2}, {}).partitions == 2


def test_alias_conflict():
    rejects(
        {"partitions": 2, "pipeline_parallel_degree": 4},
        "Conflicting values 4 and 2 are provided for config parameter "
        "pipeline_parallel_degree and its alias partitions.",
    )


def test_alias_conflict_across_dict_and_environment():
    rejects({"pipeline_parallel_degree": 4}, "^Conflicting values 4 and 2 ", env(partitions=2))


def test_environment_alias_replaces_dict_value_of_same_key():
    assert resolve({"partitions": 4}, env(partitions=2)).pipeline_parallel_degree == 2


@pytest.mark.parametrize("raw,message", [
    ("{not json", f"^{ENV_VAR} is not valid JSON"),
    ("[1, 2]", f"{ENV_VAR} must hold a JSON object. Found: list."),
    ("", f"^{ENV_VAR} is not valid JSON"),
])  # fmt: skip
def test_bad_environment(raw, message):
    rejects({}, message, {ENV_VAR: raw})


def test_config_must_be_a_mapping():
    rejects([("partitions", 2)], "smp.init's config must be a dict. Found: list.")


# ---------------------------------------------------------------- names and types


def test_unknown_parameter():
    rejects({"overlapping_allreduce": True}, "Unrecognized config parameter overlapping_allreduce.")


def test_unknown_parameter_with_hint():
    rejects(
        {"microbatch": 4},
        "Unrecognized config parameter microbatch. Did you mean microbatches?",
    )


def test_unknown_parameter_in_environment():
    rejects({}, "^Unrecognized config parameter pipline. Did you mean pipeline", env(pipline="x"))


@pytest.mark.parametrize("key", ["horovod", "contiguous"])
def test_tensorflow_parameters_are_refused(key):
    rejects({key: True}, f"^Unrecognized config parameter {key}. {key} is a TensorFlow parameter")


def test_v2_parameters_are_named_as_such():
    rejects({"hybrid_shard_degree": 2}, "^Unrecognized .* is a parameter of SMP v2")


@pytest.mark.parametrize("key,value,types,found", [
    ("ddp", 1, ["bool"], "int"),
    ("auto_partition", "yes", ["bool"], "str"),
    ("microbatches", True, ["int"], "bool"),
    ("microbatches", 2.0, ["int"], "float"),
    ("partitions", "2", ["int"], "str"),
    ("pipeline", 1, ["str"], "int"),
    ("memory_weight", "0.5", ["float", "int"], "str"),
    ("memory_weight", False, ["float", "int"], "bool"),
    ("ddp_port", None, ["int"], "NoneType"),
    ("sdp_reduce_bucket_size", "5e8", ["int", "float"], "str"),
])  # fmt: skip
def test_types(key, value, types, found):
    shown = "pipeline_parallel_degree" if key == "partitions" else key
    rejects(
        {key: value, "ddp": True} if key != "ddp" else {key: value},
        f"Config parameter {shown} type needs to be one of {types}. Found: {found}.",
    )


def test_an_int_is_a_float():
    cfg = resolve({"memory_weight": 1}, {})
    assert cfg.memory_weight == 1.0 and type(cfg.memory_weight) is float


def test_counts_may_be_written_as_floats():
    assert resolve({"sdp_reduce_bucket_size": 5e8}, {}).sdp_reduce_bucket_size == 500_000_000
    rejects(
        {"sdp_reduce_bucket_size": 1.5},
        "Config parameter sdp_reduce_bucket_size must be a whole number. Found: 1.5.",
    )


# ---------------------------------------------------------------- values and ranges


@pytest.mark.parametrize("key,value,message", [
    ("microbatches", 0, "Config parameter microbatches (0) cannot be less than 1."),
    ("partitions", 0, "Config parameter pipeline_parallel_degree (0) cannot be less than 1."),
    ("active_microbatches", 0, "Config parameter active_microbatches (0) cannot be less than 1."),
    ("default_partition", -1, "Config parameter default_partition (-1) cannot be less than 0."),
    ("ddp_port", 70000, "Config parameter ddp_port (70000) cannot be larger than 65535 (65535)."),
    ("memory_weight", 1.5, "Memory weight must between 0.0 and 1.0."),
    ("memory_weight", -0.1, "Memory weight must between 0.0 and 1.0."),
    ("memory_weight", float("nan"), "Memory weight must between 0.0 and 1.0."),
    ("sdp_gradient_clipping", float("inf"),
     "Config parameter sdp_gradient_clipping must be a finite number. Found: inf."),
    ("pipeline", "gpipe",
     "Config parameter pipeline must be one of ['simple', 'interleaved', '_only_forward']. "
     "Found: gpipe."),
    ("optimize", "fast", "Config parameter optimize must be one of ['speed', 'memory']. Found: fast."),
    ("ddp_dist_backend", "mpi",
     "Config parameter ddp_dist_backend must be one of ['auto', 'nccl', 'gloo']. Found: mpi."),
    ("placement_strategy", "DDP",
     "Config parameter placement_strategy must be one of ['cluster', 'spread', 'DPT', 'DTP', "
     "'PDT', 'PTD', 'TDP', 'TPD']. Found: DDP."),
])  # fmt: skip
def test_values(key, value, message):
    rejects({key: value, "ddp": True}, message)


@pytest.mark.parametrize(
    "placement", ["cluster", "spread", "DPT", "DTP", "PDT", "PTD", "TDP", "TPD"]
)
def test_every_placement_is_accepted(placement):
    assert resolve({"placement_strategy": placement}, {}).placement_strategy == placement


# ---------------------------------------------------------------- rules between parameters


@pytest.mark.parametrize("config,message", [
    ({"tensor_parallel_degree": 2},
     "Setting config parameter tensor_parallel_degree to non-default value 2 requires ddp to "
     "be set to True. Found: False"),
    ({"ddp_port": 1234},
     "Setting config parameter ddp_port to non-default value 1234 requires ddp to be set to "
     "True. Found: False"),
    ({"ddp_dist_backend": "gloo"},
     "Setting config parameter ddp_dist_backend to non-default value gloo requires ddp to be "
     "set to True. Found: False"),
    ({"sharded_data_parallel_degree": 2, "partitions": 2},
     "Setting config parameter sharded_data_parallel_degree to non-default value 2 requires "
     "pipeline_parallel_degree to be set to 1. Found: 2"),
    ({"sharded_data_parallel_degree": 2, "shard_optimizer_state": True},
     "Setting config parameter sharded_data_parallel_degree to non-default value 2 requires "
     "shard_optimizer_state to be set to False. Found: True"),
    ({"prescaled_batch": True, "optimize": "memory"},
     "Setting config parameter prescaled_batch to non-default value True requires optimize to "
     "be set to speed. Found: memory"),
    ({"bf16": True, "fp16": True},
     "Setting config parameter bf16 to non-default value True requires fp16 to be set to False. "
     "Found: True"),
    ({"bf16": True, "fp16_params": True},
     "Setting config parameter bf16 to non-default value True requires fp16_params to be set to "
     "False. Found: True"),
    ({"auto_partition": False},
     "Setting config parameter auto_partition to non-default value False requires "
     "default_partition to not be None."),
    ({"auto_partition": False, "default_partition": 2, "partitions": 2},
     "Config parameter default_partition (2) cannot be larger than "
     "pipeline_parallel_degree - 1 (1)."),
    ({"default_partition": 1},
     "Config parameter default_partition (1) cannot be larger than "
     "pipeline_parallel_degree - 1 (0)."),
    ({"microbatches": 4, "active_microbatches": 5},
     "Config parameter active_microbatches (5) cannot be larger than microbatches (4)."),
])  # fmt: skip
def test_rules(config, message):
    rejects(config, message)


def test_manual_partitioning():
    cfg = resolve({"auto_partition": False, "default_partition": 1, "partitions": 2}, {})
    assert (cfg.auto_partition, cfg.default_partition) == (False, 1)


def test_ddp_settings():
    cfg = resolve({"ddp": True, "ddp_port": 29600, "ddp_dist_backend": "nccl"}, {})
    assert (cfg.ddp, cfg.ddp_port, cfg.ddp_dist_backend) == (True, 29600, "nccl")


# ---------------------------------------------------------------- derived values


@pytest.mark.parametrize("pp,microbatches,active", [
    (1, 1, 1), (2, 1, 1), (2, 4, 4), (2, 8, 4), (4, 8, 6), (4, 4, 4), (3, 20, 5),
])  # fmt: skip
def test_active_microbatches_default(pp, microbatches, active):
    cfg = resolve({"partitions": pp, "microbatches": microbatches}, {})
    assert cfg.active_microbatches == active == min(pp + 2, microbatches)


def test_active_microbatches_given():
    assert resolve({"microbatches": 8, "active_microbatches": 3}, {}).active_microbatches == 3


def test_simple_pipeline_runs_when_every_microbatch_may_be_active(caplog):
    with caplog.at_level(logging.INFO, logger="shoal.modelparallel.config"):
        cfg = resolve({"partitions": 2, "microbatches": 4, "pipeline": "simple"}, {})
    assert (cfg.pipeline_requested, cfg.pipeline, cfg.active_microbatches) == (
        "simple",
        "simple",
        4,
    )
    assert "interleaved pipeline instead" not in caplog.text


def test_simple_pipeline_is_switched_to_interleaved(caplog):
    with caplog.at_level(logging.INFO, logger="shoal.modelparallel.config"):
        cfg = resolve({"partitions": 2, "microbatches": 8, "pipeline": "simple"}, {})
    assert (cfg.pipeline_requested, cfg.pipeline, cfg.active_microbatches) == (
        "simple",
        "interleaved",
        4,
    )
    assert cfg.to_dict()["pipeline"] == "interleaved"
    assert "Using interleaved pipeline instead." in caplog.text


def test_only_forward_is_switched_too():
    cfg = resolve({"microbatches": 8, "pipeline": "_only_forward"}, {})
    assert cfg.pipeline == "interleaved"
    assert resolve({"microbatches": 2, "pipeline": "_only_forward"}, {}).pipeline == "_only_forward"


def test_config_built_directly_is_checked_too():
    assert Config(microbatches=4, pipeline_parallel_degree=4).active_microbatches == 4
    with pytest.raises(SMPConfigError, match="cannot be larger than microbatches"):
        Config(microbatches=2, active_microbatches=3)
    with pytest.raises(SMPConfigError, match="Memory weight"):
        Config(memory_weight=2)


def test_mp_size():
    assert resolve({"partitions": 4}, {}).mp_size == 4


# ---------------------------------------------------------------- what this runtime refuses


def test_a_parameter_not_honoured_is_refused_by_name(monkeypatch):
    # Every SMP v1 PyTorch parameter is honoured or accepted without effect today; the
    # table stays for the next one that is not.
    from shoal.modelparallel import config as config_module

    monkeypatch.setattr(config_module, "_UNSUPPORTED", (("fp16", bool), ("microbatches",
                                                                        lambda v: v > 8)))
    rejects({"fp16": True, "microbatches": 16},
            "Shoal's model-parallel runtime does not implement: fp16=True, microbatches=16. "
            "Leave these parameters at their defaults.", error=SMPUnsupportedError)
    rejects({}, "^Shoal's model-parallel runtime does not implement: fp16=True",
            env(fp16=True), error=SMPUnsupportedError)
    assert unsupported(resolve({"microbatches": 4}, {})) == []


def test_sharded_data_parallelism_is_taken_with_its_keys():
    cfg = resolve({"sharded_data_parallel_degree": 4, "ddp": True, "tensor_parallel_degree": 2,
                   "sdp_reduce_bucket_size": int(5e8), "sdp_max_live_parameters": 1e9,
                   "sdp_hierarchical_allgather": False, "sdp_gradient_clipping": 0.5}, {})
    assert unsupported(cfg) == []
    assert (cfg.sharded_data_parallel_degree, cfg.sdp_max_live_parameters) == (4, 10**9)
    assert (cfg.sdp_hierarchical_allgather, cfg.sdp_gradient_clipping) == (False, 0.5)
    rejects({"sharded_data_parallel_degree": 2},
            "Setting config parameter sharded_data_parallel_degree to non-default value 2 "
            "requires ddp to be set to True. Found: False")


def test_fp16_and_bf16_are_taken():
    assert (resolve({"fp16": True}, {}).fp16, resolve({"bf16": True}, {}).bf16) == (True, True)
    assert unsupported(resolve({"bf16": True}, {})) == []
    assert resolve({}, env(fp16=True)).fp16


def test_fp16_params_is_the_deprecated_fp16():
    with pytest.warns(FutureWarning, match="fp16_params is deprecated"):
        cfg = resolve({"fp16_params": True}, {})
    assert cfg.fp16 and cfg.fp16_params and unsupported(cfg) == []


def test_unsupported_is_a_config_error():
    assert issubclass(SMPUnsupportedError, SMPConfigError)
    assert issubclass(SMPConfigError, ValueError)


@pytest.mark.parametrize("config", [
    {"tensor_parallel_degree": 1}, {"sharded_data_parallel_degree": 1}, {"fp16": False},
    {"bf16": False}, {"fp16_params": False}, {"offload_activations": False},
    {"shard_optimizer_state": False}, {"delayed_parameter_initialization": False},
    {"prescaled_batch": False},
])  # fmt: skip
def test_unsupported_parameters_at_their_defaults_are_fine(config):
    assert unsupported(resolve(config, {})) == []


def test_accepted_parameters_without_effect():
    config = {
        "ddp": True, "ddp_dist_backend": "nccl", "ddp_port": 29500, "skip_tracing": True,
        "static_mode": True, "fast_mode": True, "deterministic_server": True,
        "load_partition": True, "partition_file": "p.json", "predefined_hooks": False,
        "sdp_reduce_bucket_size": 10,
        "sdp_param_persistence_threshold": 0, "sdp_max_live_parameters": 5,
        "sdp_hierarchical_allgather": False, "sdp_gradient_clipping": 0.5,
    }  # fmt: skip
    cfg = resolve(config, {})
    for key, value in config.items():
        assert getattr(cfg, key) == value
    assert set(ACCEPTED_WITHOUT_EFFECT) <= set(config)


def test_offloading_and_delayed_initialization_are_taken():
    cfg = resolve({"offload_activations": True, "activation_loading_horizon": 2,
                   "delayed_parameter_initialization": True}, {})
    assert (cfg.offload_activations, cfg.activation_loading_horizon) == (True, 2)
    assert cfg.delayed_parameter_initialization and unsupported(cfg) == []
    assert resolve({}, {}).activation_loading_horizon == 4
    assert "activation_loading_horizon" not in ACCEPTED_WITHOUT_EFFECT  # in effect
    rejects({"activation_loading_horizon": 0},
            "Config parameter activation_loading_horizon (0) cannot be less than 1.")


def test_tensor_parallelism_is_taken():
    cfg = resolve({"tensor_parallel_degree": 2, "ddp": True, "prescaled_batch": True,
                   "tensor_parallel_seed": 5}, {})
    assert (cfg.tensor_parallel_degree, cfg.prescaled_batch, cfg.optimize) == (2, True, "speed")
    assert cfg.tensor_parallel_seed == 5 and unsupported(cfg) == []
    assert resolve({"optimize": "memory"}, {}).optimize == "memory"


def test_real_script_configs():
    # The GPT-2 and BERT example scripts' parameters, less what Shoal refuses.
    gpt2 = {
        "ddp": True, "tensor_parallel_degree": 1, "pipeline_parallel_degree": 2,
        "microbatches": 4, "shard_optimizer_state": False, "prescaled_batch": False,
        "fp16": False, "bf16": False, "offload_activations": False,
        "delayed_parameter_initialization": False, "optimize": "speed",
        "placement_strategy": "cluster", "activation_loading_horizon": 4,
        "skip_tracing": False, "auto_partition": True, "default_partition": 0,
        "static_mode": False, "fast_mode": False, "sharded_data_parallel_degree": 1,
        "active_microbatches": 4,
    }  # fmt: skip
    bert = {
        "optimize": "speed", "microbatches": 12, "partitions": 2, "ddp": True,
        "pipeline": "interleaved", "placement_strategy": "cluster", "memory_weight": 0.3,
    }  # fmt: skip
    assert resolve(gpt2, {}).pipeline_parallel_degree == 2
    assert resolve(bert, {}).active_microbatches == 4


# ---------------------------------------------------------------- the world


@pytest.mark.parametrize("size,pp", [(1, 1), (2, 2), (4, 2), (6, 3), (8, 4), (16, 8)])
def test_world_fits(size, pp):
    validate_world(resolve({"partitions": pp}, {}), size, min(size, 4))


@pytest.mark.parametrize("size,pp", [(1, 2), (3, 2), (6, 4), (4, 8)])
def test_world_does_not_fit(size, pp):
    with pytest.raises(SMPConfigError) as info:
        validate_world(resolve({"partitions": pp}, {}), size, 1)
    assert str(info.value) == (
        f"The number of processes ({size}) must be divisible by pipeline_parallel_degree "
        f"({pp}) * tensor_parallel_degree (1) = {pp}."
    )


@pytest.mark.parametrize("size,local_size", [(0, 1), (4, 0), (4, 5)])
def test_world_counts_must_make_sense(size, local_size):
    with pytest.raises(SMPConfigError, match="Invalid process counts"):
        validate_world(Config(), size, local_size)
