"""The strategy planner: legal plans only, the fastest that fits, explained; clear errors."""

import time

import pytest
from shoal.distribution import parse_distribution
from shoal.errors import ValidationError
from shoal.modelparallel import config as smp_config
from shoal.planning import strategy
from shoal.planning.costs import GIB
from shoal.planning.models import parse_description

GPT_1_7B = "transformer:layers=24,hidden=2304,heads=24,seq=2048,vocab=51200"
GPT_18B = "transformer:layers=40,hidden=6144,heads=48,seq=2048,vocab=51200"
GPT_175B = "transformer:layers=96,hidden=12288,heads=96,seq=2048,vocab=51200"
GPT_125M = "transformer:layers=12,hidden=768,heads=12,seq=1024,vocab=50257"

CASES = [  # model, global batch, instance type, count, precision
    (GPT_125M, 64, "ml.p4d.24xlarge", 2, "fp16"),
    (GPT_1_7B, 512, "ml.p4de.24xlarge", 4, "fp16"),
    (GPT_1_7B, 16, "ml.p3.16xlarge", 2, "fp32"),
    (GPT_18B, 64, "ml.p4d.24xlarge", 2, "bf16"),
    (GPT_18B, 256, "ml.g5.48xlarge", 8, "bf16"),
    (GPT_175B, 1536, "ml.p4de.24xlarge", 96, "fp16"),
    ("transformer:layers=30,hidden=3072,heads=32,seq=2048,vocab=51200,kv_heads=8,gated=true",
     96, "ml.g5.12xlarge", 6, "bf16"),
]


def plan(model=GPT_1_7B, batch=512, instance_type="ml.p4de.24xlarge", count=4,
         precision="fp16", **kwargs):
    return strategy.plan_strategy(model, global_batch=batch, instance_type=instance_type,
                                  instance_count=count, precision=precision, **kwargs)


@pytest.mark.parametrize("model,batch,instance_type,count,precision", CASES)
def test_every_plan_is_legal_for_the_sdk_and_the_runtime(model, batch, instance_type, count,
                                                         precision):
    p = plan(model, batch, instance_type, count, precision)
    # the SDK accepts the distribution as it accepts a user's
    parse_distribution(p.distribution, framework="pytorch", framework_version="1.13.1",
                       py_version="py39", instance_type=instance_type, instance_count=count)
    d = p.degrees
    per_host = p.distribution.get("mpi", {}).get("processes_per_host", 8)
    devices = per_host * count
    assert d["data"] * d["tensor"] * d["pipeline"] == devices
    assert d["tensor"] & (d["tensor"] - 1) == 0 and d["tensor"] <= per_host
    assert parse_description(model).heads % d["tensor"] == 0
    assert d["data"] % d["sharded_data"] == 0
    assert d["sharded_data"] == 1 or d["pipeline"] == 1
    assert batch % d["data"] == 0 and (batch // d["data"]) % p.microbatches == 0
    assert p.batch_per_rank == batch // d["data"]
    section = p.distribution.get("smdistributed", {}).get("modelparallel")
    if section:  # the runtime's own rules, as smp.init will check them
        cfg = smp_config.resolve(section["parameters"], environ={})
        smp_config.validate_world(cfg, devices, per_host)
        assert p.predicted["memory_gib_per_device"] <= p.predicted["memory_gib_usable"]


def test_a_model_that_fits_gets_plain_data_parallelism():
    # fp32: in fp16 the fp32 master copy's update is a tenth of this small step, and sharding
    # it (sharded data 8, persistent blocks gathered once a step) is priced 6 % faster
    p = plan(GPT_125M, 64, "ml.p4d.24xlarge", 2, precision="fp32")
    assert p.distribution == {"smdistributed": {"dataparallel": {"enabled": True}}}
    assert p.degrees == {"data": 16, "pipeline": 1, "tensor": 1, "sharded_data": 1}
    assert p.microbatches == 1 and not p.activation_checkpointing and p.environment == {}


def test_plain_data_parallelism_uses_the_launcher_each_instance_type_supports():
    g5 = plan(GPT_125M, 64, "ml.g5.48xlarge", 2)
    assert g5.distribution == {"pytorchddp": {"enabled": True}}
    p5 = plan(GPT_125M, 64, "ml.p5.48xlarge", 2)
    assert p5.distribution == {"torch_distributed": {"enabled": True}}


def test_p5_never_gets_the_model_parallel_library():
    with pytest.raises(ValidationError, match="neither smdistributed library on p5"):
        plan(GPT_18B, 64, "ml.p5.48xlarge", 2)


def test_a_model_too_big_for_one_device_is_split_and_says_why_not_data_parallel():
    p = plan(GPT_18B, 64, "ml.p4d.24xlarge", 2)
    assert "modelparallel" in p.distribution["smdistributed"]
    assert p.distribution["mpi"] == {"enabled": True, "processes_per_host": 8}
    plain = [a for a in p.alternatives if a["degrees"]["tensor"] == a["degrees"]["pipeline"]
             == a["degrees"]["sharded_data"] == 1 and a["microbatches"] == 1
             and not a["activation_checkpointing"] and not a["optimizer_sharding"]]
    assert plain and plain[0]["lost_because"].startswith("does not fit")


def test_the_prediction_is_the_sum_of_its_terms_and_no_alternative_is_clearly_faster():
    p = plan()
    pred = p.predicted
    assert pred["step_seconds"] == pytest.approx(sum(pred["seconds"].values()))
    assert pred["memory_gib_per_device"] == pytest.approx(sum(pred["memory_gib"].values()))
    assert {"parameters", "gradients", "optimizer_states", "activations"} <= set(
        pred["memory_gib"])
    assert {"compute", "pipeline_bubble", "tensor_parallel", "data_parallel",
            "pipeline_p2p"} <= set(pred["seconds"])
    assert p.alternatives and len(p.alternatives) <= 5
    for alt in p.alternatives:
        fits = alt["predicted"]["memory_gib_per_device"] <= pred["memory_gib_usable"]
        if fits and alt["predicted"]["step_seconds"] < pred["step_seconds"]:
            # only a near tie (2 %) that leaves less memory to spare beats the pick
            assert alt["predicted"]["step_seconds"] >= pred["step_seconds"] / 1.02
            assert alt["predicted"]["memory_gib_per_device"] > pred["memory_gib_per_device"]
            assert "less memory to spare" in alt["lost_because"]
        elif fits:
            assert "slower" in alt["lost_because"] or "as fast" in alt["lost_because"]
        else:
            assert alt["lost_because"].startswith("does not fit")


def test_a_pin_is_honoured_and_costs_what_the_model_says():
    free = plan()
    pinned = plan(constraints=strategy.Constraints(pins={"tensor": 4, "pipeline": 2}))
    assert pinned.degrees["tensor"] == 4 and pinned.degrees["pipeline"] == 2
    assert pinned.predicted["step_seconds"] >= free.predicted["step_seconds"]
    with pytest.raises(ValidationError, match="unknown pin"):
        strategy.Constraints(pins={"tensors": 2})


def test_checkpointing_is_carried_in_the_environment_and_as_a_script_line():
    p = plan(GPT_1_7B, 512, "ml.p4de.24xlarge", 4,
             constraints=strategy.Constraints(pins={"checkpointing": True}))
    assert p.activation_checkpointing
    assert p.environment == {"SHOAL_ACTIVATION_CHECKPOINTING": "blocks"}
    assert any("set_activation_checkpointing" in change for change in p.script_changes)
    assert p.predicted["seconds"]["recompute"] > 0


def test_optimizer_state_sharding_tells_the_script_what_smp_requires():
    p = plan(constraints=strategy.Constraints(pins={"optimizer_sharding": True}))
    assert p.distribution["smdistributed"]["modelparallel"]["parameters"][
        "shard_optimizer_state"] is True
    assert any("gradient_as_bucket_view=True" in change for change in p.script_changes)
    assert not plan(GPT_125M, 64, "ml.p4d.24xlarge", 2).script_changes


def test_a_model_that_cannot_fit_names_the_smallest_cluster_that_would():
    with pytest.raises(ValidationError) as caught:
        plan(GPT_175B, 64, "ml.p4d.24xlarge", 2)
    message = str(caught.value)
    assert "does not fit on 2 x ml.p4d.24xlarge" in message
    count = int(message.split("smallest cluster that fits is ")[1].split(" x ")[0])
    plan(GPT_175B, 64, "ml.p4d.24xlarge", count)  # fits there
    with pytest.raises(ValidationError):
        plan(GPT_175B, 64, "ml.p4d.24xlarge", count // 2)


@pytest.mark.parametrize("kwargs,message", [
    ({"model": "transformer:layers=24,hidden=2304,heads=25,seq=2048,vocab=51200"},
     "must be divisible by 'heads'.*heads=24"),
    ({"instance_type": "ml.p4dd.24xlarge"}, "unknown GPU instance type.*ml.p4d.24xlarge"),
    ({"precision": "fp8"}, "'precision' must be one of"),
    ({"optimizer": "adamax"}, "'optimizer' must be one of"),
    ({"batch": 0}, "'global_batch' must be an int >= 1"),
    ({"batch": 7, "constraints": strategy.Constraints(pins={"data": 32})},
     "no legal configuration.*data=32"),
])
def test_impossible_inputs_say_what_to_fix(kwargs, message):
    with pytest.raises(ValidationError, match=message):
        plan(**kwargs)


def test_a_small_batch_lowers_the_data_parallel_degree_instead_of_failing():
    p = plan(GPT_1_7B, 2, "ml.p4d.24xlarge", 4)
    assert p.degrees["data"] <= 2
    assert p.degrees["tensor"] * p.degrees["pipeline"] >= 16


def test_a_plan_for_1024_gpus_takes_well_under_a_second():
    started = time.process_time()
    p = plan(GPT_175B, 1536, "ml.p4de.24xlarge", 128)
    spent = time.process_time() - started
    assert p.considered > 500
    assert spent < 1.0, f"planning 1024 GPUs took {spent:.2f} s of CPU"


def test_local_mode_plans_for_this_machine_processes():
    p = plan(GPT_125M, 8, "local", 2, "fp32",
             constraints=strategy.Constraints(processes_per_host=2))
    assert p.degrees["data"] * p.degrees["tensor"] * p.degrees["pipeline"] == 4
    assert p.predicted["memory_gib_usable"] * GIB > 0


def test_local_ranks_share_this_machines_cores_and_gpus_do_not(monkeypatch):
    from shoal.planning import instances

    monkeypatch.setattr(instances.os, "sched_getaffinity", lambda pid: {0, 1})
    constraints = strategy.Constraints(processes_per_host=2)
    assert strategy.hardware("local", 2, "fp32", constraints).contention == 2.0  # 4 on 2
    assert strategy.hardware("local", 1, "fp32", constraints).contention == 1.0  # 2 on 2
    assert strategy.hardware("ml.p4d.24xlarge", 4, "fp16").contention == 1.0
    measured = strategy.Calibration(contention=1.5)
    assert strategy.hardware("local", 2, "fp32", constraints, measured).contention == 1.5
    # a probe reading more than ranks per core (its small matmul, in cache alone) is capped:
    # a single-threaded rank alone runs on one core at most
    cached = strategy.Calibration(contention=2.9)
    assert strategy.hardware("local", 2, "fp32", constraints, cached).contention == 2.0
    assert strategy.hardware("local", 1, "fp32", constraints, cached).contention == 1.0
    assert strategy.hardware("local_gpu", 2, "fp32", constraints, cached).contention == 2.9


def test_cpu_ranks_dispatch_in_line_and_gpus_behind_their_arithmetic():
    constraints = strategy.Constraints(processes_per_host=2)
    assert not strategy.hardware("local", 2, "fp32", constraints).dispatch_hidden
    assert strategy.hardware("local_gpu", 2, "fp32", constraints).dispatch_hidden
    assert strategy.hardware("ml.p4d.24xlarge", 4, "fp16").dispatch_hidden


def test_a_calibration_replaces_the_instance_tables_figures():
    slow = strategy.Calibration(flops=1e12)
    fast = plan()
    measured = plan(calibration=slow)
    assert measured.predicted["seconds"]["compute"] > 50 * fast.predicted["seconds"]["compute"]
    with pytest.raises(ValidationError, match="unknown calibration key"):
        strategy.Calibration.from_dict({"flop": 1})


def test_of_near_ties_the_plan_keeps_the_most_memory_to_spare():
    tight = plan(constraints=strategy.Constraints(near=0.0))
    roomy = plan()
    assert roomy.predicted["memory_gib_per_device"] <= tight.predicted["memory_gib_per_device"]
    assert roomy.predicted["step_seconds"] <= tight.predicted["step_seconds"] * 1.02
