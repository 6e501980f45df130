"""The strategy planner: which parallelism a model should train with, and why.

:func:`plan_strategy` enumerates SMP v1's legal configurations for a cluster (tensor degree a
power of two within a host and dividing the heads, pipeline degree at most the layers,
sharded data parallelism dividing the data-parallel degree and only without pipelining,
optimizer-state sharding only without it, microbatches dividing each replica's batch,
activation checkpointing of the repeated blocks), prices each with :mod:`shoal.planning.costs`,
drops those that do not fit in memory, and returns the fastest as a :class:`StrategyPlan`: the
estimator's ``distribution``, the degrees, the predicted step time and memory term by term,
and the runners-up with the reason each lost. No trial runs: the plan comes from the model.

Plain data parallelism (Shoal's data-parallel library) is chosen whenever the model fits
without the model-parallel library and it is the fastest. Activation checkpointing is not an
SMP v1 ``distribution`` parameter: the plan carries it as ``SHOAL_ACTIVATION_CHECKPOINTING``
in the job's environment, which Shoal's ``smp`` applies to the model's stack of blocks, and as
the one-line script change for other images.
"""

from __future__ import annotations

import time
from collections.abc import Mapping

import attrs

from shoal import frameworks
from shoal.errors import ValidationError
from shoal.planning import explain
from shoal.planning import instances as instances_
from shoal.planning.costs import (
    GIB,
    OPTIMIZER_STATE_BYTES,
    PRECISIONS,
    Candidate,
    CostModel,
    Estimate,
    Hardware,
    Workload,
)
from shoal.planning.models import ModelProfile

CHECKPOINTING_ENV = "SHOAL_ACTIVATION_CHECKPOINTING"
SCRIPT_CHANGE = ("smp.set_activation_checkpointing(block) for each block of the model's layer "
                 "stack, after smp.DistributedModel(model)")
# SMP refuses optimizer-state sharding without it, on every image
BUCKET_VIEW_CHANGE = ("smp.DistributedModel(model, gradient_as_bucket_view=True): "
                      "shard_optimizer_state needs it")
PINS = ("data", "pipeline", "tensor", "sharded_data", "microbatches", "checkpointing",
        "optimizer_sharding")
SMDDP_INSTANCE_TYPES = ("ml.p3.16xlarge", "ml.p3dn.24xlarge", "ml.p4d.24xlarge",
                        "ml.p4de.24xlarge")
RESERVED_GIB = 1.0  # CUDA context, NCCL buffers and allocator slack per device
USABLE_FRACTION = 0.9


@attrs.frozen
class Calibration:
    """Measured figures that replace the instance table's (``--calibrate``)."""

    flops: float | None = None  # effective FLOP/s per device
    layer_overhead: float | None = None
    intra_bw: float | None = None
    net_bw: float | None = None
    alpha_intra: float | None = None
    alpha_net: float | None = None
    hbm: float | None = None
    memory: float | None = None  # usable bytes per device
    overlap: float | None = None  # of a collective that computation beside it hides
    contention: float | None = None  # ranks per compute unit (CPU ranks sharing cores)

    @classmethod
    def from_dict(cls, data: Mapping) -> Calibration:
        unknown = sorted(set(data) - {f.name for f in attrs.fields(cls)})
        if unknown:
            raise ValidationError(f"unknown calibration key(s) {', '.join(unknown)}")
        return cls(**{k: float(v) for k, v in data.items() if v is not None})


@attrs.frozen
class Constraints:
    """What the user fixes or forbids."""

    pins: Mapping[str, int] = attrs.field(factory=dict, converter=dict)
    processes_per_host: int | None = None
    efficiency: float = 0.5  # achieved fraction of the GPUs' peak on the model's matmuls
    layer_overhead: float = 60e-6  # seconds per module call and pass (launches, hooks)
    max_microbatches: int = 64
    alternatives: int = 4
    # the model-parallel library must beat plain data parallelism by this much to be chosen:
    # its per-step work (splitting microbatches, hooks, tracing) is not in the cost model
    library_margin: float = 0.05
    # configurations within this fraction of the fastest count as equally fast; of those the
    # one with the most memory to spare is chosen (memory estimates err, OOMs cost a job)
    near: float = 0.02

    def __attrs_post_init__(self):
        unknown = sorted(set(self.pins) - set(PINS))
        if unknown:
            raise ValidationError(f"unknown pin(s) {', '.join(unknown)}; pins: "
                                  f"{', '.join(PINS)}")
        if not 0 < self.efficiency <= 1:
            raise ValidationError(f"'efficiency' must be in (0, 1] (got {self.efficiency})")


@attrs.frozen
class StrategyPlan:
    """The planner's answer."""

    distribution: dict
    degrees: dict
    microbatches: int
    activation_checkpointing: bool
    predicted: dict
    alternatives: list
    reason: str
    environment: dict
    script_changes: list  # what the training script must do (SMP v1 sets these in code)
    batch_per_rank: int
    considered: int
    plan_seconds: float

    def to_dict(self) -> dict:
        return attrs.asdict(self)


# -- hardware --------------------------------------------------------------------------------
def hardware(instance_type: str, instance_count: int, precision: str,
             constraints: Constraints = Constraints(),
             calibration: Calibration | None = None) -> Hardware:
    """The cluster's effective figures: the instance table's, or measured ones."""
    contention = 1.0
    if instance_type in instances_.LOCAL_INSTANCE_TYPES:
        spec = instances_.local_machine(constraints.processes_per_host or 1)
        if instance_type == "local":  # every simulated host's ranks share this machine's cores
            contention = instances_.local_contention(spec.gpus * instance_count)
    else:
        spec = instances_.instance(instance_type)
    per_host = constraints.processes_per_host or spec.gpus
    if per_host > spec.gpus:
        raise ValidationError(f"'processes_per_host' ({per_host}) must be <= the GPUs of "
                              f"{instance_type} ({spec.gpus})")
    figures = dict(
        gpus_per_host=per_host, hosts=instance_count,
        memory=(spec.memory_gib * USABLE_FRACTION - RESERVED_GIB) * GIB,
        flops=spec.tflops(precision) * 1e12 * constraints.efficiency,
        layer_overhead=constraints.layer_overhead, hbm=spec.hbm_gbps * 1e9 * 0.8,
        intra_bw=spec.intra_gbps * 1e9, net_bw=spec.network_gbits / 8 * 1e9 * 0.8,
        contention=contention, dispatch_hidden=instance_type != "local")
    if calibration is not None:
        figures.update({k: v for k, v in attrs.asdict(calibration).items() if v is not None})
        if instance_type == "local":
            # a single-threaded rank alone runs on one core at most: the probe's small matmul
            # reads more than ranks per core (its operands stay in cache when it runs alone),
            # which the model's larger layers do not see
            figures["contention"] = min(figures["contention"], contention)
    return Hardware(**figures)


# -- the search ------------------------------------------------------------------------------
def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def candidates(profile: ModelProfile, hw: Hardware, global_batch: int, pins=None,
               *, model_parallel: bool = True, max_microbatches: int = 64):
    """Every legal configuration of SMP v1 on ``hw`` (pins respected); without
    ``model_parallel``, plain data parallelism over every device alone."""
    pins = dict(pins or {})
    n, per_host = hw.devices, hw.gpus_per_host
    if not model_parallel:
        plain = Candidate(1, 1, n)
        if global_batch % n == 0 and _pinned(plain, pins):
            yield plain
        return
    tensors = [t for t in (1, 2, 4, 8, 16, 32) if t <= per_host and n % t == 0
               and (profile.heads is None or profile.heads % t == 0)]
    checkpoint = (False, True) if profile.blocks else (False,)
    for t in tensors:
        for p in (p for p in _divisors(n // t) if p <= len(profile.layers)):
            d = n // (t * p)
            if global_batch % d:
                continue
            microbatches = [m for m in _divisors(global_batch // d) if m <= max_microbatches]
            for sdp in _divisors(d) if p == 1 else [1]:
                for oss in (False, True) if d > 1 and sdp == 1 else (False,):
                    for m, ckpt in ((m, ckpt) for m in microbatches for ckpt in checkpoint):
                        c = Candidate(t, p, d, sdp, oss, m, ckpt)
                        if _pinned(c, pins):
                            yield c


def _pinned(c: Candidate, pins: Mapping) -> bool:
    values = {"data": c.data, "pipeline": c.pipeline, "tensor": c.tensor,
              "sharded_data": c.sharded, "microbatches": c.microbatches,
              "checkpointing": c.checkpointing, "optimizer_sharding": c.optimizer_sharding}
    return all(values[k] == v for k, v in pins.items())


def plan_strategy(model, *, global_batch: int, instance_type: str, instance_count: int = 1,
                  precision: str = "fp32", optimizer: str = "adam",
                  sequence_length: int | None = None,
                  constraints: Constraints | None = None,
                  calibration: Calibration | None = None) -> StrategyPlan:
    """The fastest legal configuration that fits, with its prediction and the runners-up."""
    started = time.perf_counter()
    constraints = constraints or Constraints()
    profile = _profile(model, sequence_length)
    _check_inputs(global_batch, instance_count, precision, optimizer)
    hw = hardware(instance_type, instance_count, precision, constraints, calibration)
    workload = Workload(profile, global_batch, precision, optimizer)
    costs = CostModel(workload, hw)
    # SageMaker runs neither smdistributed library on p5: data parallelism alone there
    mp_allowed = not frameworks.is_p5_instance(instance_type)
    found = [costs.estimate(c) for c in candidates(
        profile, hw, global_batch, constraints.pins, model_parallel=mp_allowed,
        max_microbatches=constraints.max_microbatches)]
    if not found:
        raise ValidationError(_no_candidate(profile, hw, global_batch, constraints.pins))
    fitting = sorted((e for e in found if e.memory_bytes <= hw.memory), key=explain.order)
    if not fitting:
        raise ValidationError(_too_big(model, found, hw, global_batch, instance_type,
                                       instance_count, precision, optimizer, constraints,
                                       calibration, sequence_length))
    _prefer_headroom(fitting, constraints.near)
    best = _prefer_plain(fitting, constraints.library_margin)
    return _plan(best, fitting, found, hw, workload, instance_type, constraints,
                 time.perf_counter() - started)


def _prefer_headroom(fitting: list, near: float) -> None:
    """Move the leanest of the configurations within ``near`` of the fastest to the front."""
    limit = fitting[0].step_seconds * (1 + near)
    close = [e for e in fitting if e.step_seconds <= limit]
    leanest = min(close, key=lambda e: (e.memory_bytes, explain.order(e)))
    fitting.remove(leanest)
    fitting.insert(0, leanest)


def _prefer_plain(fitting: list, margin: float) -> Estimate:
    """The fastest, unless plain data parallelism is within ``margin`` of it."""
    best = fitting[0]
    plain = next((e for e in fitting if explain.plain(e.candidate)), None)
    if plain is not None and plain.step_seconds <= best.step_seconds * (1 + margin):
        fitting.remove(plain)
        fitting.insert(0, plain)
        return plain
    return best


def _profile(model, sequence_length) -> ModelProfile:
    from shoal.planning import models

    if isinstance(model, ModelProfile):
        return model
    if isinstance(model, models.TransformerSpec):
        spec = model
    elif isinstance(model, str):
        spec = models.parse_description(model)
    elif isinstance(model, Mapping):
        spec = models.from_mapping(dict(model))
    else:
        raise ValidationError(f"model must be a transformer description, a TransformerSpec or "
                              f"a ModelProfile (got {type(model).__name__})")
    if sequence_length is not None:
        spec = attrs.evolve(spec, seq=sequence_length)
    return spec.profile()


def _check_inputs(global_batch, instance_count, precision, optimizer) -> None:
    for name, value in (("global_batch", global_batch), ("instance_count", instance_count)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValidationError(f"'{name}' must be an int >= 1 (got {value!r})")
    if precision not in PRECISIONS:
        raise ValidationError(f"'precision' must be one of {', '.join(PRECISIONS)} "
                              f"(got {precision!r})")
    if optimizer not in OPTIMIZER_STATE_BYTES:
        raise ValidationError(f"'optimizer' must be one of {', '.join(OPTIMIZER_STATE_BYTES)} "
                              f"(got {optimizer!r})")


def _no_candidate(profile, hw: Hardware, global_batch: int, pins) -> str:
    n = hw.devices
    if global_batch < n and not pins:
        return (f"global batch {global_batch} is smaller than every data-parallel degree the "
                f"{n} devices allow with model parallelism; raise --global-batch to a multiple "
                "of the data-parallel degree, or use fewer instances")
    pinned = f" with {', '.join(f'{k}={v}' for k, v in pins.items())}" if pins else ""
    return (f"no legal configuration of {n} devices for global batch {global_batch}{pinned}: "
            f"the data-parallel degree (devices / (tensor x pipeline)) must divide the batch"
            + ("; drop or change the pins" if pins else ""))


def _too_big(model, found, hw, global_batch, instance_type, count, precision, optimizer,
             constraints, calibration, sequence_length) -> str:
    least = min(found, key=lambda e: e.memory_bytes)
    if frameworks.is_p5_instance(instance_type):
        return (f"the model does not fit on {instance_type} with data parallelism alone "
                f"({least.memory_bytes / GIB:.1f} GiB per device, {hw.memory / GIB:.1f} GiB "
                "usable), and SageMaker runs neither smdistributed library on p5 instances: "
                "use ml.p4de.24xlarge for model parallelism")
    message = (f"the model does not fit on {count} x {instance_type}: the leanest legal "
               f"configuration ({explain.describe(least.candidate)}) needs "
               f"{least.memory_bytes / GIB:.1f} GiB per device, {hw.memory / GIB:.1f} GiB "
               "usable")
    for bigger in (2, 4, 8, 16, 32, 64, 128):
        try:
            plan_strategy(model, global_batch=global_batch, instance_type=instance_type,
                          instance_count=count * bigger, precision=precision,
                          optimizer=optimizer, sequence_length=sequence_length,
                          constraints=attrs.evolve(constraints, pins={}),
                          calibration=calibration)
        except ValidationError:
            continue
        return message + f"; the smallest cluster that fits is {count * bigger} x {instance_type}"
    return message + "; no cluster up to 128x this size fits: use 16-bit precision or a " \
                     "larger-memory instance type"


# -- the answer ------------------------------------------------------------------------------
def distribution(c: Candidate, hw: Hardware, precision: str, instance_type: str) -> dict:
    """The estimator's ``distribution`` for a candidate."""
    if explain.plain(c):
        if instance_type in SMDDP_INSTANCE_TYPES:
            return {"smdistributed": {"dataparallel": {"enabled": True}}}
        if frameworks.is_p5_instance(instance_type):
            return {"torch_distributed": {"enabled": True}}
        return {"pytorchddp": {"enabled": True}}
    params: dict = {"pipeline_parallel_degree": c.pipeline, "microbatches": c.microbatches,
                    "placement_strategy": "cluster", "ddp": True}
    if c.pipeline > 1:
        params["pipeline"] = "interleaved"
    if c.tensor > 1:
        params["tensor_parallel_degree"] = c.tensor
        params["prescaled_batch"] = True  # a tensor-parallel group shares its ranks' batch
    if c.sharded > 1:
        params["sharded_data_parallel_degree"] = c.sharded
    if c.optimizer_sharding:
        params["shard_optimizer_state"] = True
    if precision in ("fp16", "bf16"):
        params[precision] = True
    return {"smdistributed": {"modelparallel": {"enabled": True, "parameters": params}},
            "mpi": {"enabled": True, "processes_per_host": hw.gpus_per_host}}


def _script_changes(c: Candidate) -> list:
    changes = []
    if c.optimizer_sharding:
        changes.append(BUCKET_VIEW_CHANGE)
    if c.checkpointing:  # Shoal's images apply it from the environment; other images need it
        changes.append(SCRIPT_CHANGE + f" (Shoal's images: {CHECKPOINTING_ENV}=blocks does it)")
    return changes


def _check_legal(dist: dict, hw: Hardware) -> None:
    """The runtime's own rules (``smp.init``), so that no plan can fail at start."""
    from shoal.modelparallel import config as smp_config

    section = dist.get("smdistributed", {}).get("modelparallel")
    if section:
        cfg = smp_config.resolve(section["parameters"], environ={})
        smp_config.validate_world(cfg, hw.devices, hw.gpus_per_host)


def _plan(best: Estimate, fitting, found, hw, workload, instance_type, constraints,
          seconds) -> StrategyPlan:
    c = best.candidate
    predicted = explain.predicted(best, workload, hw)
    dist = distribution(c, hw, workload.precision, instance_type)
    _check_legal(dist, hw)
    alternatives = explain.alternatives(best, fitting, found, hw, workload,
                                        constraints.alternatives)
    how = "the fastest"
    if fitting[1:] and fitting[1].step_seconds < best.step_seconds:
        how = ("plain data parallelism, within the library margin of the fastest"
               if explain.plain(c) else f"the one with the most memory to spare within {constraints.near:.0%} of "
               "the fastest")
    reason = (f"{explain.describe(c)}: {how} of {len(fitting)} configurations that fit "
              f"({len(found) - len(fitting)} of {len(found)} do not), "
              f"{predicted['memory_gib_per_device']:.1f} of {hw.memory / GIB:.1f} GiB per "
              f"device, {predicted['step_seconds']:.3f} s per step")
    if alternatives:
        reason += f"; next: {alternatives[0]['description']} ({alternatives[0]['lost_because']})"
    per_rank = workload.global_batch // c.data
    return StrategyPlan(
        distribution=dist, degrees=explain.degrees(c), microbatches=c.microbatches,
        activation_checkpointing=c.checkpointing, predicted=predicted,
        alternatives=alternatives, reason=reason,
        environment={CHECKPOINTING_ENV: "blocks"} if c.checkpointing else {},
        script_changes=_script_changes(c),
        batch_per_rank=per_rank, considered=len(found), plan_seconds=seconds)
