"""Strategy planner against measurement: every legal configuration of two small models, run.

    .venv/bin/python benchmarks/planner_grid.py [--models mlp,transformer] [--batch 16]
        [--steps 4] [--warmup 2] [--max-microbatches 4] [--rounds 1] [--budget-fraction 0.7]
        [--json out.json] [--quick]
    .venv/bin/python benchmarks/planner_grid.py --max-microbatches 2 phases --model mlp \
        "data 4" "data 4, activation checkpointing"      (where one step's memory goes)
    .venv/bin/python benchmarks/planner_grid.py --max-microbatches 2 --steps 6 --warmup 2 \
        --rounds 5 finals results/planner_grid-2026-11-29e.json --fractions 0.7,0.8
                                                 (the pick and the best, run again head to head)

Two simulated hosts x two processes (4 mpirun ranks; ``SHOAL_HOST`` per rank, so Shoal's
core and SMP's placement see two hosts of two), ``torch.set_num_threads(1)`` per rank. First
the calibration probe (``shoal.profiler.calibration``) measures this machine with the same
four ranks: matmul rate, ranks per core, per-layer overhead, memory bandwidth, all-reduce alpha-beta inside
and between the simulated hosts, overlap. A second short run measures the runtime's own
memory for each layout (a six-layer model of 8 x 8 layers, its peak RSS growth under the same
degrees), added to the prediction of every configuration of that layout. No grid point is
used to calibrate.

Then, per model, every configuration ``shoal.planning.strategy.candidates`` lists for that
cluster (data, tensor, pipeline, sharded data degrees; optimizer-state sharding;
microbatches up to ``--max-microbatches``; activation checkpointing of the blocks) runs
through Shoal's SMP v1 runtime (``smp.init``, ``smp.DistributedModel``, ``@smp.step``, Adam),
one mpirun job each: ``--warmup`` steps, then the median of ``--steps`` timed steps. Memory
comes from one more job per configuration run with glibc giving freed memory back at once
(``LIVE_ENV``): the largest growth over the ranks of the peak of the private and
shared-memory pages (the resident set less the pages mapped from files: the libraries'
code, which the ranks share and a GPU's memory never holds). Under glibc's defaults a
runtime whose threads allocate (prefetch, reduce, pipeline receive) keeps every thread
arena's peak, up to 1.7x the live bytes on this grid; the planner predicts live bytes (as
``torch.cuda.max_memory_allocated`` counts them on a GPU). The timed jobs' RSS growth is
printed in its own column. With ``--rounds R`` the whole grid runs R times
(alternating order) and each row is the median of its R runs: on ranks that share cores one
job's time varies by several percent from run to run. The models:

- ``mlp``: a stem ``Linear``, 8 residual MLP blocks (LayerNorm, h -> 4h, gelu, 4h -> h) at
  h = 256 on 32 tokens a sample, a classifier; its profile is traced on the meta device;
  tensor parallelism distributes its ``nn.Linear`` layers (``smp.tensor_parallelism()``);
- ``transformer``: a token embedding, 4 ``smp.nn.DistributedTransformerLayer`` (h 256,
  4 heads, causal, sequence 64), a LayerNorm and a vocabulary head (4096); its profile is the
  planner's transformer formulas, with the embedding and the head replicated.

The table: each configuration's predicted and measured step time and memory. Below it, per
model: the Spearman rank correlation of predicted and measured step times, the planner's pick
(``plan_strategy`` for this cluster, calibrated, with a memory budget per rank of
``--budget-fraction`` of the largest measured growth, of which it plans on
``USABLE_FRACTION`` as on every instance type, less the reserve) and its regret against
the fastest measured configuration within the budget, and every configuration predicted to
fit (within that usable share) that measured over the budget (none wanted). Goals: regret <= 10 %, Spearman >= 0.8, no such configuration.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid

HERE = os.path.abspath(__file__)
MPIRUN = ["mpirun", "--allow-run-as-root", "--oversubscribe"]
HOSTS, PER_HOST = 2, 2
RANKS = HOSTS * PER_HOST
MODELS = ("mlp", "transformer")
MLP = {"hidden": 256, "tokens": 32, "blocks": 8, "inputs": 64, "classes": 16}
GPT = {"hidden": 256, "heads": 4, "layers": 4, "seq": 64, "vocab": 4096}


# -- the models ------------------------------------------------------------------------------


def mlp_model():
    import torch
    from torch import nn

    class Block(nn.Module):
        def __init__(self, h):
            super().__init__()
            self.norm, self.up, self.down = nn.LayerNorm(h), nn.Linear(h, 4 * h), nn.Linear(4 * h, h)

        def forward(self, x):
            return x + self.down(torch.nn.functional.gelu(self.up(self.norm(x))))

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            h = MLP["hidden"]
            self.stem = nn.Linear(MLP["inputs"], h)
            self.blocks = nn.ModuleList(Block(h) for _ in range(MLP["blocks"]))
            self.head = nn.Linear(h, MLP["classes"])

        def forward(self, x):
            x = self.stem(x)
            for block in self.blocks:
                x = block(x)
            return self.head(x)

    return Net()


def gpt_model():
    import smdistributed.modelparallel.torch.nn as smp_nn
    import torch
    from torch import nn

    h, seq = GPT["hidden"], GPT["seq"]

    class Layer(nn.Module):
        def __init__(self):
            super().__init__()
            self.layer = smp_nn.DistributedTransformerLayer(
                num_attention_heads=GPT["heads"], attention_head_size=h // GPT["heads"],
                hidden_size=h, intermediate_size=4 * h, attention_dropout_prob=0.0,
                hidden_dropout_prob=0.0, activation="gelu", causal_mask_size=seq,
                pre_layernorm=True, post_layernorm=False)

        def forward(self, x):
            mask = torch.zeros(x.shape[0], 1, 1, x.shape[1])
            return self.layer((x, mask))[0]

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(GPT["vocab"], h)
            self.blocks = nn.ModuleList(Layer() for _ in range(GPT["layers"]))
            self.norm, self.head = nn.LayerNorm(h), nn.Linear(h, GPT["vocab"])

        def forward(self, tokens):
            x = self.embed(tokens)
            for block in self.blocks:
                x = block(x)
            return self.head(self.norm(x))

    return Net()


def tiny_model():
    from torch import nn

    return nn.Sequential(nn.Linear(MLP["inputs"], 8), *[nn.Linear(8, 8) for _ in range(4)],
                         nn.Linear(8, MLP["classes"]))


def profile(model: str):
    """The planner's view of a grid model."""
    import attrs
    from shoal.planning.models import TransformerSpec
    from shoal.planning.tracing import profile_module

    if model == "mlp":
        import torch

        with torch.device("meta"):
            net = mlp_model()
        return profile_module(net, (8, MLP["tokens"], MLP["inputs"]), name="mlp")
    spec = TransformerSpec(layers=GPT["layers"], hidden=GPT["hidden"], heads=GPT["heads"],
                           seq=GPT["seq"], vocab=GPT["vocab"], tied=False, dropout=False)
    prof = spec.profile()
    # the grid's embedding and head are plain modules: replicated under tensor parallelism;
    # the model returns its logits (2 bytes per element in the profile's unit) and the step
    # function computes the loss
    layers = [layer if layer.repeated else attrs.evolve(
        layer, split=False, tp_comm=0.0, act_kept=layer.act_kept + layer.act_split,
        act_split=0.0) for layer in prof.layers]
    # its head returns the logits (no loss): the last stage holds them, 12 bytes per element
    # in float32 (in the profile's 16-bit unit, scaled by two), as priced before the loss
    # term existed
    head = layers[-1]
    layers[-1] = attrs.evolve(head, boundary=2 * GPT["seq"] * GPT["vocab"], loss=0.0,
                              act_kept=head.act_kept + head.loss / 2)
    return attrs.evolve(prof, layers=layers)


def batch(model: str, samples: int, seed: int):
    import torch

    g = torch.Generator().manual_seed(seed)
    if model == "mlp":
        return (torch.randn(samples, MLP["tokens"], MLP["inputs"], generator=g),
                torch.randint(0, MLP["classes"], (samples, MLP["tokens"]), generator=g))
    tokens = torch.randint(0, GPT["vocab"], (samples, GPT["seq"] + 1), generator=g)
    return tokens[:, :-1], tokens[:, 1:]


# -- one configuration, on every rank ----------------------------------------------------------


def worker(args) -> None:
    import smdistributed.modelparallel.torch as smp
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    torch.set_num_threads(1)
    config = json.loads(args.config)
    smp.init(config["parameters"])
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    private_before = _private()[0]
    args.base = _resident()[0] if args.phases else 0
    torch.manual_seed(0)
    with smp.tensor_parallelism(enabled=config["parameters"].get("tensor_parallel_degree",
                                                                 1) > 1):
        net = {"mlp": mlp_model, "transformer": gpt_model, "tiny": tiny_model}[args.model]()
    oss = bool(config["parameters"].get("shard_optimizer_state"))
    model = smp.DistributedModel(net, gradient_as_bucket_view=oss)  # SMP needs it for OSS
    optimizer = smp.DistributedOptimizer(torch.optim.Adam(model.parameters(), lr=1e-4))
    x, y = batch("mlp" if args.model == "tiny" else args.model, config["batch_per_rank"],
                 seed=1 + smp.rdp_rank())

    @smp.step
    def train(model, x, y):
        out = model(x)
        loss = F.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1))
        model.backward(loss)
        return loss

    if args.phases:
        phases(args, lambda: train(model, x, y), optimizer, dist)
        return
    times, private = [], 0
    for step in range(args.warmup + args.steps):
        _reset_peak()
        dist.barrier()
        started = time.perf_counter()
        optimizer.zero_grad()
        train(model, x, y)
        optimizer.step()
        dist.barrier()
        if step >= args.warmup:
            times.append(time.perf_counter() - started)
        private = max(private, _private()[1] - private_before)
    grown = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) * 1024
    every = [None] * dist.get_world_size()
    dist.all_gather_object(every, (private, grown))
    if dist.get_rank() == 0:
        print("GRID " + json.dumps({"seconds": statistics.median(times), "steps": times,
                                    "memory": max(p for p, _ in every),
                                    "memory_rss": max(g for _, g in every)}), flush=True)


def phases(args, train, optimizer, dist) -> None:
    """Where a step's memory goes, on the last of ``warmup + steps`` steps: the resident set
    once the model is built, the peak of the forward and backward and of the optimizer step,
    and what the step leaves, each above the resident set before the model was built (Linux
    resets the peak, ``VmHWM``, on writing 5 to ``/proc/self/clear_refs``). Largest over the
    ranks."""
    found = {"built": _resident()[0] - args.base}
    for _ in range(args.warmup + args.steps):
        dist.barrier()
        optimizer.zero_grad()
        _reset_peak()
        train()
        found["forward_backward_peak"] = _resident()[1] - args.base
        _reset_peak()
        optimizer.step()
        resident, peak = _resident()
        found["optimizer_peak"], found["after_step"] = peak - args.base, resident - args.base
    every = [None] * dist.get_world_size()
    dist.all_gather_object(every, found)
    if dist.get_rank() == 0:
        print("GRID " + json.dumps({k: max(r[k] for r in every) for k in found}), flush=True)


def _status(*keys: str) -> list[int]:
    """Fields of ``/proc/self/status``, in bytes, in the order asked (one read)."""
    values = {}
    with open("/proc/self/status", encoding="ascii") as status:
        for line in status:
            key, _, rest = line.partition(":")
            if key in keys:
                values[key] = int(rest.split()[0]) * 1024
    return [values[key] for key in keys]


def _resident() -> tuple[int, int]:
    """This process's resident set and its peak since the last reset, in bytes."""
    resident, peak = _status("VmRSS", "VmHWM")
    return resident, peak


def _private() -> tuple[int, int]:
    """This process's private and shared-memory pages, and their peak since the last
    reset: the resident set (and its peak) less the pages mapped from files, the
    libraries' code, which the ranks share and the kernel can drop (they only grow: those
    mapped now are at least those mapped at the peak). A GPU's memory holds no such pages."""
    resident, peak, files = _status("VmRSS", "VmHWM", "RssFile")
    return resident - files, peak - files


def _reset_peak() -> None:
    with open("/proc/self/clear_refs", "w", encoding="ascii") as refs:
        refs.write("5")


# -- the driver --------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def mpirun(command: list[str], timeout: float, env_extra=None) -> str:
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()),
               SHOAL_JOB_ID=uuid.uuid4().hex[:12], SHOAL_COLLECTIVE_TIMEOUT="120",
               **(env_extra or {}))
    argv = [*MPIRUN, "-np", str(RANKS)]
    for name in ("MASTER_ADDR", "MASTER_PORT", "SHOAL_JOB_ID", "SHOAL_COLLECTIVE_TIMEOUT",
                 *(env_extra or {})):
        argv += ["-x", name]
    wrapped = " ".join(f"'{part}'" for part in command)
    argv += ["bash", "-c", f"SHOAL_HOST=h$((OMPI_COMM_WORLD_RANK/{PER_HOST})) exec {wrapped}"]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise RuntimeError(f"exit {done.returncode}: " + (done.stdout + done.stderr)[-3000:])
    return done.stdout


def calibrate(timeout: float):
    from shoal.planning import calibrate as calibrate_

    with tempfile.TemporaryDirectory(prefix="shoal-grid-") as folder:
        out = os.path.join(folder, "calibration.json")
        mpirun([sys.executable, "-m", "shoal.profiler.calibration", "--out", out,
                "--hidden", "256"], timeout)
        return calibrate_.read(out)


# glibc's initial threshold, set: blocks of 128 KiB and more are mapped and unmapped, and the
# threshold no longer rises after each free (which is what lets freed blocks pile up)
LIVE_ENV = {"MALLOC_MMAP_THRESHOLD_": "131072"}


def run_config(args, model: str, params: dict, per_rank: int, ckpt: bool,
               live: bool = False) -> dict:
    """One job: its median step time and peak RSS growth; with ``live``, glibc set to give
    freed memory back (slower steps, memory that tracks the live bytes), three steps."""
    config = json.dumps({"parameters": params, "batch_per_rank": per_rank})
    env = {"SHOAL_ACTIVATION_CHECKPOINTING": "blocks" if ckpt else "off",
           **(LIVE_ENV if live else {})}
    steps, warmup = (2, 1) if live else (args.steps, args.warmup)
    out = mpirun([sys.executable, HERE, "worker", "--model", model, "--config", config,
                  "--steps", str(steps), "--warmup", str(warmup)], args.timeout, env)
    line = next(line for line in out.splitlines() if line.startswith("GRID "))
    return json.loads(line[5:])


def parameters(c, precision="fp32") -> dict:
    params = {"pipeline_parallel_degree": c.pipeline, "microbatches": c.microbatches,
              "ddp": True, "placement_strategy": "cluster"}
    if c.tensor > 1:
        params.update(tensor_parallel_degree=c.tensor, prescaled_batch=True)
    if c.sharded > 1:
        params["sharded_data_parallel_degree"] = c.sharded
    if c.optimizer_sharding:
        params["shard_optimizer_state"] = True
    return params


def spearman(xs, ys) -> float:
    def ranks(values):
        order = sorted(range(len(values)), key=values.__getitem__)
        out = [0.0] * len(values)
        i = 0
        while i < len(order):  # ties share their average rank
            j = i
            while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
                j += 1
            for k in range(i, j + 1):
                out[order[k]] = (i + j) / 2
            i = j + 1
        return out

    rx, ry = ranks(xs), ranks(ys)
    mx, my = statistics.mean(rx), statistics.mean(ry)
    cov = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    var = (sum((a - mx) ** 2 for a in rx) * sum((b - my) ** 2 for b in ry)) ** 0.5
    return cov / var if var else 0.0


def show_phases(args) -> int:
    """``phases``: one memory run of each named configuration, its phases in a table."""
    from shoal.planning import explain

    by_name = {explain.describe(c): c for c in pricing(args, args.model, None)[2]}
    unknown = [name for name in args.configs if name not in by_name]
    if unknown:
        print(f"unknown configuration(s): {unknown}; known: {sorted(by_name)}",
              file=sys.stderr)
        return 2
    mib = 1024 * 1024
    print("| configuration | built | forward and backward peak | optimizer step peak "
          "| after the step |\n|---|---|---|---|---|")
    for name in args.configs:
        c = by_name[name]
        config = json.dumps({"parameters": parameters(c), "batch_per_rank": args.batch // c.data})
        env = {"SHOAL_ACTIVATION_CHECKPOINTING": "blocks" if c.checkpointing else "off",
               **LIVE_ENV}
        out = mpirun([sys.executable, HERE, "worker", "--model", args.model, "--config",
                      config, "--steps", "2", "--warmup", "1", "--phases"], args.timeout, env)
        found = json.loads(next(line for line in out.splitlines()
                                if line.startswith("GRID "))[5:])
        print(f"| {name} | " + " | ".join(f"{found[k] / mib:.1f}" for k in (
            "built", "forward_backward_peak", "optimizer_peak", "after_step")) + " |",
            flush=True)
    return 0


def finals(args) -> int:
    """``finals``: a saved run's verdict measured again where it is decided. For each budget
    (a fraction of the largest measured peak), the planner's pick and the best measured
    within the budget run head to head, alternating, ``--rounds`` times each; the regret is
    their medians' ratio. One grid run per row leaves each row's noise in the comparison,
    and the fastest of 44 noisy rows is faster than its configuration is (a run-to-run
    spread of 10-15 % here): the minimum of many noisy rows is biased low."""
    from shoal.planning import explain

    with open(args.saved, encoding="utf-8") as handle:
        saved = json.load(handle)
    duels = []
    for fraction in (float(f) for f in args.fractions.split(",")):
        budgeted = json.loads(json.dumps(saved))
        for result in budgeted["results"]:
            measured = [r["memory"] for r in result["rows"] if "seconds" in r]
            result["budget"] = fraction * max(measured)
        for result in regrade(args, budgeted)[0]:
            if result["pick"] and result["best"]:
                duels.append((result["model"], fraction, result["pick"], result["best"]))
    times: dict = {}
    pairs = sorted({(model, name) for model, _, pick, best in duels for name in (pick, best)})
    by_name = {model: {explain.describe(c): c for c in pricing(args, model, None)[2]}
               for model in {model for model, _ in pairs}}
    for turn in range(args.rounds):
        for model, name in (pairs[::-1] if turn % 2 else pairs):
            c = by_name[model][name]
            got = run_config(args, model, parameters(c), args.batch // c.data, c.checkpointing)
            times.setdefault((model, name), []).append(got["seconds"])
            print(f"  {model} round {turn + 1}: {name}: {got['seconds']:.3f} s", file=sys.stderr,
                  flush=True)
    print("| model | budget | pick | best in the grid | pick s | best s | regret |\n"
          "|---|---|---|---|---|---|---|")
    for model, fraction, pick, best in duels:
        a, b = (statistics.median(times[(model, n)]) for n in (pick, best))
        print(f"| {model} | {fraction:g} x largest | {pick} | {best} | {a:.3f} | {b:.3f} "
              f"| {100 * (a / b - 1):+.1f} % |")
    return 0


def tiny_reserve(args, c) -> float:
    """Peak RSS growth of a tiny model laid out as ``c`` (its degrees, one microbatch): what
    the runtime itself takes on each rank for that layout (threads, buffers, groups)."""
    layout = costs_candidate(c.tensor, c.pipeline, c.data, c.sharded, c.optimizer_sharding)
    if layout not in RESERVES:
        RESERVES[layout] = float(run_config(args, "tiny", parameters(layout),
                                            args.batch // c.data, False, live=True)["memory"])
    return RESERVES[layout]


RESERVES: dict = {}


def costs_candidate(*degrees):
    from shoal.planning.costs import Candidate

    return Candidate(*degrees)


def pricing(args, model: str, calibration):
    """The planner's view of ``model`` on the grid's cluster: its profile, the cost model
    (memory unbounded: the budget is applied afterwards) and every legal configuration."""
    import math

    import attrs
    from shoal.planning import strategy
    from shoal.planning.costs import CostModel, Workload

    prof = profile(model)
    hw = attrs.evolve(strategy.hardware("local", HOSTS, "fp32", strategy.Constraints(
        processes_per_host=PER_HOST), calibration), memory=math.inf)
    costs = CostModel(Workload(prof, args.batch, "fp32", "adam"), hw)
    candidates = list(strategy.candidates(prof, hw, args.batch,
                                          max_microbatches=args.max_microbatches))
    return prof, costs, candidates


def regrade(args, saved: dict) -> tuple[list, object]:
    """A saved run's measurements against this checkout's cost model: the same rows,
    calibration and budgets, the predictions and the pick made again."""
    from shoal.planning import explain, strategy

    calibration = strategy.Calibration.from_dict(saved["calibration_figures"])
    largest = max(saved["reserves"].values(), default=0.0)
    results = []
    for old in saved["results"]:
        prof, costs, candidates = pricing(args, old["model"], calibration)
        by_name = {explain.describe(c): c for c in candidates}
        rows = []
        for row in old["rows"]:
            e = costs.estimate(by_name[row["config"]])
            rows.append({**row, "predicted_seconds": e.step_seconds,
                         "predicted_memory": e.memory_bytes + row["reserve"]})
        results.append(summarize(old["model"], rows, old["budget"], planned(
            args, prof, calibration, usable(old["budget"]) - largest)))
    return results, calibration


def grid(args, model: str, calibration) -> dict:
    from shoal.planning import explain

    prof, costs, candidates = pricing(args, model, calibration)
    if args.quick:
        candidates = candidates[:: max(1, len(candidates) // 3)][:3]
    runs: dict = {c: [] for c in candidates}
    for turn in range(args.rounds):  # whole passes, alternating order: drift hits every row
        for c in (candidates if turn % 2 == 0 else candidates[::-1]):
            try:
                runs[c].append(run_config(args, model, parameters(c), args.batch // c.data,
                                          c.checkpointing))
            except (RuntimeError, subprocess.TimeoutExpired) as error:
                runs[c].append({"error": str(error)[-400:]})
            print(f"  {model} round {turn + 1}: {explain.describe(c)}: predicted "
                  f"{costs.estimate(c).step_seconds:.3f} s, measured "
                  f"{runs[c][-1].get('seconds', float('nan')):.3f} s", file=sys.stderr,
                  flush=True)
    rows = []
    for c in candidates:
        try:
            live = run_config(args, model, parameters(c), args.batch // c.data,
                              c.checkpointing, live=True)
        except (RuntimeError, subprocess.TimeoutExpired) as error:
            live = {"error": str(error)[-400:]}
        e = costs.estimate(c)
        reserve = tiny_reserve(args, c)
        rows.append({"config": explain.describe(c), "predicted_seconds": e.step_seconds,
                     "predicted_memory": e.memory_bytes + reserve, "reserve": reserve,
                     **combine(runs[c], live)})
    ok = [r for r in rows if "seconds" in r]
    budget = args.budget_fraction * max(r["memory"] for r in ok) if ok else 0.0
    # the planner prices model memory; the runtime's own (largest layout's) comes off first
    largest = max(RESERVES.values(), default=0.0)
    return summarize(model, rows, budget, planned(args, prof, calibration,
                                                  usable(budget) - largest))


def combine(runs: list, live: dict) -> dict:
    """One row from a configuration's timed runs and its memory run: the median of the step
    times (every run's kept), the live peak, the largest RSS growth of the timed runs; an
    error if any run failed."""
    failed = [r for r in [*runs, live] if "seconds" not in r]
    if failed:
        return failed[0]
    return {"seconds": statistics.median(r["seconds"] for r in runs),
            "memory": live["memory"], "memory_rss": live["memory_rss"],
            "rss": max(r["memory_rss"] for r in runs),
            "runs": [r["seconds"] for r in runs]}


def planned(args, prof, calibration, memory: float) -> str | None:
    """The planner's own choice for the grid's cluster within ``memory`` bytes per rank."""
    import attrs
    from shoal.errors import ValidationError
    from shoal.planning import costs, explain, strategy

    try:
        plan = strategy.plan_strategy(
            prof, global_batch=args.batch, instance_type="local", instance_count=HOSTS,
            constraints=strategy.Constraints(processes_per_host=PER_HOST,
                                             max_microbatches=args.max_microbatches),
            calibration=attrs.evolve(calibration, memory=memory))
    except ValidationError:
        return None
    d = plan.degrees
    params = plan.distribution.get("smdistributed", {}).get("modelparallel", {}).get(
        "parameters", {})
    return explain.describe(costs.Candidate(
        d["tensor"], d["pipeline"], d["data"], d["sharded_data"],
        bool(params.get("shard_optimizer_state")), plan.microbatches,
        plan.activation_checkpointing))


def usable(budget: float) -> float:
    """What the planner may fill of a budget: the share of a device it plans on
    (``USABLE_FRACTION``, the headroom for transients and fragmentation its estimates leave
    out), as it does for every instance type."""
    from shoal.planning.strategy import USABLE_FRACTION

    return USABLE_FRACTION * budget


def summarize(model: str, rows: list, budget: float, pick_config: str | None) -> dict:
    """Spearman, the planner's pick against the best measured within ``budget``, and
    configurations predicted to fit that did not."""
    ok = [r for r in rows if "seconds" in r]
    fit_predicted = [r for r in ok if r["predicted_memory"] <= usable(budget)]
    fit_measured = [r for r in ok if r["memory"] <= budget]
    pick = next((r for r in ok if r["config"] == pick_config), None)
    best = min(fit_measured, key=lambda r: r["seconds"]) if fit_measured else None
    regret = pick["seconds"] / best["seconds"] - 1 if pick and best else None
    # the same against the fastest within the share the planner plans on: the ranking's
    # cost alone, the headroom's aside (for reading the figure, not a goal)
    in_share = [r for r in ok if r["memory"] <= usable(budget)]
    best_share = min(in_share, key=lambda r: r["seconds"]) if in_share else None
    return {"model": model, "rows": rows, "budget": budget,
            "spearman": spearman([r["predicted_seconds"] for r in ok],
                                 [r["seconds"] for r in ok]),
            "pick": pick and pick["config"], "best": best and best["config"], "regret": regret,
            "best_in_share": best_share and best_share["config"],
            "regret_in_share": (pick["seconds"] / best_share["seconds"] - 1
                                if pick and best_share else None),
            "over_budget": [r["config"] for r in fit_predicted if r["memory"] > budget],
            "failed": [r["config"] for r in rows if "seconds" not in r]}


def report(results: list, calibration, names: bool = False) -> None:
    mib = 1024 * 1024
    print(f"calibration: {calibration}")
    print("runtime reserve (tiny model) per layout, MiB per rank: " + ", ".join(
        f"{k if names else explain_layout(k)} {v / mib:.0f}" for k, v in RESERVES.items())
        + "\n")
    for result in results:
        print(f"## {result['model']} ({len(result['rows'])} configurations, memory budget "
              f"{result['budget'] / mib:.0f} MiB per rank)\n")
        print("| configuration | predicted s | measured s | predicted MiB | measured MiB "
              "| RSS growth, glibc defaults, MiB |")
        print("|---|---|---|---|---|---|")
        for r in sorted(result["rows"], key=lambda r: r.get("seconds", math_inf())):
            print(f"| {r['config']} | {r['predicted_seconds']:.3f} | "
                  f"{r.get('seconds', float('nan')):.3f} | {r['predicted_memory'] / mib:.0f} | "
                  f"{r.get('memory', float('nan')) / mib:.0f} | "
                  f"{r.get('rss', float('nan')) / mib:.0f} |")
        regret = result["regret"]
        print(f"\nSpearman {result['spearman']:.2f}; pick: {result['pick']}; best measured: "
              f"{result['best']}; regret {'n/a' if regret is None else f'{regret:.1%}'}; "
              f"predicted to fit but over budget: {result['over_budget'] or 'none'}; "
              f"failed: {result['failed'] or 'none'}")
        share = result["regret_in_share"]
        print(f"within the {usable(result['budget']) / mib:.0f} MiB the planner plans on: best "
              f"measured {result['best_in_share']}; regret "
              f"{'n/a' if share is None else f'{share:.1%}'}\n")


def explain_layout(c) -> str:
    from shoal.planning import explain

    return explain.describe(c)


def math_inf() -> float:
    return float("inf")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command")
    w = sub.add_parser("worker")
    w.add_argument("--model", choices=(*MODELS, "tiny"), required=True)
    w.add_argument("--config", required=True)
    w.add_argument("--steps", type=int, default=4)
    w.add_argument("--warmup", type=int, default=2)
    w.add_argument("--phases", action="store_true")
    ph = sub.add_parser("phases", help="Where each named configuration's step memory goes "
                                       "(glibc giving freed memory back), MiB per rank.")
    ph.add_argument("--model", choices=MODELS, required=True)
    ph.add_argument("configs", nargs="+", help="As the tables name them, e.g. 'data 4'.")
    fn = sub.add_parser("finals", help="A saved run's pick and best measured, run again head "
                                       "to head (--rounds each, alternating).")
    fn.add_argument("saved", help="A --json file of an earlier run.")
    fn.add_argument("--fractions", default="0.7",
                    help="Budgets as fractions of the largest measured peak, comma-separated.")
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--max-microbatches", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=1,
                        help="Run every configuration this many times (whole passes, "
                             "alternating order); each row is the median of its runs.")
    parser.add_argument("--budget-fraction", type=float, default=0.7)
    parser.add_argument("--timeout", type=float, default=300)
    parser.add_argument("--json", help="Write the results here too.")
    parser.add_argument("--regrade", metavar="JSON",
                        help="Run nothing: price a saved run's (--json) configurations "
                             "again with this checkout's cost model and print the table.")
    parser.add_argument("--quick", action="store_true",
                        help="Three configurations per model, 2 steps: checks the harness.")
    args = parser.parse_args()
    if args.command == "worker":
        worker(args)
        return 0
    if args.command == "phases":
        return show_phases(args)
    if args.command == "finals":
        return finals(args)
    if args.regrade:
        with open(args.regrade, encoding="utf-8") as handle:
            saved = json.load(handle)
        results, calibration = regrade(args, saved)
        RESERVES.update(saved["reserves"])
        report(results, calibration, names=True)
        return 0
    if shutil.which(MPIRUN[0]) is None:
        print("mpirun not found", file=sys.stderr)
        return 2
    if args.quick:
        args.steps, args.warmup = 2, 1
    calibration = calibrate(args.timeout)
    results = [grid(args, model, calibration) for model in args.models.split(",")]
    report(results, calibration)
    if args.json:
        import attrs

        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump({"calibration": str(calibration),
                       "calibration_figures": attrs.asdict(calibration),
                       "reserves": {explain_layout(k): v for k, v in RESERVES.items()},
                       "results": results}, handle, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
