"""Calibration probe: the figures the strategy planner needs, measured on the job's machines.

Run on every rank of a job (mpirun, one rank per device); rank 0 writes one JSON object,
``{"calibration": {...}, "details": {...}}``, whose ``calibration`` keys are those of
``shoal.planning.strategy.Calibration``:

* ``flops``: FLOP/s of a square matmul of ``--hidden`` per rank, every rank at once (ranks
  that share cores share them here too), the median of ``--repeats``; on the rank's GPU where
  there is one (local rank modulo the GPUs), in the job's ``--precision``, else on its CPU
  cores in float32 (as CPU ranks train);
* ``contention``: how many ranks share one compute unit: each rank's matmul rate alone (the
  others asleep at a barrier) over its rate with every rank at once. 1 where every rank has
  its own device; on CPU ranks that share cores, the ranks per core: a rank whose peers idle
  (a pipeline's bubble) computes that much faster;
* ``layer_overhead``: seconds per module call beyond its arithmetic: a stack of tiny
  ``nn.Linear`` layers' forward and backward, per layer, divided by the three passes the cost
  model charges;
* ``hbm``: bytes/s of an optimizer's update as the cost model counts it (32 bytes per fp32
  parameter): a PyTorch Adam step over 4 Mi parameters (64 Mi on a GPU, whose memory is
  larger than its caches only from there), every rank at once;
* ``intra_bw``/``alpha_intra``: all-reduces between the ranks of one host, every host at once,
  at two sizes: ``t = 2 (r - 1) alpha + 2 (r - 1) / r * n / bw`` solved for alpha and bw; alpha
  is raised to what a small all-reduce adds after each chunk of computation of a layer's
  length (ranks sharing cores wait for a peer to be scheduled), per hop;
* ``net_bw``/``alpha_net``: the same between hosts (the ranks of equal local rank), the
  bandwidth per host (every local rank's group crosses the network at once);
* ``overlap``: how much of an all-reduce a matmul running beside it (on another thread) hides:
  ``(compute + comm - both) / comm``, clipped to [0, 1].

Every timing on a GPU waits for the device (``Device.sync``): kernels are queued, and a
clock read at the host alone would time their launch.

    mpirun -np 4 python -m shoal.profiler.calibration --out calibration.json [--precision bf16]
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time

import attrs
import numpy as np

SMALL, LARGE = 8 * 1024, 8 * 1024 * 1024  # bytes of the two all-reduce sizes
CHUNK_SECONDS = 2e-3  # computation between two synchronizations: a layer's forward
SYNC_ITERATIONS = 40  # chunk + all-reduce iterations per timed block
ADAM_PARAMETERS = 4 * 1024 * 1024  # larger than a CPU's caches, as a model's are
GPU_ADAM_PARAMETERS = 64 * 1024 * 1024  # 256 MiB of weights: beyond a GPU's L2 (60 MB on H200)
STACK = 32  # tiny layers per forward: a backward call's fixed cost spread as a model's is
HIDDEN = {"cpu": 512, "cuda": 4096}  # a layer's width on each: large enough to reach its rate
DTYPES = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}
ADAM_BYTES = 32  # per fp32 parameter, as the cost model counts an update (shoal.planning.costs)


@attrs.frozen
class Device:
    """Where this rank computes: its GPU (``cuda:N``) or its CPU cores, and in what dtype."""

    name: str = "cpu"
    dtype: str = "float32"

    @property
    def kind(self) -> str:
        return self.name.split(":")[0]

    def sync(self) -> None:
        if self.kind == "cuda":
            import torch

            torch.cuda.synchronize(self.name)

    def randn(self, *shape, dtype: str | None = None):
        import torch

        return torch.randn(*shape, device=self.name, dtype=getattr(torch, dtype or self.dtype))


def pick_device(local_rank: int, precision: str = "fp32") -> Device:
    """This rank's GPU (shared round-robin where ranks outnumber GPUs), else its CPU; a CPU
    computes in float32 whatever the precision, as CPU ranks train."""
    import torch

    if precision not in DTYPES:
        raise ValueError(f"'precision' must be one of {', '.join(DTYPES)} (got {precision!r})")
    if torch.cuda.is_available():
        index = local_rank % torch.cuda.device_count()
        torch.cuda.set_device(index)
        return Device(f"cuda:{index}", DTYPES[precision])
    return Device()


def timed(fn, repeats: int, device: Device = Device()) -> float:
    """Median seconds of ``fn()`` over ``repeats`` runs, after one warm-up; on a GPU, until
    the work it queued is done."""
    fn()
    device.sync()
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        device.sync()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def _operands(device: Device, hidden: int):
    return device.randn(hidden, hidden), device.randn(hidden, hidden)


def matmul_rate(hidden: int, repeats: int, device: Device = Device()) -> float:
    import torch

    a, b = _operands(device, hidden)
    work = 2e9 if device.kind == "cpu" else 2e12  # about 2 GFLOP (CPU), 2 TFLOP (GPU) a timing
    calls = max(1, int(work / (2 * hidden**3)))
    seconds = timed(lambda: [torch.mm(a, b) for _ in range(calls)], repeats, device)
    return 2 * hidden**3 * calls / seconds


def contention(core, world, hidden: int, repeats: int, shared: float,
               device: Device = Device()) -> float:
    """This rank's matmul rate alone over ``shared`` (its rate with every rank at once)."""
    alone = shared
    for turn in range(world.size):  # one rank at a time; the others wait on the core's futex
        core.barrier()
        if turn == world.rank:
            alone = matmul_rate(hidden, repeats, device)
    core.barrier()
    return max(1.0, alone / shared)


def layer_overhead(repeats: int, device: Device = Device()) -> float:
    """Seconds per tiny module call and pass, as layers inside a model's forward and
    backward cost them: a stack of ``STACK`` tiny ``nn.Linear`` run as one graph. A
    ``backward()`` call's own fixed cost (on a GPU, handing the graph to the device's
    autograd thread and waiting for it: about 0.2 ms on an H200's host) is paid once per
    microbatch, not per layer, so a single layer with its own backward is not timed."""
    import torch

    stack = torch.nn.Sequential(*[torch.nn.Linear(8, 8) for _ in range(STACK)]).to(device.name)
    x = device.randn(2, 8, dtype="float32")
    calls = 8

    def run():
        for _ in range(calls):
            stack(x).sum().backward()

    return timed(run, repeats, device) / (calls * STACK) / 3


def optimizer_bandwidth(repeats: int, device: Device = Device()) -> float:
    """Bytes/s an optimizer's update reaches, counted as the cost model counts it: an Adam
    step (PyTorch's own, as the job runs it) over ``ADAM_PARAMETERS``. A fused kernel on a
    GPU runs near the memory's bandwidth; on CPU ranks the step makes several passes over
    each tensor, which a plain copy's bandwidth would price two to three times too low."""
    import torch

    count = ADAM_PARAMETERS if device.kind == "cpu" else GPU_ADAM_PARAMETERS
    params = [torch.nn.Parameter(device.randn(count // 8, dtype="float32")) for _ in range(8)]
    for param in params:
        param.grad = torch.randn_like(param)
    optimizer = torch.optim.Adam(params, lr=1e-3)
    seconds = timed(optimizer.step, repeats, device)
    return ADAM_BYTES * count / seconds


def device_figures(device: Device, hidden: int | None = None, repeats: int = 5) -> dict:
    """The figures one rank measures alone: its matmul rate, module-call overhead and
    optimizer bandwidth (a single-device job's whole calibration)."""
    hidden = hidden or HIDDEN[device.kind]
    return {"flops": matmul_rate(hidden, repeats, device),
            "layer_overhead": layer_overhead(repeats, device),
            "hbm": optimizer_bandwidth(repeats, device)}


def allreduce_seconds(core, group, nbytes: int, repeats: int) -> float:
    array = np.ones(nbytes // 4, dtype=np.float32)
    core.barrier()
    return timed(lambda: core.allreduce(array, group=group), repeats)


def _alpha_beta(ranks: int, small: float, large: float) -> tuple[float, float]:
    """alpha and bandwidth from all-reduce times of SMALL and LARGE bytes over ``ranks``."""
    share = 2 * (ranks - 1) / ranks
    bw = share * (LARGE - SMALL) / max(large - small, 1e-9)
    alpha = max(small - share * SMALL / bw, 0.0) / (2 * (ranks - 1))
    return alpha, bw


def sync_latency(core, group, ranks: int, hidden: int, repeats: int,
                 device: Device = Device()) -> float:
    """Latency per hop of a small all-reduce that follows a chunk of computation, as tensor
    and pipeline parallelism run them. Where ranks share cores a peer must first be
    scheduled, which an all-reduce loop on idle ranks never shows. Blocks of iterations with
    and without the all-reduce alternate, so that drift cancels pair by pair; each block's
    mean (not median) is taken because a step pays every wait, the rare long one included."""
    import torch

    a, b = _operands(device, hidden)
    small = np.ones(SMALL // 4, dtype=np.float32)
    calls = max(1, round(CHUNK_SECONDS / timed(lambda: torch.mm(a, b), repeats, device)))
    calls = int(core.allreduce(np.array([calls], dtype=np.float32), group=group)[0] / ranks)

    def block(comm: bool) -> float:
        core.barrier(group=group)
        started = time.perf_counter()
        for _ in range(SYNC_ITERATIONS):
            for _ in range(calls):
                torch.mm(a, b)
            device.sync()  # the layer's result exists before its collective starts
            if comm:
                core.allreduce(small, group=group)
        return (time.perf_counter() - started) / SYNC_ITERATIONS

    block(True)  # warm-up
    pairs = [(block(False), block(True)) for _ in range(2 * repeats)]
    return paired_cost(pairs) / (2 * (ranks - 1))


def paired_cost(pairs: list[tuple[float, float]]) -> float:
    """Seconds an iteration's all-reduce adds: the median over (without, with) pairs of
    block means of their difference, never negative."""
    return max(statistics.median(both - alone for alone, both in pairs), 0.0)


def overlap(core, group, hidden: int, repeats: int, rate: float,
            device: Device = Device()) -> float:
    """``rate``: this rank's matmul FLOP/s with every rank at once (``flops``)."""
    import torch

    a, b = _operands(device, hidden)
    array = np.ones(LARGE // 4, dtype=np.float32)
    comm = allreduce_seconds(core, group, LARGE, repeats)
    calls = max(1, int(comm * rate / (2 * hidden**3)))  # about as long as the all-reduce
    compute = timed(lambda: [torch.mm(a, b) for _ in range(calls)], repeats, device)

    def both():
        worker = threading.Thread(target=lambda: core.allreduce(array, group=group))
        worker.start()
        for _ in range(calls):
            torch.mm(a, b)
        device.sync()
        worker.join()

    core.barrier()
    together = timed(both, repeats, device)
    return float(min(1.0, max(0.0, (compute + comm - together) / comm)))


def measure(hidden: int | None = None, repeats: int = 5, precision: str = "fp32") -> dict:
    """Every figure, measured on this rank; collectives with every rank of the job."""
    import torch
    from shoal.dataparallel import core

    torch.set_num_threads(1)  # one rank per core's share, as the planner's ranks run
    world = core.init()
    device = pick_device(world.local_rank, precision)
    hidden = hidden or HIDDEN[device.kind]
    local = [r for r in range(world.size)
             if r // world.local_size == world.rank // world.local_size]
    across = [r for r in range(world.size) if r % world.local_size == world.local_rank]
    host_group = _groups(core, world, "host")
    net_group = _groups(core, world, "net")
    core.barrier()
    figures = device_figures(device, hidden, repeats)
    figures["contention"] = contention(core, world, hidden, repeats, figures["flops"], device)
    details = {"world_size": world.size, "local_size": world.local_size,
               "hosts": world.num_hosts, "hidden": hidden, "device": device.name,
               "dtype": device.dtype}
    if len(local) > 1:
        small = allreduce_seconds(core, host_group, SMALL, repeats)
        large = allreduce_seconds(core, host_group, LARGE, repeats)
        figures["alpha_intra"], figures["intra_bw"] = _alpha_beta(len(local), small, large)
        figures["alpha_intra"] = max(figures["alpha_intra"], sync_latency(
            core, host_group, len(local), hidden, repeats, device))
        figures["overlap"] = overlap(core, host_group, hidden, repeats, figures["flops"],
                                     device)
    if len(across) > 1:
        small = allreduce_seconds(core, net_group, SMALL, repeats)
        large = allreduce_seconds(core, net_group, LARGE, repeats)
        alpha, bw = _alpha_beta(len(across), small, large)
        alpha = max(alpha, sync_latency(core, net_group, len(across), hidden, repeats, device))
        figures["alpha_net"], figures["net_bw"] = alpha, bw * world.local_size
    gathered = core.allgather(np.array([figures.get(k, np.nan) for k in KEYS]))
    merged = _merge(gathered.reshape(world.size, len(KEYS)))
    return {"rank": world.rank, "calibration": merged, "details": details}


KEYS = ("flops", "layer_overhead", "hbm", "alpha_intra", "intra_bw", "overlap", "alpha_net",
        "net_bw", "contention")
_SLOWEST = {"flops": min, "hbm": min, "intra_bw": min, "net_bw": min, "overlap": min,
            "layer_overhead": max, "alpha_intra": max, "alpha_net": max,
            "contention": statistics.median}


def _merge(rows: np.ndarray) -> dict:
    """One figure per key: the slowest rank's, as the slowest rank sets a step's pace."""
    merged = {}
    for i, key in enumerate(KEYS):
        values = [v for v in rows[:, i] if np.isfinite(v)]
        if values:
            merged[key] = float(_SLOWEST[key](values))
    return merged


def _groups(core, world, kind: str):
    """This rank's group of ``kind``; every rank creates every group, in the same order."""
    mine = None
    hosts, local = world.size // world.local_size, world.local_size
    if kind == "host":
        for h in range(hosts):
            ranks = list(range(h * local, (h + 1) * local))
            group = core.new_group(ranks) if local > 1 else None
            if world.rank in ranks:
                mine = group
    else:
        for lr in range(local):
            ranks = list(range(lr, world.size, local))
            group = core.new_group(ranks) if hosts > 1 else None
            if world.rank in ranks:
                mine = group
    return mine


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="JSON file rank 0 writes")
    parser.add_argument("--hidden", type=int,
                        help="matmul size (default: 512 on CPU ranks, 4096 on GPUs)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--precision", choices=sorted(DTYPES), default="fp32",
                        help="the job's training precision: a GPU's matmuls run in it")
    args = parser.parse_args(argv)
    result = measure(args.hidden, args.repeats, args.precision)
    if result.pop("rank") == 0:
        with open(args.out, "w", encoding="utf-8") as handle:
            json.dump(result, handle, indent=2)


if __name__ == "__main__":
    main()
