"""The planner: FSx for Lustre sizing, learning-rate scaling, microbatches, topology."""

import pytest
from shoal.errors import ValidationError
from shoal.planning import sizing


def test_the_seed_fsx_example_is_reproduced():
    # 100 GB data set, 30 s epochs, 4 nodes: about 3.3 GB/s; SCRATCH_2 at 1.2 TiB gives 240 MB/s
    plan = sizing.plan_fsx(100, 30, 4)
    assert plan.required_mbps == pytest.approx(3333.3, abs=0.1)
    assert plan.per_instance_mbps == pytest.approx(833.3, abs=0.1)
    scratch2 = plan.option("SCRATCH_2")
    assert scratch2.minimum_storage_gib == 1200
    assert scratch2.minimum_throughput_mbps == 240
    # 1.2 TiB falls far short; the smallest multiple of 2.4 TiB reaching 3.33 GB/s is 16.8 TiB
    assert scratch2.storage_gib == 16800
    assert scratch2.throughput_mbps == 3360
    assert "after the first epoch" in plan.note


@pytest.mark.parametrize("kind, tier, storage, throughput", [
    ("SCRATCH_1", 200, 18000, 3600),       # 1.2, 2.4, then multiples of 3.6 TiB
    ("PERSISTENT_1", 50, 67200, 3360),
    ("PERSISTENT_1", 200, 16800, 3360),
    ("PERSISTENT_2", 125, 28800, 3600),
    ("PERSISTENT_2", 1000, 4800, 4800),
])
def test_each_deployment_type_gets_its_smallest_valid_capacity(kind, tier, storage, throughput):
    option = sizing.plan_fsx(100, 30, 4).option(kind, tier)
    assert (option.storage_gib, option.throughput_mbps) == (storage, throughput)


def test_every_tier_of_the_docs_is_planned():
    tiers = {(o.deployment_type, o.per_unit_throughput) for o in sizing.plan_fsx(1, 1).options}
    assert tiers == {("SCRATCH_1", 200), ("SCRATCH_2", 200), ("PERSISTENT_1", 50),
                     ("PERSISTENT_1", 100), ("PERSISTENT_1", 200), ("PERSISTENT_2", 125),
                     ("PERSISTENT_2", 250), ("PERSISTENT_2", 500), ("PERSISTENT_2", 1000)}


def test_small_needs_get_the_first_capacities():
    plan = sizing.plan_fsx(10, 3600, 2)  # 2.8 MB/s: the minimum suffices
    assert plan.option("SCRATCH_2").storage_gib == 1200
    assert sizing.DEPLOYMENT_TYPES[0].capacities(1500) == 2400  # SCRATCH_1's second size


def test_capacity_also_holds_the_data_set():
    # 5000 GB read slowly: throughput needs little, but 4657 GiB must fit
    option = sizing.plan_fsx(5000, 10**6, 1).option("SCRATCH_2")
    assert option.storage_gib == 4800
    assert option.minimum_storage_gib == 4800


def test_one_deployment_type_only():
    plan = sizing.plan_fsx(100, 30, 4, deployment_type="PERSISTENT_2")
    assert {o.deployment_type for o in plan.options} == {"PERSISTENT_2"}
    with pytest.raises(ValidationError, match="'deployment_type' must be in"):
        sizing.plan_fsx(100, 30, 4, deployment_type="SCRATCH_3")


@pytest.mark.parametrize("args, message", [
    ((0, 30, 1), "'dataset_gb' must be > 0 (got 0)"),
    ((100, -1, 1), "'epoch_seconds' must be > 0 (got -1)"),
    ((100, 30, 0), "'instance_count' must be >= 1 (got 0)"),
])
def test_fsx_arguments_are_checked(args, message):
    with pytest.raises(ValidationError, match=message.replace("(", r"\(").replace(")", r"\)")):
        sizing.plan_fsx(*args)


def test_linear_scaling_rule():
    plan = sizing.scale_learning_rate(0.1, 256, 2048, warmup_steps=4)
    assert plan.factor == 8
    assert plan.scaled_lr == pytest.approx(0.8)
    assert sizing.warmup_schedule(plan) == pytest.approx([0.1, 0.275, 0.45, 0.625, 0.8])
    assert plan.lr_at(100) == pytest.approx(0.8)


def test_no_warmup_is_the_scaled_rate_at_once():
    plan = sizing.scale_learning_rate(0.01, 32, 64)
    assert sizing.warmup_schedule(plan, 3) == pytest.approx([0.02, 0.02, 0.02])


def test_learning_rate_arguments_are_checked():
    with pytest.raises(ValidationError, match="'base_batch' must be >= 1"):
        sizing.scale_learning_rate(0.1, 0, 64)
    with pytest.raises(ValidationError, match=r"'warmup_steps' must be >= 0 \(got -5\)"):
        sizing.scale_learning_rate(0.1, 32, 64, warmup_steps=-5)
    with pytest.raises(ValidationError, match="'step' must be >= 0"):
        sizing.scale_learning_rate(0.1, 1, 2).lr_at(-1)


def test_microbatches_divide_the_batch():
    plan = sizing.plan_microbatches(24, (1, 2, 4, 5, 8, 16))
    assert plan.valid == (1, 2, 4, 8)
    assert plan.rejected == (5, 16)
    assert [o.microbatch_size for o in plan.options] == [24, 12, 6, 3]
    assert [o.microbatches for o in plan.options if o.recommended] == [2, 4]


def test_last_partial_batch_must_be_dropped_when_not_divisible():
    plan = sizing.plan_microbatches(8, (2, 4, 8), dataset_size=1002)  # last batch: 2
    assert plan.last_batch == 2
    assert {o.microbatches: o.drop_last for o in plan.options} == {2: False, 4: True, 8: True}
    assert sizing.plan_microbatches(8, (4,), dataset_size=1000).last_batch is None


def test_microbatch_arguments_are_checked():
    with pytest.raises(ValidationError, match="'batch_size' must be >= 1"):
        sizing.plan_microbatches(0)
    with pytest.raises(ValidationError, match="'candidates' must hold ints >= 1"):
        sizing.plan_microbatches(8, (0,))


@pytest.mark.parametrize("instance_type, gpus", [
    ("ml.p3.16xlarge", 8), ("ml.p3dn.24xlarge", 8), ("ml.p4d.24xlarge", 8),
    ("ml.p4de.24xlarge", 8), ("ml.p5.48xlarge", 8), ("ml.g5.48xlarge", 8),
    ("ml.g5.12xlarge", 4), ("ml.g4dn.12xlarge", 4), ("ml.c5.xlarge", None), ("local", None),
])
def test_gpus_per_instance(instance_type, gpus):
    assert sizing.gpus_per_instance(instance_type) == gpus


def test_topology_ranks_and_hosts():
    topo = sizing.plan_topology("ml.p4d.24xlarge", 4)
    assert (topo.hosts, topo.local_size, topo.world_size) == (4, 8, 32)
    assert sizing.plan_topology("ml.p4d.24xlarge", 2, processes_per_host=4).world_size == 8
    assert sizing.plan_topology("ml.c5.xlarge", 3).world_size == 3


def test_allreduce_traffic_ring_versus_hierarchical():
    traffic = sizing.plan_topology("ml.p4d.24xlarge", 4).allreduce(32 * 10**6)
    n, local, hosts, size = 32, 8, 4, 32 * 10**6
    assert traffic.ring_bytes_per_rank == pytest.approx(2 * (n - 1) / n * size)
    assert traffic.ring_network_bytes_per_host == pytest.approx(2 * (n - 1) / n * size)
    assert traffic.intra_host_bytes_per_rank == pytest.approx(2 * (local - 1) / local * size)
    assert traffic.inter_host_bytes_per_rank == pytest.approx(2 * (hosts - 1) / hosts * size / local)
    assert traffic.network_streams_per_host == 8
    # each network stream carries about an eighth of the ring's bytes
    assert traffic.network_bytes_per_stream_ratio == pytest.approx(
        (2 * 31 / 32) / (2 * 3 / 4 / 8))


def test_one_host_sends_nothing_over_the_network():
    traffic = sizing.plan_topology("ml.p4d.24xlarge", 1).allreduce(1000)
    assert traffic.inter_host_bytes_per_rank == 0
    assert traffic.ring_network_bytes_per_host == 0
    assert traffic.network_streams_per_host == 0
    with pytest.raises(ValidationError, match="'nbytes' must be an int >= 0"):
        sizing.plan_topology("ml.p4d.24xlarge", 1).allreduce(-1)
