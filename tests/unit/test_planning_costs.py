"""The cost model: collectives, stage balancing, memory per term and step time per term."""

import itertools
import random

import attrs
import pytest
from shoal.planning.costs import (
    Candidate,
    CostModel,
    Hardware,
    Workload,
    allreduce_time,
    gather_time,
    stages,
)
from shoal.planning.models import Layer, ModelProfile, TransformerSpec

GIB = 1024**3


def hardware(**overrides):
    figures = dict(gpus_per_host=8, hosts=2, memory=80 * GIB, flops=100e12, layer_overhead=0.0,
                   hbm=2e12, intra_bw=200e9, net_bw=50e9, overlap=0.0)
    return Hardware(**{**figures, **overrides})


def uniform(n=8, params=1_000_000, flops=1e9, act=1e6, tp_comm=4e4, split=True):
    """``n`` identical repeated layers, so every pipeline stage is the same."""
    layer = Layer("block", params, flops, act_split=act if split else 0.0,
                  act_kept=0.0 if split else act, boundary=1e4, tp_comm=tp_comm,
                  split=split, repeated=True)
    return ModelProfile("uniform", [layer] * n)


def model(profile=None, precision="fp16", batch=64, optimizer="adam", **hw):
    return CostModel(Workload(profile or uniform(), batch, precision, optimizer), hardware(**hw))


def states(estimate):
    m = estimate.memory
    return m["parameters"] + m["gradients"] + m["optimizer_states"]


# -- collectives -----------------------------------------------------------------------------

@pytest.mark.parametrize("n", [2, 4, 8, 64])
def test_ring_collectives_follow_the_alpha_beta_model(n):
    nbytes, bw, alpha = 3e9, 100e9, 5e-6
    assert allreduce_time(nbytes, n, bw, alpha) == pytest.approx(
        2 * (n - 1) / n * nbytes / bw + 2 * (n - 1) * alpha)
    assert gather_time(nbytes, n, bw, alpha) == pytest.approx(
        (n - 1) / n * nbytes / bw + (n - 1) * alpha)


def test_one_rank_or_nothing_to_send_costs_nothing():
    assert allreduce_time(1e9, 1, 1e9, 1e-5) == 0.0
    assert gather_time(1e9, 1, 1e9, 1e-5) == 0.0
    assert allreduce_time(0, 8, 1e9, 1e-5) == 0.0


# -- stages ----------------------------------------------------------------------------------

def best_split(loads, parts):
    """The least maximum stage load over every contiguous split (brute force)."""
    n = len(loads)
    return min(max(sum(loads[a:b]) for a, b in zip((0, *cuts), (*cuts, n)))
               for cuts in itertools.combinations(range(1, n), parts - 1))


_RNG = random.Random(7)
CASES = [(tuple(_RNG.choice([0, 1, 2, 3, 5, 8, 13]) for _ in range(n)), parts)
         for n in (6, 7, 8) for parts in (2, 3) for _ in range(4)]
CASES += [((1, 1, 1, 1, 1, 10), 3), ((10, 1, 1, 1, 1, 1, 1), 2), ((0, 0, 0, 0, 0, 7), 3),
          ((4, 4, 4, 4, 4, 4, 4, 4), 3)]


@pytest.mark.parametrize("loads, parts", CASES)
def test_stages_are_contiguous_and_as_balanced_as_any_split(loads, parts):
    ranges = stages(loads, parts)
    assert len(ranges) == parts
    assert ranges[0][0] == 0 and ranges[-1][1] == len(loads)
    assert all(a < b for a, b in ranges)  # none empty
    assert all(prev[1] == nxt[0] for prev, nxt in zip(ranges, ranges[1:]))
    worst = max(sum(loads[a:b]) for a, b in ranges)
    assert worst <= best_split(loads, parts) * (1 + 1e-9)


def test_as_many_parts_as_loads_gives_one_layer_each():
    assert stages((3.0, 1.0, 2.0), 3) == ((0, 1), (1, 2), (2, 3))


# -- memory ----------------------------------------------------------------------------------

def test_mixed_precision_adam_keeps_16_bytes_per_parameter():
    profile = uniform(act=0.0)  # no activations: the peak is the gradients' reduction
    estimate = model(profile).estimate(Candidate(1, 1, 1))
    # ZeRO section 3.1: 2 (fp16 weights) + 2 (fp16 grads) + 12 (fp32 master, two moments)
    assert states(estimate) == 16 * profile.params
    assert estimate.memory["parameters"] == 2 * profile.params
    assert "gathered_parameters" not in estimate.memory


def test_fp32_adam_keeps_weights_grads_and_two_moments():
    profile = uniform(act=0.0)
    estimate = model(profile, precision="fp32").estimate(Candidate(1, 1, 1))
    assert states(estimate) == (4 + 4 + 8) * profile.params


def test_optimizer_state_sharding_is_zero_1():
    profile = uniform(act=0.0)
    estimate = model(profile).estimate(Candidate(1, 1, 8, optimizer_sharding=True))
    assert states(estimate) == pytest.approx(4 * profile.params + 12 * profile.params / 8)


def test_sharded_data_parallelism_is_zero_3():
    profile = uniform()
    estimate = model(profile).estimate(Candidate(1, 1, 8, sharded=8))
    assert states(estimate) == pytest.approx(16 * profile.params / 8)
    assert estimate.memory["gathered_parameters"] > 0  # the live window of prefetched layers


def test_sharding_keeps_tensors_under_the_persistence_threshold_whole():
    small = Layer("block", 800_000, 1e9, 1e6, 0.0, 1e4, split=True, repeated=True,
                  largest=600_000)  # every tensor under 1e6 elements: none gathered
    big = Layer("embed", 1_800_000, 0.0, 0.0, 1e5, 1e4, split=True, largest=1_800_000)
    profile = ModelProfile("mixed", [big, small, small])
    memory = model(profile).estimate(Candidate(1, 1, 8, sharded=8)).memory
    assert memory["persistent_parameters"] == 2 * 1_600_000  # fp16, whole on every rank
    assert memory["gathered_parameters"] == 2 * 1_800_000  # only the embedding's tensor
    # tensor parallelism splits a tensor under the threshold: it then stays whole too
    split = model(profile).estimate(Candidate(2, 1, 4, sharded=4)).memory
    assert split["persistent_parameters"] == 2 * (1_600_000 + 1_800_000) / 2
    assert split["gathered_parameters"] == 0


def test_sharded_time_gathers_only_what_is_not_persistent_and_scatters_once_a_step():
    small = Layer("block", 800_000, 1e9, 1e6, 0.0, 1e4, split=True, repeated=True,
                  largest=600_000)
    persistent = ModelProfile("small", [small] * 4)
    big = Layer("block", 3_200_000, 1e9, 1e6, 0.0, 1e4, split=True, repeated=True,
                largest=1_600_000)
    gathered = ModelProfile("big", [big] * 4)
    cost = model(persistent, intra_bw=1e9, overlap=0.0)
    one = cost.estimate(Candidate(1, 1, 8, sharded=8)).time["sharded_data_parallel"]
    # no gathers in the forward and backward: one reduce-scatter and one refresh a step
    per_collective = gather_time(2 * 4 * 800_000, 8, 1e9, cost.hw.alpha_intra)
    assert one == pytest.approx(2 * per_collective)
    # microbatches add no collective: their gradients are summed before the reduce-scatter
    four = cost.estimate(Candidate(1, 1, 8, sharded=8, microbatches=4))
    assert four.time["sharded_data_parallel"] == pytest.approx(one)
    # tensors over the threshold are gathered on every use, forward and backward
    big_cost = model(gathered, intra_bw=1e9, overlap=0.0)
    many = big_cost.estimate(Candidate(1, 1, 8, sharded=8, microbatches=4))
    uses = 4 * 2 * (gather_time(2 * 4 * 3_200_000, 8, 1e9, 0.0) + 4 * 7 * cost.hw.alpha_intra)
    step = gather_time(2 * 4 * 3_200_000, 8, 1e9, cost.hw.alpha_intra)
    assert many.time["sharded_data_parallel"] == pytest.approx(uses + step)


def test_sharded_gradients_wait_whole_then_reduce_in_float32():
    profile = uniform()
    memory = model(profile).estimate(Candidate(1, 1, 8, sharded=4)).memory
    # whole 16-bit gradients are laid out in float32 rows; the reduce-scatter returns a share
    assert memory["gradient_buckets"] == pytest.approx(4 * profile.params * (1 + 1 / 4))


def test_a_pipelines_first_stage_holds_the_models_output_and_the_loss():
    layer = Layer("block", 1_000_000, 1e9, 1e6, 0.0, boundary=1e5, split=True, repeated=True)
    profile = ModelProfile("uniform", [layer] * 4)
    cost = model(profile, batch=64)
    gradients = 2 * 1e6 * 2  # the first stage's 2 layers, 16-bit
    piped = cost.estimate(Candidate(1, 2, 1, microbatches=4))
    # per microbatch in flight (all 4; pipeline + 2 at most): the output and its
    # log-softmax; for the one whose loss runs its backward, both gradients and the softmax.
    # Those five are freed before the stage makes any gradient: the first microbatch's
    # loss, before any gradient exists, is the peak here
    assert piped.memory["step_outputs"] == pytest.approx((2 * 4 + 3) * 1e5 * 16)
    assert "gradients" not in piped.memory
    # a small output (five of it under the gradients): a later microbatch's, with the
    # other 3 microbatches' outputs beside the gradients held for accumulation, is
    small = model(ModelProfile("uniform", [layer] * 3 + [attrs.evolve(layer, boundary=1e4)]),
                  batch=64).estimate(Candidate(1, 2, 1, microbatches=4))
    assert small.memory["step_outputs"] == pytest.approx(2 * 3 * 1e4 * 16)
    assert small.memory["gradients"] == pytest.approx(gradients)
    assert "step_outputs" not in cost.estimate(Candidate(1, 1, 1)).memory
    # one microbatch: all five of its loss, and no gradient yet
    once = cost.estimate(Candidate(1, 2, 1, microbatches=1))
    assert once.memory["step_outputs"] == pytest.approx(5 * 1e5 * 64)
    assert "gradients" not in once.memory


def test_the_peak_is_the_backward_or_the_gradients_reduction_whichever_holds_more():
    heavy = model(uniform(act=1e6)).estimate(Candidate(1, 1, 16))
    params = 8 * 1_000_000
    # the backward begins with every activation and no gradient (zero_grad freed them)
    assert heavy.memory["activations"] > 0
    assert "gradients" not in heavy.memory and "gradient_buckets" not in heavy.memory
    assert heavy.memory_bytes == pytest.approx(
        2 * params + 12 * params + heavy.memory["activations"])
    # activations smaller than the gradients and the all-reduce's copies of them
    light = model(uniform(act=10.0)).estimate(Candidate(1, 1, 16))
    assert "activations" not in light.memory
    assert light.memory["gradients"] == light.memory["gradient_buckets"] == 2 * params
    assert light.memory_bytes == pytest.approx((2 + 2 + 12 + 2) * params)


def test_earlier_microbatches_gradients_sit_beside_a_later_ones_activations():
    one = model(uniform(act=1e6)).estimate(Candidate(1, 1, 16))
    two = model(uniform(act=1e6)).estimate(Candidate(1, 1, 16, microbatches=2))
    assert "gradients" not in one.memory
    assert two.memory["gradients"] == 2 * 8 * 1_000_000
    assert two.memory["activations"] == pytest.approx(one.memory["activations"] / 2)


def test_optimizer_state_sharding_reduces_one_owners_bucket_at_a_time():
    params = 8 * 1_000_000
    plain = model(uniform(act=0.0)).estimate(Candidate(1, 1, 8)).memory
    sharded = model(uniform(act=0.0)).estimate(Candidate(1, 1, 8, optimizer_sharding=True))
    assert plain["gradient_buckets"] == 2 * params  # a copy of every bucket at once
    assert sharded.memory["gradient_buckets"] == pytest.approx(2 * params / 8)


def test_tensor_parallelism_halves_only_the_layers_it_splits():
    split = Layer("block", 3_000_000, 1e9, 1e6, 0.0, 1e4, 4e4, split=True, repeated=True)
    kept = Layer("norm", 500_000, 1e6, 0.0, 1e5, 1e4)
    profile = ModelProfile("mixed", [split, split, kept])
    one = model(profile).estimate(Candidate(1, 1, 1))
    two = model(profile).estimate(Candidate(2, 1, 1))
    assert one.memory["parameters"] == 2 * (2 * 3_000_000 + 500_000)
    assert two.memory["parameters"] == 2 * (2 * 3_000_000 / 2 + 500_000)
    # split activations halve too, kept ones do not
    assert two.memory["activations"] == pytest.approx(64 * (2 * 1e6 / 2 + 1e5))


def test_activations_are_per_sample_bytes_times_the_microbatch_and_double_in_fp32():
    profile = uniform(act=1e6)
    candidate = Candidate(1, 1, 4, microbatches=2)
    half = model(profile, precision="bf16", batch=64).estimate(candidate)
    full = model(profile, precision="fp32", batch=64).estimate(candidate)
    micro = 64 / (4 * 2)
    # one stage runs one microbatch at a time (its backward before the next forward)
    assert half.memory["activations"] == pytest.approx(8 * 1e6 * micro)
    # along a pipeline the first stage holds up to pipeline + 2 of them
    piped = model(profile, precision="bf16", batch=64).estimate(
        Candidate(1, 2, 2, microbatches=8))
    assert piped.memory["activations"] == pytest.approx(4 * 4 * 1e6 * 64 / (2 * 8))
    assert full.memory["activations"] == pytest.approx(2 * half.memory["activations"])


def test_the_loss_is_float32_at_any_precision_and_its_peak_precedes_recomputation():
    spec = TransformerSpec(layers=2, hidden=256, heads=4, seq=1024, vocab=50000, flash=True)
    s, v = 1024, 50000
    half, full = (model(spec.profile(), precision=p, batch=4) for p in ("bf16", "fp32"))
    loss = 12 * s * v * 4  # bytes per logit at the loss backward's peak, 4 samples
    plain = [m.estimate(Candidate(1, 1, 1)).memory["activations"] for m in (half, full)]
    # the rest doubles in float32; the loss's share does not
    assert plain[1] - 2 * plain[0] == pytest.approx(-loss)
    ckpt = half.estimate(Candidate(1, 1, 1, checkpointing=True)).memory["activations"]
    block = 34 * s * 256 * 4  # fused attention: no score matrices
    assert block < 2 * loss / 3  # the loss's backward is the larger transient
    kept = sum(x.act_split + x.act_kept for x in spec.profile().layers if not x.repeated)
    assert ckpt == pytest.approx(4 * (kept + 2 * 2 * s * 256) + loss / 3 + 2 * loss / 3)


def test_checkpointing_keeps_block_inputs_and_recomputes_a_third_of_the_work():
    spec = TransformerSpec(layers=24, hidden=2304, heads=24, seq=2048, vocab=51200)
    L, s, h, v, a = 24, 2048, 2304, 51200, 24
    profile = spec.profile()
    cost = model(profile, batch=8)
    plain = cost.estimate(Candidate(1, 1, 1))
    ckpt = cost.estimate(Candidate(1, 1, 1, checkpointing=True))
    assert ckpt.memory["activations"] < plain.memory["activations"] / 5
    # Korthikanti: full recompute keeps 2sbh per block, plus one block's sbh(34 + 5as/h) while
    # it is recomputed; embedding and head keep theirs; the float32 loss keeps its
    # log-softmax (4 bytes per logit), and its backward's other 8 are gone by the time a
    # block is recomputed (the larger of the two counts: here the loss's, 51200 logits a
    # token against a block's 34 h + 5 a s bytes)
    others = sum(x.act_split + x.act_kept for x in profile.layers if not x.repeated)
    recomputed, loss_backward = 34 * s * h + 5 * a * s * s, 8 * s * v
    assert ckpt.memory["activations"] == pytest.approx(
        8 * (others + L * 2 * s * h + max(recomputed, loss_backward) + 4 * s * v))
    assert plain.memory["activations"] == pytest.approx(
        8 * (sum(x.act_split + x.act_kept for x in profile.layers) + 12 * s * v))
    assert plain.time["recompute"] == 0.0
    # one more forward of the blocks: a third of forward + backward, less the head's share,
    # which Narayanan's count puts at v/(12hL) / (1 + s/(6h) + v/(12hL)) (about 7% here)
    head_share = (v / (12 * h * L)) / (1 + s / (6 * h) + v / (12 * h * L))
    ratio = ckpt.time["recompute"] / ckpt.time["compute"]
    assert ratio == pytest.approx((1 - head_share) / 3, rel=0.01)
    assert ckpt.step_seconds > plain.step_seconds


@pytest.mark.parametrize("p, m", [(2, 4), (4, 8), (4, 16), (8, 8)])
def test_the_pipeline_bubble_is_p_minus_1_over_m_of_compute(p, m):
    estimate = model(uniform(n=8), batch=256, layer_overhead=1e-5).estimate(
        Candidate(1, p, 1, microbatches=m))
    assert estimate.time["pipeline_bubble"] == pytest.approx((p - 1) / m
                                                             * estimate.time["compute"])


@pytest.mark.parametrize("p, m, slots", [
    (2, 1, 2 / 2),  # one stage at work at a time: each runs at twice the shared speed
    (4, 1, 4 / 2),  # alone, a rank runs no faster than its `contention` allows
    (4, 2, 1 / 2 + 3 / 2 + 1 / 2),  # two of four stages at work: twice as fast
    (2, 4, 1 / 2 + 3 + 1 / 2),  # both stages at work in the middle: every rank busy
])
def test_ranks_sharing_cores_run_the_fill_and_drain_faster(p, m, slots):
    """With ``contention`` ranks per core, a slot's figure holds with every rank busy; a slot
    with ``a`` of ``p`` stages at work runs ``min(contention, p / a)`` times faster."""
    from shoal.planning.costs import schedule_slots

    assert schedule_slots(m, p, 2.0) == pytest.approx(slots)
    assert schedule_slots(m, p, 1.0) == m + p - 1
    c = Candidate(1, p, 1, microbatches=m)
    shared = model(uniform(n=8), batch=64, layer_overhead=1e-5, contention=2.0).estimate(c)
    own = model(uniform(n=8), batch=64, layer_overhead=1e-5).estimate(c)
    compute = shared.time["compute"]
    assert compute == own.time["compute"]
    assert compute + shared.time["pipeline_bubble"] == pytest.approx(max(m, slots) / m * compute)
    assert shared.step_seconds <= own.step_seconds


def test_without_a_pipeline_sharing_cores_changes_nothing():
    c = Candidate(1, 1, 16, microbatches=4)
    assert (model(contention=2.0).estimate(c).time == model().estimate(c).time)


def test_pipeline_stages_each_hold_their_share_of_the_weights():
    profile = uniform(n=8)
    estimate = model(profile).estimate(Candidate(1, 4, 1, microbatches=4))
    assert states(estimate) == 16 * profile.params / 4


# -- communication ---------------------------------------------------------------------------

def test_tensor_parallel_time_follows_megatrons_all_reduce_volume():
    s_h = 1e4  # s*h of each layer: tp_comm is two forward all-reduces of it, 2 bytes each
    profile = uniform(n=8, tp_comm=2 * 2 * s_h)
    assert model(profile).estimate(Candidate(1, 1, 1)).time["tensor_parallel"] == 0.0
    t, batch = 2, 16
    estimate = model(profile, batch=batch, alpha_intra=0.0).estimate(Candidate(t, 1, 1))
    # section 3.5: 4 all-reduces of b*s*h per layer (2 forward, 2 backward), 16-bit, ring
    expected = 8 * 4 * batch * s_h * 2 * 2 * (t - 1) / t / 200e9
    assert estimate.time["tensor_parallel"] == pytest.approx(expected)


def test_data_parallel_time_is_the_gradient_ring_all_reduce():
    profile = uniform()
    assert model(profile).estimate(Candidate(1, 1, 1)).time["data_parallel"] == 0.0
    d, alpha = 8, 10e-6  # one host: the ring stays on its links
    estimate = model(profile, alpha_intra=alpha).estimate(Candidate(1, 1, d))
    grads = 2 * profile.params  # fp16 gradients
    assert estimate.time["data_parallel"] == pytest.approx(
        2 * (d - 1) / d * grads / 200e9 + 2 * (d - 1) * alpha)


def test_overlap_hides_data_parallel_time_behind_the_backward():
    exposed = model(overlap=0.0).estimate(Candidate(1, 1, 8)).time["data_parallel"]
    hidden = model(overlap=0.5).estimate(Candidate(1, 1, 8)).time["data_parallel"]
    assert 0 < hidden < exposed


def test_compute_is_three_forwards_at_the_device_rate():
    profile = uniform(n=8, flops=1e9)
    estimate = model(profile, batch=64).estimate(Candidate(1, 1, 1))
    assert estimate.time["compute"] == pytest.approx(3 * 8 * 1e9 * 64 / 100e12)


def test_each_later_microbatch_adds_its_gradients_to_those_held():
    profile = uniform()
    cost = model(profile, precision="fp16", hbm=1e12)
    assert "gradient_accumulation" not in cost.estimate(Candidate(1, 1, 8)).time
    four = cost.estimate(Candidate(1, 1, 8, microbatches=4)).time
    # three additions of 16-bit gradients: read the held and the new, write the sum
    assert four["gradient_accumulation"] == pytest.approx(3 * profile.params * 3 * 2 / 1e12)
    # a pipeline stage accumulates only its own layers' gradients
    staged = cost.estimate(Candidate(1, 2, 4, microbatches=4)).time
    assert staged["gradient_accumulation"] == pytest.approx(four["gradient_accumulation"] / 2)


def test_a_sharding_group_across_hosts_moves_its_bytes_hierarchically():
    small = Layer("block", 800_000, 1e9, 1e6, 0.0, 1e4, split=True, repeated=True,
                  largest=600_000)  # persistent: only the step's scatter and refresh remain
    cost = model(ModelProfile("small", [small] * 4), intra_bw=100e9, net_bw=10e9, overlap=0.0)
    got = cost.estimate(Candidate(1, 1, 16, sharded=16)).time["sharded_data_parallel"]
    nbytes = 2 * 4 * 800_000
    # inside each host of 8, then across the 2 hosts, the host's ranks sharing its network
    one = (gather_time(nbytes, 8, 100e9, 0.0) + nbytes / 2 / 10e9
           + 7 * cost.hw.alpha_intra + cost.hw.alpha_net)
    assert got == pytest.approx(2 * one)


def test_a_sharding_group_a_tensor_group_apart_crosses_hosts():
    small = Layer("block", 800_000, 1e9, 1e6, 0.0, 1e4, split=True, repeated=True,
                  largest=600_000)
    cost = model(ModelProfile("small", [small] * 4), intra_bw=100e9, net_bw=10e9, overlap=0.0)
    # tensor 8 fills each host: the two sharding ranks of a tensor rank are on two hosts,
    # and the host's 8 groups cross its network at once
    got = cost.estimate(Candidate(8, 1, 2, sharded=2)).time["sharded_data_parallel"]
    nbytes = 2 * 4 * 800_000 / 8
    one = 8 * nbytes / 2 / 10e9 + cost.hw.alpha_net
    assert got == pytest.approx(2 * one)


# -- operations dispatched -------------------------------------------------------------------

def with_ops(ops, flops=1e9, n=8):
    layer = Layer("block", 1_000_000, flops, act_split=1e6, act_kept=0.0, boundary=1e4,
                  split=True, repeated=True, ops=ops)
    return ModelProfile("ops", [layer] * n)


def test_cpu_ranks_pay_for_every_operation_a_layer_dispatches():
    """A layer of 40 operations costs 20 tiny module calls per pass on CPU ranks, one where
    nobody counted them; the backward's passes are two."""
    overhead, batch = 1e-4, 64
    counted = model(with_ops(40), batch=batch, layer_overhead=overhead,
                    dispatch_hidden=False).estimate(Candidate(1, 1, 1))
    uncounted = model(with_ops(0), batch=batch, layer_overhead=overhead,
                      dispatch_hidden=False).estimate(Candidate(1, 1, 1))
    arithmetic = 3 * 8 * 1e9 * batch / 100e12
    assert uncounted.time["compute"] == pytest.approx(arithmetic + 3 * 8 * overhead)
    assert counted.time["compute"] == pytest.approx(arithmetic + 3 * 8 * 20 * overhead)


@pytest.mark.parametrize("flops, dispatch_shows", [(1e10, False), (1e4, True)])
def test_a_gpu_hides_dispatch_behind_arithmetic_that_outlasts_it(flops, dispatch_shows):
    overhead, batch = 1e-4, 64
    estimate = model(with_ops(40, flops=flops), batch=batch, layer_overhead=overhead).estimate(
        Candidate(1, 1, 1))
    arithmetic = 3 * 8 * flops * batch / 100e12
    hooks, dispatch = 3 * 8 * overhead, 3 * 8 * 19 * overhead
    assert estimate.time["compute"] == pytest.approx(
        hooks + (dispatch if dispatch_shows else arithmetic))


def test_recomputing_a_block_dispatches_its_operations_again():
    c = Candidate(1, 1, 1, checkpointing=True)
    costly = model(with_ops(40), layer_overhead=1e-4, dispatch_hidden=False).estimate(c)
    cheap = model(with_ops(0), layer_overhead=1e-4, dispatch_hidden=False).estimate(c)
    assert costly.time["recompute"] - cheap.time["recompute"] == pytest.approx(8 * 19 * 1e-4)


# -- pipeline sends --------------------------------------------------------------------------

def test_a_pipeline_sends_each_boundary_once_then_the_largest_per_later_microbatch():
    """Along the critical path: every stage's output for the first microbatch (the last
    stage's, the model's output, back to the first stage), each later microbatch's largest,
    and the gradients back; not (m + p - 1) times the slowest stage's."""
    small, large = 1e3, 1e5  # bytes per sample: the blocks' outputs, the model's output
    block = Layer("block", 1000, 1e6, act_split=1e3, act_kept=0.0, boundary=small,
                  split=True, repeated=True)
    head = attrs.evolve(block, name="head", boundary=large, repeated=False)
    profile = ModelProfile("p2p", [block] * 7 + [head])
    bw, alpha, batch = 10e9, 1e-5, 16
    for p, m in [(2, 1), (4, 1), (4, 8)]:
        c = Candidate(1, p, 1, microbatches=m)
        estimate = model(profile, batch=batch, intra_bw=bw, alpha_intra=alpha).estimate(c)
        micro = batch / m  # fp16: the profile's 16-bit unit
        sends = [small * micro / bw + alpha] * (p - 1) + [large * micro / bw + alpha]
        assert estimate.time["pipeline_p2p"] == pytest.approx(
            2 * (sum(sends) + (m - 1) * max(sends)))
    assert model(profile).estimate(Candidate(1, 1, 1)).time["pipeline_p2p"] == 0.0


def _runtime_stages(net, sample, pp):
    """The runtime's auto-partition of ``net`` (SMP's rule): each top-level unit's rank,
    from a traced forward as the runtime records it."""
    import torch
    from shoal.modelparallel.torch import placement

    names = {m: n for n, m in net.named_modules()}
    traces = {}

    def pre(module, _args):
        traces.setdefault(names[module], placement.ModuleTrace(order=len(traces)))

    def post(module, _args, out):
        name = names[module]
        traces[name] = placement.ModuleTrace(order=traces[name].order,
                                             output_bytes=out.numel() * out.element_size())

    for module in net.modules():
        module.register_forward_pre_hook(pre)
        module.register_forward_hook(post)
    with torch.no_grad():
        net(sample)
    return placement.auto_assignment(net, traces, pp, 0.8, False)


@pytest.mark.parametrize("vocab, batch", [(4096, 8), (512, 8), (4096, 2)])
def test_pipeline_stages_are_the_ones_the_runtime_auto_partition_makes(tmp_path, vocab, batch):
    """The plans leave SMP's auto-partition on: the planner must price the stages it makes
    (parameter bytes and module outputs at 0.8, module count at 0.2), not stages balanced
    by FLOPs. A large vocabulary's logits weigh the head's stage down."""
    torch = pytest.importorskip("torch")
    from shoal.planning.tracing import profile_module

    nn = torch.nn
    torch.manual_seed(0)

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(vocab, 128)
            self.blocks = nn.ModuleList(nn.Sequential(
                nn.LayerNorm(128), nn.Linear(128, 512), nn.GELU(), nn.Linear(512, 128))
                for _ in range(4))
            self.norm, self.head = nn.LayerNorm(128), nn.Linear(128, vocab)

        def forward(self, ids):
            x = self.embed(ids)
            for block in self.blocks:
                x = x + block(x)
            return self.head(self.norm(x))

    net = Net()
    ids = torch.randint(vocab, (batch, 32))
    runtime = _runtime_stages(net, ids, 2)
    with torch.device("meta"):
        meta = Net()
    profile = profile_module(meta, (1, 32))
    ranges = CostModel(Workload(profile, batch, "fp32", "adam"), hardware()).ranges(2, batch)
    planned = {}
    for stage, (a, b) in enumerate(ranges):
        for layer in profile.layers[a:b]:
            planned[layer.name] = stage
    blocks = [runtime[f"blocks.{i}"] for i in range(4)]
    assert [planned[f"block{i}"] for i in range(4)] == blocks
    assert planned["epilogue"] == runtime["head"]
