"""The planner's cost model: memory per device and time per step of one configuration.

A pipeline's stages hold the layers SMP's auto-partition gives them (the plans leave it on):
contiguous in run order, balanced by 0.8 x memory (parameter bytes and every module's output
for the first microbatch) + 0.2 x module count (:func:`partition_costs`), not by FLOPs, so
the slowest stage can compute more than its share.

Memory (bytes on the most loaded device):

* model states (ZeRO, Rajbhandari et al. 2020): weights, gradients and the optimizer's state
  (with 16-bit training, an fp32 master copy on top of the optimizer's own state); tensor
  parallelism divides the layers it splits, sharded data parallelism divides all three,
  optimizer-state sharding the optimizer's part across the data-parallel group;
* activations (Korthikanti et al. 2022): each layer's saved bytes per sample times the
  microbatch, for every microbatch in flight on the stage (up to ``active_microbatches``,
  pipeline + 2, along a pipeline; one on a single stage); with checkpointing, the repeated
  blocks keep only their input, plus one block's activations while it is recomputed; the
  loss in float32 at any precision (a 16-bit model's logits are cast up for the softmax):
  the saved log-softmax (4 bytes per logit) for each microbatch in flight, and while one
  loss runs its backward its gradient and the logits' (8 more), which are freed before a
  checkpointed block is recomputed, so the larger of the two counts;
* a pipeline's first stage also holds the model's output and the loss made from it: SMP runs
  the step function there;
* when they are held (:func:`_peak`): the step starts with no gradients (``zero_grad`` frees
  them), so the backward's peak, as it begins, holds the activations and only the gradients
  earlier microbatches left to accumulate into; as it goes on each layer's activations are
  freed as its gradients are made. After it, the data-parallel reduction holds the whole
  gradients and the all-reduce's copies of them (all buckets at once; one owner's bucket at
  a time with optimizer-state sharding). The stage's peak is the larger of the two;
* under sharded data parallelism: tensors under ``sdp_param_persistence_threshold`` whole on
  every rank, the gathered window of the others (prefetching), and the gradients whole until
  their bucket is reduce-scattered from float32 rows.

Time (seconds per step):

* compute: forward and backward (twice the forward) FLOPs at the device's effective rate, plus
  a fixed cost per layer and microbatch (hooks, one module call) and the dispatch of each
  further operation the layer runs (counted when its forward is traced; a GPU hides it behind
  the arithmetic, CPU ranks add it), plus the recomputed forward;
* the pipeline's fill and drain: ``(m + p - 1)`` microbatch slots of the slowest stage. Where
  ranks share compute units (CPU ranks on shared cores, ``contention`` ranks per unit), a
  slot's figure is its time with every rank busy, and the slots of the fill and drain, with
  fewer stages at work, run faster (:func:`schedule_slots`);
* tensor parallelism's all-reduces (not overlapped), pipeline sends between stages;
* the data-parallel all-reduce of gradients (hierarchical: inside hosts, then between them),
  behind the backward, and sharded data parallelism's collectives: the gathers of the
  non-persistent tensors on every use, behind compute, and once a step the reduce-scatter of
  the summed gradients, behind the backward, and the gather of the updated persistent ones.
  At most ``overlap`` of a collective hides behind the computation running beside it (it
  still competes for memory bandwidth and launches), the rest is exposed;
* with microbatches, each later one's gradients added to those held (read both, write one),
  and the optimizer step, both bound by memory bandwidth.

Collectives follow the alpha-beta model: a ring over ``n`` ranks moves ``2 (n - 1) / n`` of the
buffer per rank for an all-reduce and ``(n - 1) / n`` for a gather, plus a latency per hop.
"""

from __future__ import annotations

import functools

import attrs

from shoal.planning.models import ModelProfile

PRECISIONS = ("fp32", "fp16", "bf16")

#: Optimizer state bytes per parameter, beyond the weights (fp32 moments).
OPTIMIZER_STATE_BYTES = {"adam": 8, "adamw": 8, "lamb": 8, "adagrad": 4, "rmsprop": 4,
                         "sgd_momentum": 4, "momentum": 4, "adafactor": 4, "sgd": 0}

GIB = 1024**3
SDP_MAX_LIVE_PARAMETERS = 1_000_000_000  # SMP v1's defaults, which the plans keep
SDP_REDUCE_BUCKET = 500_000_000
SDP_PERSISTENCE_THRESHOLD = 1_000_000  # smaller tensors stay whole on every rank


@attrs.frozen
class Hardware:
    """The effective figures of one cluster, per device unless named per host."""

    gpus_per_host: int
    hosts: int
    memory: float  # usable bytes per device
    flops: float  # effective FLOP/s per device at the training precision
    layer_overhead: float  # seconds per tiny module call (per pass; the backward is two)
    hbm: float  # bytes/s
    intra_bw: float  # bytes/s per device inside a host (all-reduce bus bandwidth)
    net_bw: float  # bytes/s per host
    alpha_intra: float = 10e-6
    alpha_net: float = 30e-6
    overlap: float = 0.8  # the most of a collective that computation beside it can hide
    # ranks per compute unit: 1 where each rank has its own device; CPU ranks sharing cores
    # (local mode) compute this much faster while their peers idle
    contention: float = 1.0
    # a GPU computes while its host dispatches the next operations, so their dispatch costs
    # time only where it outlasts the arithmetic (small microbatches); CPU ranks compute
    # what they dispatch, one after the other
    dispatch_hidden: bool = True

    @property
    def devices(self) -> int:
        return self.gpus_per_host * self.hosts


@attrs.frozen
class Workload:
    profile: ModelProfile
    global_batch: int
    precision: str = "fp32"
    optimizer: str = "adam"

    @property
    def weight_bytes(self) -> int:
        return 4 if self.precision == "fp32" else 2

    @property
    def state_bytes(self) -> int:
        """Optimizer bytes per parameter: its state, and an fp32 master copy in 16-bit."""
        master = 0 if self.precision == "fp32" else 4
        return OPTIMIZER_STATE_BYTES[self.optimizer] + master

    @property
    def activation_scale(self) -> float:
        return 2.0 if self.precision == "fp32" else 1.0


@attrs.frozen
class Candidate:
    """One configuration: degrees, microbatches, checkpointing."""

    tensor: int
    pipeline: int
    data: int
    sharded: int = 1  # sharded data parallel degree (1: off)
    optimizer_sharding: bool = False
    microbatches: int = 1
    checkpointing: bool = False

    @property
    def model_parallel(self) -> int:
        return self.tensor * self.pipeline


@attrs.frozen
class Estimate:
    candidate: Candidate
    memory: dict  # term -> bytes per device
    time: dict  # term -> seconds per step

    @property
    def memory_bytes(self) -> float:
        return sum(self.memory.values())

    @property
    def step_seconds(self) -> float:
        return sum(self.time.values())


def allreduce_time(nbytes: float, ranks: int, bandwidth: float, alpha: float) -> float:
    if ranks <= 1 or nbytes <= 0:
        return 0.0
    return 2 * (ranks - 1) / ranks * nbytes / bandwidth + 2 * (ranks - 1) * alpha


def gather_time(nbytes: float, ranks: int, bandwidth: float, alpha: float) -> float:
    """All-gather (or reduce-scatter) of a buffer of ``nbytes`` in total."""
    if ranks <= 1 or nbytes <= 0:
        return 0.0
    return (ranks - 1) / ranks * nbytes / bandwidth + (ranks - 1) * alpha


def active_microbatches(c: Candidate) -> int:
    """Microbatches in flight on the first stage: up to SMP's ``active_microbatches``
    (pipeline + 2) along a pipeline; one on a single stage, whose scheduler runs each
    microbatch's backward before the next one's forward."""
    return min(c.microbatches, c.pipeline + 2) if c.pipeline > 1 else 1


def _peak(states: dict, activations: float, gradients: float, buckets: float,
          outputs: tuple[float, float], accumulating: bool) -> dict:
    """What a stage holds at its peak, term by term: the larger of its backward and the
    gradients' reduction after it.

    The backward's peak comes as it begins: every saved activation, and the gradients
    only where earlier microbatches left theirs to be accumulated into (the step starts
    with none: ``zero_grad`` frees them). As it goes on each layer's activations are freed
    as its gradients are made. The reduction then holds the whole gradients and the
    all-reduce's copies of them (``buckets``), the activations gone."""
    first_loss, later = outputs
    held = gradients if accumulating else 0.0
    backward = {**states, "activations": activations}
    if first_loss >= held + later:
        backward["step_outputs"] = first_loss
    else:
        backward.update(gradients=held, step_outputs=later)
    reduction = {**states, "gradients": gradients, "gradient_buckets": buckets}
    peak = max((backward, reduction), key=lambda terms: sum(terms.values()))
    return {k: v for k, v in peak.items() if v or k in states}


@functools.lru_cache(maxsize=4096)
def schedule_slots(m: int, p: int, contention: float = 1.0) -> float:
    """A pipeline step in slots of one microbatch on one stage with every rank busy.

    Slot ``t`` of the ``m + p - 1`` has ``a = min(t, p, m, m + p - t)`` stages at work; where
    ranks share compute units, those run ``min(contention, p / a)`` times faster (no faster
    than alone, nor than the idle stages' share of the units allows)."""
    if contention <= 1:
        return float(m + p - 1)
    return sum(1.0 / min(contention, p / min(t, p, m, m + p - t)) for t in range(1, m + p))


@functools.lru_cache(maxsize=256)
def stages(loads: tuple[float, ...], parts: int) -> tuple[tuple[int, int], ...]:
    """Contiguous ``[start, end)`` ranges of ``loads`` into ``parts`` with the least maximum."""
    if parts >= len(loads):
        return tuple((i, i + 1) for i in range(len(loads)))
    low, high = max(loads), sum(loads)
    for _ in range(60):  # bisect the bound; greedy packing decides feasibility
        mid = (low + high) / 2
        if len(_pack(loads, mid)) <= parts:
            high = mid
        else:
            low = mid
    ranges = _pack(loads, high)
    while len(ranges) < parts:  # split the largest range that can be split
        i = max((k for k, (a, b) in enumerate(ranges) if b - a > 1),
                key=lambda k: sum(loads[ranges[k][0]:ranges[k][1]]))
        a, b = ranges[i]
        ranges[i:i + 1] = [(a, b - 1), (b - 1, b)]
    return tuple(ranges)


def partition_costs(layers, micro: float, weight_bytes: int, activation_scale: float,
                    memory_weight: float = 0.8) -> tuple[float, ...]:
    """Each layer's cost as SMP's auto-partition weighs it (``memory_weight``, 0.8 unless
    set; the plans leave it): ``memory_weight`` times its share of the model's memory (its
    parameters' bytes and its modules' outputs for the first microbatch) plus the rest
    times its share of the modules. A layer that holds a large vocabulary's logits weighs
    much more than its FLOPs say; one of many small modules more than its bytes say."""
    memory = [x.params * weight_bytes + x.outputs * micro * activation_scale for x in layers]
    total_memory = sum(memory) or 1.0
    total_modules = sum(x.modules for x in layers) or 1
    return tuple(memory_weight * m / total_memory + (1 - memory_weight) * x.modules
                 / total_modules for m, x in zip(memory, layers))


def _pack(loads, bound):
    ranges, start, total = [], 0, 0.0
    for i, load in enumerate(loads):
        if total + load > bound * (1 + 1e-12) and i > start:
            ranges.append((start, i))
            start, total = i, 0.0
        total += load
    ranges.append((start, len(loads)))
    return ranges


@attrs.frozen
class StageSums:
    """A pipeline stage's layers summed once, so that each candidate costs O(stages)."""

    layers: int
    repeated: int
    params_split: float
    params_kept: float
    flops_split: float
    flops_kept: float
    recompute_split: float
    recompute_kept: float
    act_split: float
    act_kept: float
    act_split_other: float  # outside the repeated blocks (kept whole under checkpointing)
    act_kept_other: float
    boundaries: float  # the repeated blocks' inputs, all that checkpointing keeps of them
    block_split: float  # the largest repeated block's activations, while it is recomputed
    block_kept: float
    loss_split: float  # float32 bytes per sample of the loss at its peak (Layer.loss)
    loss_kept: float
    tp_bytes: float
    tp_calls: int
    out_boundary: float
    calls: float  # fixed cost per pass, in tiny module calls (Layer.calls)
    repeated_calls: float

    @classmethod
    def of(cls, layers) -> StageSums:
        split = [layer for layer in layers if layer.split]
        kept = [layer for layer in layers if not layer.split]
        rep = [layer for layer in layers if layer.repeated]
        other = [layer for layer in layers if not layer.repeated]
        return cls(
            layers=len(layers), repeated=len(rep),
            params_split=sum(x.params for x in split), params_kept=sum(x.params for x in kept),
            # a layer measured slower than a matmul (``speed`` < 1) costs proportionally more
            flops_split=sum(x.flops / x.speed for x in split),
            flops_kept=sum(x.flops / x.speed for x in kept),
            recompute_split=sum(x.flops / x.speed for x in rep if x.split),
            recompute_kept=sum(x.flops / x.speed for x in rep if not x.split),
            act_split=sum(x.act_split for x in layers), act_kept=sum(x.act_kept for x in layers),
            loss_split=sum(x.loss for x in split), loss_kept=sum(x.loss for x in kept),
            act_split_other=sum(x.act_split for x in other),
            act_kept_other=sum(x.act_kept for x in other),
            boundaries=sum(x.boundary for x in rep),
            block_split=max((x.act_split for x in rep), default=0.0),
            block_kept=max((x.act_kept for x in rep), default=0.0),
            tp_bytes=sum(x.tp_comm for x in split), tp_calls=sum(2 for x in split if x.tp_comm),
            out_boundary=layers[-1].boundary, calls=sum(x.calls for x in layers),
            repeated_calls=sum(x.calls for x in rep))


def _passes(hw: Hardware, arithmetic: float, layers: int, calls: float) -> float:
    """Seconds of one pass over layers: each layer's fixed cost (hooks, one module call) and
    the dispatch of its further operations, which a GPU's queue hides behind longer
    arithmetic and CPU ranks add to it."""
    dispatch = (calls - layers) * hw.layer_overhead
    hidden = max(arithmetic, dispatch) if hw.dispatch_hidden else arithmetic + dispatch
    return layers * hw.layer_overhead + hidden


class CostModel:
    """Estimates for one workload on one cluster; caches what every candidate shares."""

    def __init__(self, workload: Workload, hardware: Hardware):
        self.w, self.hw = workload, hardware
        self.layers = workload.profile.layers
        self._ranges: dict[tuple[int, float], tuple[tuple[int, int], ...]] = {}
        self._sums: dict[tuple[int, float], list[StageSums]] = {}
        self._by_range: dict[tuple[int, int], StageSums] = {}
        self._outputs: dict[tuple[int, float], tuple[float, float]] = {}
        self._persistent: dict[tuple[int, float, int], list[tuple[float, float, int]]] = {}

    def micro(self, c: Candidate) -> float:
        """Samples per microbatch on one rank."""
        return self.w.global_batch / (c.data * c.microbatches)

    def ranges(self, pipeline: int, micro: float) -> tuple[tuple[int, int], ...]:
        """The layers each stage holds, as SMP's auto-partition (which the plans leave on)
        cuts them: contiguous in run order, balancing ``partition_costs``."""
        key = (pipeline, micro)
        if key not in self._ranges:
            loads = partition_costs(self.layers, micro, self.w.weight_bytes,
                                    self.w.activation_scale)
            self._ranges[key] = stages(loads, pipeline)
        return self._ranges[key]

    def stage_sums(self, pipeline: int, micro: float) -> list[StageSums]:
        key = (pipeline, micro)
        if key not in self._sums:
            self._sums[key] = [self._range_sums(a, b) for a, b in self.ranges(pipeline, micro)]
        return self._sums[key]

    def _range_sums(self, a: int, b: int) -> StageSums:
        """One range's sums: most microbatch sizes cut the layers alike, so cached apart."""
        if (a, b) not in self._by_range:
            self._by_range[(a, b)] = StageSums.of(self.layers[a:b])
        return self._by_range[(a, b)]

    def persistence(self, pipeline: int, micro: float,
                    tensor: int) -> list[tuple[float, float, int]]:
        """Per stage, under sharded data parallelism: the parameters that stay whole on
        every rank (tensors under ``sdp_param_persistence_threshold`` elements once tensor
        parallelism has split them), the largest tensor that does not, and how many layers
        hold such a tensor (each is gathered on every use)."""
        key = (pipeline, micro, tensor)
        if key not in self._persistent:
            found = []
            for a, b in self.ranges(pipeline, micro):
                kept = largest = 0.0
                gathered = 0
                for layer in self.layers[a:b]:
                    t = tensor if layer.split else 1
                    if layer.largest_tensor / t < SDP_PERSISTENCE_THRESHOLD:
                        kept += layer.params / t
                    else:
                        largest = max(largest, layer.largest_tensor / t)
                        gathered += 1
                found.append((kept, largest, gathered))
            self._persistent[key] = found
        return self._persistent[key]

    def estimate(self, c: Candidate) -> Estimate:
        micro = self.micro(c)
        kept = self.persistence(c.pipeline, micro, c.tensor) if c.sharded > 1 else None
        per_stage = [self._stage(c, s, first=i == 0, persistent=kept[i] if kept else None)
                     for i, s in enumerate(self.stage_sums(c.pipeline, micro))]
        memory = max(per_stage, key=lambda s: sum(s[0].values()))[0]
        slowest = max(per_stage, key=lambda s: s[1]["slot"])[1]
        return Estimate(c, memory, self._step(c, slowest))

    # -- one stage ---------------------------------------------------------------------
    def _stage(self, c: Candidate, s: StageSums, first: bool, persistent=None):
        w, t, shard = self.w, c.tensor, c.sharded
        params = s.params_split / t + s.params_kept
        micro = self.micro(c)
        states = {
            "parameters": params * w.weight_bytes / shard,
            "optimizer_states": params * w.state_bytes / (c.data if c.optimizer_sharding
                                                          else shard),
        }
        gradients = params * w.weight_bytes / shard
        activations = self._activations(c, s, micro, first)
        outputs = self._step_outputs(c, micro) if first and c.pipeline > 1 else (0.0, 0.0)
        if shard > 1:
            memory = {**states, "gradients": gradients, "activations": activations,
                      **self._sharded_memory(c, params, persistent)}
            if outputs[0]:
                memory["step_outputs"] = max(
                    outputs[0] - gradients - memory["gradient_buckets"], outputs[1], 0.0)
        else:
            buckets = 0.0
            if c.data > 1:
                # the all-reduce works on a copy of every bucket at once; with optimizer-state
                # sharding the buckets go one at a time to their owner (each owner's share,
                # one data-parallel rank's, in one bucket) beside the whole gradients
                buckets = params * w.weight_bytes / (c.data if c.optimizer_sharding else 1)
            memory = _peak(states, activations, gradients, buckets, outputs,
                           accumulating=c.microbatches > 1)
        return memory, self._slot(c, s, micro, params, persistent)

    def _sharded_memory(self, c: Candidate, params: float, persistent) -> dict:
        """What sharded data parallelism holds beyond the shards: small tensors whole
        (persistent), the gathered window of the others (prefetching gathers up to
        ``sdp_max_live_parameters``, SMP's default 1e9: all of most models), and the
        gradients, whole until ``sdp_reduce_bucket_size`` elements (5e8) wait, then laid
        out in float32 for their reduce-scatter, whose output is this rank's share."""
        w = self.w
        kept, largest, _ = persistent
        others = params - kept
        # the one being used and the next, within the limit; never more than there is
        live = min(others, max(2 * largest, min(SDP_MAX_LIVE_PARAMETERS, others)))
        bucket = min(SDP_REDUCE_BUCKET, params)
        return {"persistent_parameters": kept * w.weight_bytes,
                "gathered_parameters": live * w.weight_bytes,
                "gradient_buckets": bucket * 4 * (1 + 1 / c.sharded)}  # float32 rows

    def _activations(self, c: Candidate, s: StageSums, micro: float, first: bool) -> float:
        t = c.tensor
        recomputing = 0.0
        if c.checkpointing:  # blocks keep their input; one at a time is whole, recomputed
            per_sample = s.act_split_other / t + s.act_kept_other + s.boundaries
            recomputing = (s.block_split / t + s.block_kept) * micro * self.w.activation_scale
        else:
            per_sample = s.act_split / t + s.act_kept
        if first:
            in_flight = active_microbatches(c)
        else:
            in_flight = min(c.microbatches, c.pipeline)
        # float32 bytes at any precision: each microbatch in flight keeps its saved
        # log-softmax (a third of the loss's peak); the other two thirds exist while one
        # loss runs its backward, before any block is recomputed: never both at once
        loss = (s.loss_split / t + s.loss_kept) * micro
        return (per_sample * micro * self.w.activation_scale * in_flight
                + loss / 3 * in_flight + max(recomputing, 2 * loss / 3))

    def _step_outputs(self, c: Candidate, micro: float) -> tuple[float, float]:
        """The model's output comes back to the first stage, where the step function
        computes the loss (SMP runs the top module there): per microbatch in flight, the
        output and the loss's saved copy of it (log-softmax); for the one whose loss runs
        its backward, their gradients and the softmax the loss's gradient is made from.

        That backward frees its microbatch's five before the stage's own backward makes
        any gradient: the first microbatch's loss holds all of them (the first figure),
        a later one's the other microbatches' outputs beside the gradients (the second)."""
        last = (self.stage_sums(c.pipeline, micro)[-1].out_boundary * micro
                * self.w.activation_scale)
        active = active_microbatches(c)
        return (2 * active + 3) * last, 2 * (active - 1) * last

    def _slot(self, c: Candidate, s: StageSums, micro: float, params: float,
              persistent=None) -> dict:
        """Times of one microbatch's forward and backward on this stage, and step terms."""
        hw, t = self.hw, c.tensor
        flops = (s.flops_split / t + s.flops_kept) * micro
        compute = 3 * _passes(hw, flops / hw.flops, s.layers, s.calls)
        recompute = 0.0
        if c.checkpointing:
            recompute = _passes(hw, (s.recompute_split / t + s.recompute_kept) * micro / hw.flops,
                                s.repeated, s.repeated_calls)
        tp = 0.0
        if t > 1:
            passes = 3 if c.checkpointing else 2
            tp_bytes = s.tp_bytes * micro * self.w.activation_scale
            tp = passes * (allreduce_time(tp_bytes, t, hw.intra_bw, 0.0)
                           + s.tp_calls * 2 * (t - 1) * hw.alpha_intra)
        p2p = 0.0
        if c.pipeline > 1:
            nbytes = s.out_boundary * micro * self.w.activation_scale
            bw, alpha = self._link(c.tensor * c.pipeline <= hw.gpus_per_host)
            p2p = 2 * (nbytes / bw + alpha)
        sharded = sharded_fixed = 0.0
        kept = params
        if c.sharded > 1:  # persistent tensors are never gathered; the others on every use
            kept, _, gathered = persistent
            calls = 3 if c.checkpointing else 2  # forward, backward (and recompute)
            sharded = calls * (self._shard_transfer((params - kept) * self.w.weight_bytes, c)
                               + gathered * self._shard_latency(c))
            # each layer's gather and release is host work no prefetching hides
            sharded_fixed = calls * gathered * hw.layer_overhead / 3
        backward = 2 * compute / 3  # the backward is twice the forward
        return {"slot": compute + recompute + tp + p2p, "compute": compute,
                "recompute": recompute, "tp": tp, "p2p": p2p, "sharded": sharded,
                "sharded_fixed": sharded_fixed,
                "backward": backward, "params": params, "persistent": kept}

    # -- the step ------------------------------------------------------------------------
    def _step(self, c: Candidate, s: dict) -> dict:
        m, p = c.microbatches, c.pipeline
        slots = m + p - 1
        work = s["compute"] + s["recompute"]
        exposed_sdp = self.exposed(s["sharded"], work)
        time = {
            "compute": m * s["compute"],
            "recompute": m * s["recompute"],
            "pipeline_bubble": max(0.0, schedule_slots(m, p, self.hw.contention) * work
                                   - m * work),
            "tensor_parallel": slots * s["tp"],
            "pipeline_p2p": self._pipeline_sends(c),
            "sharded_data_parallel": m * (exposed_sdp + s["sharded_fixed"]),
        }
        dp = self._data_parallel(c, s["params"])
        gather = 0.0
        if c.optimizer_sharding:  # a reduce-scatter behind the backward, an all-gather after
            dp, gather = dp / 2, dp / 2
        time["data_parallel"] = self.exposed(dp, s["backward"])
        time["optimizer"] = self._optimizer(c, s["params"]) + gather
        if m > 1:  # each later microbatch's gradients are added to the held ones
            time["gradient_accumulation"] = ((m - 1) * s["params"] * 3 * self.w.weight_bytes
                                             / self.hw.hbm)
        if c.sharded > 1:
            time["sharded_data_parallel"] += self._sharded_step(c, s)
        return time

    def _pipeline_sends(self, c: Candidate) -> float:
        """The sends on a pipeline step's critical path: the first microbatch's output of
        every stage in turn (the last stage's, the model's output, goes back to the first
        stage, which computes the loss), each later microbatch's largest one, and their
        gradients back the same way."""
        if c.pipeline == 1:
            return 0.0
        micro = self.micro(c)
        scale = micro * self.w.activation_scale
        bw, alpha = self._link(c.tensor * c.pipeline <= self.hw.gpus_per_host)
        total, largest = self._boundaries(c.pipeline, micro)
        sends = total * scale / bw + c.pipeline * alpha
        return 2 * (sends + (c.microbatches - 1) * (largest * scale / bw + alpha))

    def _boundaries(self, pipeline: int, micro: float) -> tuple[float, float]:
        """The stages' outputs per sample: their sum and the largest (cached per layout)."""
        key = (pipeline, micro)
        if key not in self._outputs:
            out = [s.out_boundary for s in self.stage_sums(pipeline, micro)]
            self._outputs[key] = (sum(out), max(out))
        return self._outputs[key]

    def _sharded_step(self, c: Candidate, s: dict) -> float:
        """Once a step: the gradients, summed over the microbatches, reduce-scattered behind
        the backward, and the updated persistent parameters gathered back whole."""
        latency = self._shard_latency(c)
        scatter = self._shard_transfer(s["params"] * self.w.weight_bytes, c) + latency
        refresh = 0.0
        if s["persistent"]:
            refresh = self._shard_transfer(s["persistent"] * self.w.weight_bytes, c) + latency
        return self.exposed(scatter, s["backward"]) + refresh

    def _spread(self, size: int, stride: int) -> tuple[int, int]:
        """A group of ``size`` ranks ``stride`` apart: its ranks per host, and its hosts."""
        local = min(size, max(1, self.hw.gpus_per_host // stride))
        return local, max(1, size // local)

    def _shard_transfer(self, nbytes: float, c: Candidate) -> float:
        """Seconds an all-gather (or reduce-scatter) of ``nbytes`` in all moves them over a
        sharding group (its ranks a tensor group apart), hierarchically as the data-parallel
        all-reduce: inside each host, then between hosts, where every group of the host
        crosses its network at once."""
        hw = self.hw
        local, hosts = self._spread(c.sharded, c.tensor * c.pipeline)
        seconds = gather_time(nbytes, local, hw.intra_bw, 0.0)
        if hosts > 1:
            seconds += hw.gpus_per_host / local * (hosts - 1) / hosts * nbytes / hw.net_bw
        return seconds

    def _shard_latency(self, c: Candidate) -> float:
        """The hops of one such collective: inside the host, then between hosts."""
        local, hosts = self._spread(c.sharded, c.tensor * c.pipeline)
        return (local - 1) * self.hw.alpha_intra + (hosts - 1) * self.hw.alpha_net

    def _link(self, in_host: bool) -> tuple[float, float]:
        """Bandwidth per rank and latency of a group inside one host, or across hosts (every
        rank of a host shares its network)."""
        hw = self.hw
        if in_host:
            return hw.intra_bw, hw.alpha_intra
        return hw.net_bw / hw.gpus_per_host, hw.alpha_net

    def exposed(self, comm: float, window: float) -> float:
        """What of ``comm`` seconds of communication computation lasting ``window`` leaves."""
        return comm - min(self.hw.overlap * comm, window)

    def _data_parallel(self, c: Candidate, params: float) -> float:
        """All-reduce of one stage's gradients across the data-parallel replicas."""
        hw = self.hw
        replicas = c.data // c.sharded  # sharding groups reduce their shards across replicas
        if replicas <= 1:
            return 0.0
        nbytes = params * self.w.weight_bytes / c.sharded
        local, hosts = self._spread(replicas, c.tensor * c.pipeline * c.sharded)
        intra = allreduce_time(nbytes, local, hw.intra_bw, hw.alpha_intra)
        inter = 0.0
        if hosts > 1:  # every local rank's shard crosses the host's network at once
            inter = (hw.gpus_per_host / local * 2 * (hosts - 1) / hosts * nbytes / hw.net_bw
                     + 2 * (hosts - 1) * hw.alpha_net)
        return intra + inter

    def _optimizer(self, c: Candidate, params: float) -> float:
        """The update itself, bound by memory bandwidth, on the parameters this rank owns."""
        w = self.w
        owned = params / (c.data if c.optimizer_sharding else c.sharded)
        return owned * 2 * (2 * w.weight_bytes + w.state_bytes) / self.hw.hbm  # read, write
