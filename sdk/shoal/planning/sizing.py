"""Sizing and scaling calculations behind the advisor's recommendations.

Four plans, each a pure function returning a frozen attrs result:

* :func:`plan_fsx` -- the I/O throughput a multi-node job needs (data set / epoch time) and,
  per FSx for Lustre deployment type, the smallest valid storage capacity that delivers it;
* :func:`scale_learning_rate` -- the linear scaling rule with a gradual warm-up
  (Goyal et al., "Accurate, Large Minibatch SGD", sections 2 and 3);
* :func:`plan_microbatches` -- model-parallel microbatch counts that divide the batch, and
  whether the last, smaller batch of an epoch must be dropped;
* :func:`plan_topology` -- ranks, hosts and GPUs per instance, and the bytes each rank sends
  per AllReduce for a flat ring versus Shoal's hierarchical (intra-host shard, inter-host
  shard exchange) scheme.
"""

from __future__ import annotations

import math

import attrs

from shoal.errors import ValidationError
from shoal.planning import instances

# ---------------------------------------------------------------- shared validators


def _positive(_, attribute, value):
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValidationError(f"'{attribute.name}' must be a number (got {value!r})")
    if not value > 0:
        raise ValidationError(f"'{attribute.name}' must be > 0 (got {value!r})")


def _at_least_one(_, attribute, value):
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValidationError(f"'{attribute.name}' must be an int (got {value!r})")
    if value < 1:
        raise ValidationError(f"'{attribute.name}' must be >= 1 (got {value!r})")


def _non_negative(_, attribute, value):
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValidationError(f"'{attribute.name}' must be an int (got {value!r})")
    if value < 0:
        raise ValidationError(f"'{attribute.name}' must be >= 0 (got {value!r})")


def _optional(validator):
    def check(instance, attribute, value):
        if value is not None:
            validator(instance, attribute, value)
    return check


# ---------------------------------------------------------------- FSx for Lustre

# FSx writes capacities in GiB and calls 1200 GiB "1.2 TiB"; throughput is MB/s per
# (such a) TiB, so 1200 GiB of SCRATCH_2 at 200 MB/s/TiB is the documented 240 MB/s.
GIB_PER_TIB = 1000
BYTES_PER_GB = 10**9
BYTES_PER_GIB = 2**30


@attrs.frozen
class DeploymentType:
    """An FSx for Lustre SSD deployment type at one throughput tier.

    Valid capacities: each of ``first_capacities_gib``, then multiples of ``step_gib``.
    """

    name: str
    per_unit_throughput: int  # MB/s per TiB of storage
    first_capacities_gib: tuple[int, ...]
    step_gib: int

    @property
    def label(self) -> str:
        persistent = self.name.startswith("PERSISTENT")
        return f"{self.name} ({self.per_unit_throughput})" if persistent else self.name

    def capacities(self, at_least_gib: float) -> int:
        """The smallest valid capacity (GiB) of at least ``at_least_gib``."""
        for first in self.first_capacities_gib:
            if first >= at_least_gib:
                return first
        return max(self.step_gib, math.ceil(at_least_gib / self.step_gib) * self.step_gib)

    def throughput_mbps(self, capacity_gib: int) -> float:
        return capacity_gib / GIB_PER_TIB * self.per_unit_throughput


def _persistent(name: str, tiers: tuple[int, ...]) -> list[DeploymentType]:
    return [DeploymentType(name, tier, (1200,), 2400) for tier in tiers]


#: The SSD deployment types: SCRATCH_1 is 1.2 or 2.4 TiB then multiples of 3.6 TiB; the
#: others 1.2 TiB then multiples of 2.4 TiB (FSx for Lustre's CreateFileSystem limits).
DEPLOYMENT_TYPES: tuple[DeploymentType, ...] = (
    DeploymentType("SCRATCH_1", 200, (1200, 2400), 3600),
    DeploymentType("SCRATCH_2", 200, (1200,), 2400),
    *_persistent("PERSISTENT_1", (50, 100, 200)),
    *_persistent("PERSISTENT_2", (125, 250, 500, 1000)),
)

CACHE_NOTE = (
    "throughput can improve after the first epoch as the file servers' cache builds; "
    "try a throughput equal to or slightly below the estimate and raise it until the "
    "I/O bottleneck is gone"
)


@attrs.frozen
class FsxOption:
    """One deployment type sized for the job."""

    deployment_type: str
    per_unit_throughput: int
    storage_gib: int
    throughput_mbps: float
    minimum_storage_gib: int
    minimum_throughput_mbps: float


@attrs.frozen
class FsxPlan:
    """What a data set read once per epoch needs from FSx for Lustre."""

    dataset_gb: float = attrs.field(validator=_positive)
    epoch_seconds: float = attrs.field(validator=_positive)
    instance_count: int = attrs.field(validator=_at_least_one)
    options: tuple[FsxOption, ...] = ()
    note: str = CACHE_NOTE

    @property
    def required_mbps(self) -> float:
        """The whole data set once per epoch: dataset / epoch time, in MB/s."""
        return self.dataset_gb * 1000 / self.epoch_seconds

    @property
    def per_instance_mbps(self) -> float:
        return self.required_mbps / self.instance_count

    def option(self, deployment_type: str, per_unit_throughput: int | None = None) -> FsxOption:
        for option in self.options:
            if option.deployment_type == deployment_type and per_unit_throughput in (
                None, option.per_unit_throughput,
            ):
                return option
        raise KeyError(deployment_type)


def plan_fsx(dataset_gb: float, epoch_seconds: float, instance_count: int = 1,
             deployment_type: str | None = None) -> FsxPlan:
    """Size FSx for Lustre for a job reading ``dataset_gb`` every ``epoch_seconds``.

    Each option is the smallest valid capacity that both holds the data set and reaches the
    required throughput; ``deployment_type`` (e.g. "SCRATCH_2") keeps only that type's tiers.
    """
    plan = FsxPlan(dataset_gb, epoch_seconds, instance_count)
    names = {t.name for t in DEPLOYMENT_TYPES}
    if deployment_type is not None and deployment_type not in names:
        raise ValidationError(
            f"'deployment_type' must be in {sorted(names)} (got {deployment_type!r})"
        )
    dataset_gib = dataset_gb * BYTES_PER_GB / BYTES_PER_GIB
    options = []
    for kind in DEPLOYMENT_TYPES:
        if deployment_type not in (None, kind.name):
            continue
        for_speed = plan.required_mbps / kind.per_unit_throughput * GIB_PER_TIB
        storage = kind.capacities(max(for_speed, dataset_gib))
        minimum = kind.capacities(dataset_gib)
        options.append(FsxOption(kind.name, kind.per_unit_throughput, storage,
                                 kind.throughput_mbps(storage), minimum,
                                 kind.throughput_mbps(minimum)))
    return attrs.evolve(plan, options=tuple(options))


# ---------------------------------------------------------------- learning rate scaling


@attrs.frozen
class LearningRatePlan:
    """The linear scaling rule: k times the batch, k times the learning rate, reached
    through a linear warm-up from the base rate over ``warmup_steps``."""

    base_lr: float = attrs.field(validator=_positive)
    base_batch: int = attrs.field(validator=_at_least_one)
    new_global_batch: int = attrs.field(validator=_at_least_one)
    warmup_steps: int = attrs.field(default=0, validator=_non_negative)

    @property
    def factor(self) -> float:
        return self.new_global_batch / self.base_batch

    @property
    def scaled_lr(self) -> float:
        return self.base_lr * self.factor

    def lr_at(self, step: int) -> float:
        """The learning rate at ``step`` (0-based): a linear ramp, then the scaled rate."""
        if step < 0:
            raise ValidationError(f"'step' must be >= 0 (got {step!r})")
        if step >= self.warmup_steps:
            return self.scaled_lr
        return self.base_lr + (self.scaled_lr - self.base_lr) * step / self.warmup_steps


def scale_learning_rate(base_lr: float, base_batch: int, new_global_batch: int,
                        warmup_steps: int = 0) -> LearningRatePlan:
    """The learning rate for ``new_global_batch`` when ``base_lr`` suits ``base_batch``."""
    return LearningRatePlan(base_lr, base_batch, new_global_batch, warmup_steps)


def warmup_schedule(plan: LearningRatePlan, steps: int | None = None) -> list[float]:
    """The learning rate of each of the first ``steps`` steps (default: the warm-up + 1)."""
    count = plan.warmup_steps + 1 if steps is None else steps
    return [plan.lr_at(step) for step in range(count)]


# ---------------------------------------------------------------- model-parallel microbatches

DEFAULT_MICROBATCH_CANDIDATES = (1, 2, 4, 8, 16, 32)
#: The model-parallel library's suggested starting points.
RECOMMENDED_MICROBATCHES = (2, 4)


@attrs.frozen
class MicrobatchOption:
    microbatches: int
    microbatch_size: int
    #: The epoch's last, smaller batch is not divisible: drop it (drop_last / drop_remainder).
    drop_last: bool
    recommended: bool


@attrs.frozen
class MicrobatchPlan:
    batch_size: int = attrs.field(validator=_at_least_one)
    dataset_size: int | None = attrs.field(default=None, validator=_optional(_at_least_one))
    options: tuple[MicrobatchOption, ...] = ()
    rejected: tuple[int, ...] = ()  # candidates that do not divide the batch size

    @property
    def last_batch(self) -> int | None:
        """The size of the epoch's last batch when smaller than the others, else None."""
        if self.dataset_size is None or self.dataset_size % self.batch_size == 0:
            return None
        return self.dataset_size % self.batch_size

    @property
    def valid(self) -> tuple[int, ...]:
        return tuple(option.microbatches for option in self.options)


def plan_microbatches(batch_size: int, candidates=DEFAULT_MICROBATCH_CANDIDATES,
                      dataset_size: int | None = None) -> MicrobatchPlan:
    """The microbatch counts among ``candidates`` that divide ``batch_size``."""
    plan = MicrobatchPlan(batch_size, dataset_size)
    for count in candidates:
        _check_count(count)
    last = plan.last_batch
    options = tuple(
        MicrobatchOption(m, batch_size // m, bool(last) and last % m != 0,
                         m in RECOMMENDED_MICROBATCHES)
        for m in candidates if batch_size % m == 0
    )
    rejected = tuple(m for m in candidates if batch_size % m)
    return attrs.evolve(plan, options=options, rejected=rejected)


def _check_count(count) -> None:
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise ValidationError(f"'candidates' must hold ints >= 1 (got {count!r})")


# ---------------------------------------------------------------- data-parallel topology

# GPUs per instance type: the one instance table, which the strategy planner reads too.
gpus_per_instance = instances.gpus_per_instance


@attrs.frozen
class AllreduceTraffic:
    """Bytes sent per AllReduce of ``nbytes`` (all figures per rank unless named per host)."""

    nbytes: int
    ring_bytes_per_rank: float  # flat ring over every rank: 2(n-1)/n * N
    ring_network_bytes_per_host: float  # the one ring edge leaving a host carries the same
    intra_host_bytes_per_rank: float  # reduce-scatter + all-gather in the host: 2(l-1)/l * N
    inter_host_bytes_per_rank: float  # each rank exchanges its N/l shard: 2(h-1)/h * N/l
    network_streams_per_host: int  # hierarchical: every local rank uses the network at once

    @property
    def network_bytes_per_stream_ratio(self) -> float:
        """How many times fewer bytes one network stream carries (ring / hierarchical)."""
        if not self.inter_host_bytes_per_rank:
            return math.inf if self.ring_network_bytes_per_host else 1.0
        return self.ring_network_bytes_per_host / self.inter_host_bytes_per_rank


@attrs.frozen
class Topology:
    instance_type: str | None
    hosts: int = attrs.field(validator=_at_least_one)
    local_size: int = attrs.field(validator=_at_least_one)

    @property
    def world_size(self) -> int:
        return self.hosts * self.local_size

    def allreduce(self, nbytes: int) -> AllreduceTraffic:
        """The traffic of one AllReduce of ``nbytes`` in this topology."""
        if isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes < 0:
            raise ValidationError(f"'nbytes' must be an int >= 0 (got {nbytes!r})")
        n, local, hosts = self.world_size, self.local_size, self.hosts
        ring = 2 * (n - 1) / n * nbytes
        return AllreduceTraffic(
            nbytes=nbytes,
            ring_bytes_per_rank=ring,
            ring_network_bytes_per_host=ring if hosts > 1 else 0.0,
            intra_host_bytes_per_rank=2 * (local - 1) / local * nbytes,
            inter_host_bytes_per_rank=2 * (hosts - 1) / hosts * nbytes / local,
            network_streams_per_host=local if hosts > 1 else 0,
        )


def plan_topology(instance_type: str | None, instance_count: int,
                  processes_per_host: int | None = None) -> Topology:
    """Hosts and ranks per host: ``processes_per_host`` or one per GPU (one without GPUs)."""
    local = processes_per_host or gpus_per_instance(instance_type) or 1
    return Topology(instance_type, instance_count, local)
