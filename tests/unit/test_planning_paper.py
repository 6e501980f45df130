"""Published configurations the strategy planner reproduces on paper (benchmarks/planner_paper.py).

Rows from Narayanan et al. SC'21 (Megatron-LM, Tables 1 and 2), Korthikanti et al. 2022
(Table 5) and the NeMo AutoConfigurator's 16-node Llama-3 8B grid.
"""

from __future__ import annotations

import time

import pytest
from shoal.planning import strategy
from shoal.planning.costs import Candidate, CostModel, Workload
from shoal.planning.models import TransformerSpec
from shoal.planning.strategy import Constraints

A100 = "ml.p4de.24xlarge"
MEGATRON_SPACE = {"sharded_data": 1, "optimizer_sharding": False, "checkpointing": True}
GPT175B = TransformerSpec(layers=96, hidden=12288, heads=96, seq=2048, vocab=51200)


def gpt(layers, hidden, heads):
    return TransformerSpec(layers=layers, hidden=hidden, heads=heads, seq=2048, vocab=51200)


def plan(spec, batch, gpus, pins=None, max_mb=64):
    return strategy.plan_strategy(
        spec, global_batch=batch, instance_type=A100, instance_count=gpus // 8,
        precision="fp16", optimizer="adam",
        constraints=Constraints(pins=pins or {}, max_microbatches=max_mb))


def fastest(spec, batch, gpus, pins, max_mb=512):
    hw = strategy.hardware(A100, gpus // 8, "fp16")
    model = CostModel(Workload(spec.profile(), batch, "fp16", "adam"), hw)
    return min((model.estimate(c) for c in strategy.candidates(
        spec.profile(), hw, batch, pins, max_microbatches=max_mb)),
        key=lambda e: e.step_seconds)


def test_megatron_1_7b_on_32_gpus_is_plain_data_parallel_in_megatrons_space():
    got = plan(gpt(24, 2304, 24), 512, 32, MEGATRON_SPACE)  # Table 1, row 1: t 1, p 1
    assert (got.degrees["tensor"], got.degrees["pipeline"]) == (1, 1)


@pytest.mark.parametrize("layers, hidden, heads, gpus, batch, t, p", [
    (40, 6144, 48, 256, 1024, 8, 1),  # Table 1, 18.4B
    (96, 16384, 128, 1920, 2160, 8, 16),  # Table 1, 310.1B
])
def test_megatron_table1_degrees_in_megatrons_space(layers, hidden, heads, gpus, batch, t, p):
    got = plan(gpt(layers, hidden, heads), batch, gpus, MEGATRON_SPACE, max_mb=512)
    assert (got.degrees["tensor"], got.degrees["pipeline"]) == (t, p)


def test_ptdp_beats_zero3_for_175b_once_each_gpu_holds_one_sample():
    # Table 2: PTD-P (t 8, p 12) 153 / 149 / 141 TF/s against ZeRO-3's 144 / 88 / 44 on 384 /
    # 768 / 1536 GPUs. Sharded data parallelism is priced as SMP runs it (hierarchical
    # gathers: a host's network carries the bytes once), and PTD-P with the pipeline's known
    # pessimism (benchmarks/README.md): the model keeps the ordering where ZeRO-3 collapses,
    # at 1536 GPUs and one sample each; below, it orders ZeRO-3 first
    gpus = 1536
    zero = fastest(GPT175B, 1536, gpus, {"tensor": 1, "pipeline": 1, "sharded_data": gpus})
    ptdp = fastest(GPT175B, 1536, gpus, {"tensor": 8, "pipeline": 12, "sharded_data": 1,
                                         "optimizer_sharding": False})
    assert ptdp.step_seconds < zero.step_seconds


def test_tensor_parallelism_stays_within_a_host():
    for gpus in (64, 1024):
        got = plan(GPT175B, 1536, gpus)
        assert got.degrees["tensor"] <= 8
        for alternative in got.alternatives:
            assert alternative["degrees"]["tensor"] <= 8


def test_korthikanti_22b_iteration_time_within_15_percent():
    # Table 5: 22B, t 8, p 1, batch 4 (one microbatch of 4), full recompute: 1.42 s, at the
    # efficiency the benchmark calibrates on Megatron's 7.5B row
    hw = strategy.hardware(A100, 1, "fp16", Constraints(efficiency=0.54))
    model = CostModel(Workload(gpt(48, 6144, 64).profile(), 4, "fp16", "adam"), hw)
    est = model.estimate(Candidate(8, 1, 1, microbatches=1, checkpointing=True))
    assert est.step_seconds == pytest.approx(1.42, rel=0.15)


def test_nemo_llama3_8b_best_configuration_is_tp1_pp1():
    # final_summary_16nodes.csv: TP1 PP1 MBS1 is the fastest (227.9 TF/s), TP4 PP2 MBS1 slowest
    spec = TransformerSpec(layers=32, hidden=4096, heads=32, kv_heads=8, ffn=14336, seq=8192,
                           vocab=128256, tied=False, gated=True, flash=True)
    hw = strategy.hardware("ml.p5.48xlarge", 16, "bf16")
    model = CostModel(Workload(spec.profile(), 1024, "bf16", "adam"), hw)
    steps = {}
    for t, p, mbs in ((1, 1, 1), (1, 2, 1), (2, 1, 1), (2, 2, 1), (4, 1, 1), (4, 2, 1)):
        d = 128 // (t * p)
        cand = Candidate(t, p, d, optimizer_sharding=True, microbatches=1024 // (d * mbs))
        steps[t, p, mbs] = model.estimate(cand).step_seconds
    assert min(steps, key=steps.get) == (1, 1, 1)
    assert max(steps, key=steps.get) == (4, 2, 1)


def test_plan_for_1024_gpus_takes_under_a_second():
    started = time.process_time()
    got = plan(GPT175B, 1536, 1024)
    assert time.process_time() - started < 1.0
    assert got.considered > 100
