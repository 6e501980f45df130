"""Tensor-parallel benchmark: Shoal's ``smp.nn`` modules (SMP v1 API) at degree 2 against
``torch.distributed.tensor.parallel`` (ColwiseParallel / RowwiseParallel on a 1-D CPU
DeviceMesh) on gloo and on Shoal's torch backend, for the same MLP and transformer block.

    .venv/bin/python benchmarks/tensor_parallel.py [--hidden 512] [--steps 4] [--quick]

Two cases, both post-LayerNorm, dropout 0, exact gelu:

- ``mlp``: ``smp.nn.DistributedTransformerOutputLayer`` (dense1 column-split, dense2
  row-split + all-reduce, residual, LayerNorm); torch: the same module with
  ``dense1: ColwiseParallel``, ``dense2: RowwiseParallel``.
- ``block``: ``smp.nn.DistributedTransformerLayer`` (self-attention with its heads split,
  then the MLP above), with an additive attention mask; torch: Q/K/V ``ColwiseParallel``,
  the attention's output projection and dense2 ``RowwiseParallel``.

One training step: forward, MSE loss against a fixed target, backward, SGD. Four launches
of 2 ranks (mpirun), one per side:

- ``dtensor-gloo``, ``dtensor-shoal``: ``parallelize_module`` after
  ``init_process_group("gloo")`` / ``("shoal")``; every rank computes on the same
  (replicated) batch of N sequences;
- ``shoal-prescaled``: ``smp.init({"tensor_parallel_degree": 2, "ddp": True, "optimize":
  "speed", "prescaled_batch": True})``, ``smp.DistributedModel`` and ``@smp.step``: the TP
  group shares one batch of N, the layout equivalent to torch's (the same work per step);
- ``shoal-default``: the same without ``prescaled_batch`` (SMP's default): each rank brings
  its own batch of N, so the group trains on 2N sequences a step (counted so).

Every side starts from the same full weights (one seeded ``torch.nn`` model, split by each
side its own way); the driver checks the losses of the first two steps against the same
model trained in one process (and, for ``shoal-default``, each rank's first loss against
its own batch's): within ``1e-4`` relative, or the run fails. Throughput: after warm-up,
``--repeats`` times ``--steps`` steps between barriers, timed on rank 0; the median.
"""

from __future__ import annotations

import argparse
import json
import math
import os
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
SIDES = ("dtensor-gloo", "dtensor-shoal", "shoal-prescaled", "shoal-default")
CASES = ("mlp", "block")
TP = 2
LR = 0.5
TOLERANCE = 1e-4
CHECKED_STEPS = 2


# -- the models, unsplit ------------------------------------------------------------------


def reference_modules(args):
    """The plain torch modules (the same parameter names as smp.nn's), defined lazily so
    the driver's argument parsing needs no torch."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    class Output(nn.Module):
        """dense2(gelu(dense1(x))), residual, LayerNorm: SMP's output layer (post-LN)."""

        def __init__(self, hidden, intermediate):
            super().__init__()
            self.dense1 = nn.Linear(hidden, intermediate)
            self.dense2 = nn.Linear(intermediate, hidden)
            self.layernorm = nn.LayerNorm(hidden, eps=1e-5)

        def forward(self, x):
            return self.layernorm(x + self.dense2(F.gelu(self.dense1(x))))

    class Attention(nn.Module):
        """Self-attention, output projection, residual, LayerNorm (post-LN). Under torch's
        tensor parallelism the projections return this rank's heads: the head count is
        inferred from the width."""

        def __init__(self, heads, head_size, hidden):
            super().__init__()
            self.head_size = head_size
            width = heads * head_size
            self.query = nn.Linear(hidden, width)
            self.key = nn.Linear(hidden, width)
            self.value = nn.Linear(hidden, width)
            self.dense = nn.Linear(width, hidden)
            self.layernorm = nn.LayerNorm(hidden, eps=1e-5)

        def split(self, t):
            n, s = t.shape[0], t.shape[1]
            return t.view(n, s, -1, self.head_size).permute(0, 2, 1, 3)

        def forward(self, x, mask):
            q, k, v = self.split(self.query(x)), self.split(self.key(x)), self.split(self.value(x))
            scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(self.head_size) + mask
            context = torch.matmul(F.softmax(scores, dim=-1), v).permute(0, 2, 1, 3)
            context = context.reshape(context.shape[0], context.shape[1], -1)
            return self.layernorm(self.dense(context) + x)

    class Block(nn.Module):
        def __init__(self, heads, head_size, hidden, intermediate):
            super().__init__()
            self.attention = Attention(heads, head_size, hidden)
            self.output = Output(hidden, intermediate)

        def forward(self, x, mask):
            return self.output(self.attention(x, mask))

    class MLPCase(nn.Module):
        def __init__(self):
            super().__init__()
            self.layer = Output(args.hidden, 4 * args.hidden)

        def forward(self, x, mask):  # noqa: ARG002 - one signature for both cases
            return self.layer(x)

    class BlockCase(nn.Module):
        def __init__(self):
            super().__init__()
            self.layer = Block(args.hidden // args.head_size, args.head_size, args.hidden,
                               4 * args.hidden)

        def forward(self, x, mask):
            return self.layer(x, mask)

    return {"mlp": MLPCase, "block": BlockCase}


def reference_model(case, args):
    import torch

    torch.manual_seed(0)
    return reference_modules(args)[case]()


def torch_plan(case):
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    if case == "mlp":
        return {"layer.dense1": ColwiseParallel(), "layer.dense2": RowwiseParallel()}
    return {"layer.attention.query": ColwiseParallel(), "layer.attention.key": ColwiseParallel(),
            "layer.attention.value": ColwiseParallel(), "layer.attention.dense": RowwiseParallel(),
            "layer.output.dense1": ColwiseParallel(), "layer.output.dense2": RowwiseParallel()}


def shoal_model(case, args):
    """The smp.nn module of the case, wrapped to take (x, mask) like the reference."""
    import smdistributed.modelparallel.torch.nn as smp_nn
    from torch import nn

    hidden = args.hidden
    if case == "mlp":
        layer = smp_nn.DistributedTransformerOutputLayer(
            hidden_size=hidden, intermediate_size=4 * hidden, hidden_dropout_prob=0.0,
            activation="gelu", layernorm_epsilon=1e-5, pre_layernorm=False, post_layernorm=True)
    else:
        layer = smp_nn.DistributedTransformerLayer(
            num_attention_heads=hidden // args.head_size, attention_head_size=args.head_size,
            hidden_size=hidden, intermediate_size=4 * hidden, attention_dropout_prob=0.0,
            hidden_dropout_prob=0.0, activation="gelu", layernorm_epsilon=1e-5,
            initializer_range=0.02, use_normal_initialization=False, causal_mask_size=None,
            add_cross_attention=False, pre_layernorm=False, post_layernorm=True)

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.layer = layer

        def forward(self, x, mask):
            if case == "mlp":
                return self.layer(x)
            return self.layer((x, mask))[0]

    return Net()


def load_full_weights(net, full: dict) -> None:
    """Each rank's shard of the reference's tensors, by the reference's names."""
    import torch
    from shoal.modelparallel.torch.nn.module import DistributedModule

    for prefix, module in net.named_modules():
        for name, param in module.named_parameters(recurse=False):
            tensor = full[f"{prefix}.{name}" if prefix else name]
            if isinstance(module, DistributedModule):
                module.load_full(name, tensor)
            else:
                with torch.no_grad():
                    param.copy_(tensor)


def batch(seed: int, args):
    """(x [N, S, H], mask [N, 1, 1, S] additive, target [N, S, H]) from ``seed``."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    n, s, h = args.batch, args.seq, args.hidden
    x = torch.randn(n, s, h, generator=gen)
    target = torch.randn(n, s, h, generator=gen)
    mask = torch.zeros(n, 1, 1, s)
    for i in range(n):  # padding: the last (i % 4) eighths of sample i
        masked = (i % 4) * s // 8
        if masked:
            mask[i, ..., s - masked:] = -1e4
    return x, mask, target


def reference_losses(case, args, seed, steps):
    """The losses of the first ``steps`` SGD steps of the unsplit model in one process."""
    import torch
    import torch.nn.functional as F

    model = reference_model(case, args)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    x, mask, target = batch(seed, args)
    losses = []
    for _ in range(steps):
        optimizer.zero_grad()
        loss = F.mse_loss(model(x, mask), target)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


# -- the ranks ----------------------------------------------------------------------------


def torch_side(args, rank, size):
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor.parallel import parallelize_module

    backend = args.side.split("-", 1)[1]
    if backend == "shoal":
        import shoal.dataparallel.torch  # noqa: F401 - registers the "shoal" backend
    dist.init_process_group(backend, rank=rank, world_size=size)
    mesh = DeviceMesh("cpu", list(range(size)))
    steps = {}
    for case in args.cases.split(","):
        model = reference_model(case, args)
        parallelize_module(model, mesh, torch_plan(case))
        optimizer = torch.optim.SGD(model.parameters(), lr=LR)
        x, mask, target = batch(1, args)

        def step(model=model, optimizer=optimizer, x=x, mask=mask, target=target):
            optimizer.zero_grad()
            loss = F.mse_loss(model(x, mask), target)
            loss.backward()
            optimizer.step()
            return loss.item()

        steps[case] = (step, args.batch)
    return steps, dist.barrier, dist.destroy_process_group


def shoal_side(args, rank, size):  # noqa: ARG001 - the same signature as torch_side
    import smdistributed.modelparallel.torch as smp
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    prescaled = args.side == "shoal-prescaled"
    smp.init({"tensor_parallel_degree": TP, "ddp": True, "optimize": "speed",
              "prescaled_batch": prescaled})
    steps = {}
    for case in args.cases.split(","):
        # One DistributedModel per process: the cases run in launches of their own.
        net = shoal_model(case, args)
        load_full_weights(net, reference_model(case, args).state_dict())
        model = smp.DistributedModel(net)
        optimizer = smp.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=LR))
        seed = 1 if prescaled else 1 + smp.tp_rank()
        x, mask, target = batch(seed, args)

        @smp.step
        def train(model, x, mask, target):
            loss = F.mse_loss(model(x, mask), target)
            model.backward(loss)
            return loss

        def step(model=model, optimizer=optimizer, x=x, mask=mask, target=target,
                 train=train):
            optimizer.zero_grad()
            loss = train(model, x, mask, target)
            optimizer.step()
            return loss.reduce_mean().item()

        steps[case] = (step, args.batch * (1 if prescaled else TP))
    return steps, dist.barrier, lambda: None


def worker(args) -> None:
    import torch

    torch.set_num_threads(1)
    rank = int(os.environ["OMPI_COMM_WORLD_RANK"])
    size = int(os.environ["OMPI_COMM_WORLD_SIZE"])
    side = torch_side if args.side.startswith("dtensor") else shoal_side
    steps, barrier, finish = side(args, rank, size)
    for case, (step, samples) in steps.items():
        losses = [step() for _ in range(CHECKED_STEPS)]
        for _ in range(max(0, args.warmup - CHECKED_STEPS)):
            step()
        times = []
        for _ in range(args.repeats):
            barrier()
            start = time.perf_counter()
            for _ in range(args.steps):
                step()
            barrier()
            times.append(time.perf_counter() - start)
        report = {"side": args.side, "case": case, "rank": rank, "losses": losses,
                  "samples_per_s": [samples * args.steps / t for t in times]}
        with open(os.path.join(args.out, f"{case}-rank{rank}.json"), "w") as handle:
            json.dump(report, handle)
    barrier()
    finish()


# -- the driver ---------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(side, case, args) -> list[dict]:
    with tempfile.TemporaryDirectory(prefix="shoal-tp-bench-") as folder:
        return _launch(side, case, args, folder)


def _launch(side, case, args, folder) -> list[dict]:
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()),
               SHOAL_JOB_ID=uuid.uuid4().hex[:12], SHOAL_COLLECTIVE_TIMEOUT="120")
    argv = [*MPIRUN, "-np", str(TP)]
    for name in ("MASTER_ADDR", "MASTER_PORT", "SHOAL_JOB_ID", "SHOAL_COLLECTIVE_TIMEOUT"):
        argv += ["-x", name]
    argv += [sys.executable, HERE, "worker", "--side", side, "--cases", case,
             "--out", folder, *forwarded(args)]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=args.timeout)
    if done.returncode != 0:
        raise SystemExit(f"{side} {case} failed (exit {done.returncode}):\n"
                         + done.stdout[-3000:] + done.stderr[-5000:])
    reports = []
    for rank in range(TP):
        path = os.path.join(folder, f"{case}-rank{rank}.json")
        if not os.path.exists(path):
            raise SystemExit(f"{side} {case}: rank {rank} wrote no report:\n"
                             + done.stdout[-3000:] + done.stderr[-3000:])
        with open(path) as handle:
            reports.append(json.load(handle))
    return reports


def forwarded(args) -> list[str]:
    return ["--hidden", str(args.hidden), "--head-size", str(args.head_size),
            "--batch", str(args.batch), "--seq", str(args.seq), "--steps", str(args.steps),
            "--warmup", str(args.warmup), "--repeats", str(args.repeats)]


def relative(a: float, b: float) -> float:
    return abs(a - b) / max(abs(b), 1e-12)


def check(side, reports, expected, own) -> tuple[float, str]:
    """The largest relative difference of this side's checked losses from the reference's
    (``expected``: the shared batch's first losses; ``own``: each rank's own batch's first
    loss, for shoal-default)."""
    worst, what = 0.0, ""
    for report in reports:
        if side == "shoal-default":
            pairs = [(report["losses"][0], own[report["rank"]], "step 1")]
        else:
            pairs = [(got, want, f"step {i + 1}")
                     for i, (got, want) in enumerate(zip(report["losses"], expected))]
        for got, want, step in pairs:
            diff = relative(got, want)
            if diff >= worst:
                worst, what = diff, f"rank {report['rank']} {step}: {got:.7g} vs {want:.7g}"
    return worst, what


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", nargs="?", default="driver", choices=("driver", "worker"))
    parser.add_argument("--side", choices=SIDES)
    parser.add_argument("--out", help="(worker) the folder of the ranks' reports")
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--sides", default=",".join(SIDES))
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--head-size", type=int, default=64)
    parser.add_argument("--batch", type=int, default=8, help="sequences per step (per rank "
                        "for shoal-default)")
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--steps", type=int, default=4, help="steps per timed repeat")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=1,
                        help="launches per side and case (order rotating); the median")
    parser.add_argument("--timeout", type=int, default=600, help="seconds per launch")
    parser.add_argument("--quick", action="store_true",
                        help="tiny sizes, 2 steps: a smoke run (its figures mean nothing)")
    args = parser.parse_args(argv)
    if args.quick:
        args.hidden, args.head_size, args.batch, args.seq = 64, 32, 4, 16
        args.steps, args.warmup, args.repeats = 2, 2, 1
    if args.mode == "worker":
        worker(args)
        return
    if shutil.which(MPIRUN[0]) is None:
        raise SystemExit("mpirun (Open MPI) is not on PATH")
    import torch

    torch.set_num_threads(1)
    cases = args.cases.split(",")
    sides = args.sides.split(",")
    tokens = args.batch * args.seq
    print(f"tensor parallel 2, training step (forward, backward, SGD), hidden {args.hidden}, "
          f"heads of {args.head_size}, intermediate {4 * args.hidden}, batch {args.batch} x "
          f"seq {args.seq} = {tokens} tokens; {os.cpu_count()} cores, torch threads 1 per rank; "
          f"median of {args.repeats} x {args.steps} steps after {args.warmup} warm-up",
          flush=True)
    samples: dict[tuple[str, str], list[float]] = {}
    worst: dict[tuple[str, str], float] = {}
    failures = []
    for case in cases:
        expected = reference_losses(case, args, 1, CHECKED_STEPS)
        own = [reference_losses(case, args, 1 + r, 1)[0] for r in range(TP)]
        for round_ in range(args.rounds):
            # The order rotates every round, so that drifting load falls on every side.
            for side in sides[round_ % len(sides):] + sides[:round_ % len(sides)]:
                reports = launch(side, case, args)
                diff, what = check(side, reports, expected, own)
                key = (case, side)
                worst[key] = max(worst.get(key, 0.0), diff)
                if not diff < TOLERANCE:
                    failures.append(f"{case} {side}: {what} (relative {diff:.2e})")
                samples.setdefault(key, []).append(
                    statistics.median(reports[0]["samples_per_s"]))
    rate = {key: statistics.median(values) for key, values in samples.items()}

    def cell(key, width):
        return f"{rate[key]:{width}.1f}" if key in rate else f"{'-':>{width}}"

    def ratio(top, bottom, width):
        if top in rate and bottom in rate:
            return f"{rate[top] / rate[bottom]:{width}.2f}"
        return f"{'-':>{width}}"

    layouts = {"shoal-prescaled": "prescaled: one batch of N per group",
               "shoal-default": "default: N per rank, 2N per group"}
    print()
    print("samples/s (a sample: one sequence); DTensor: one batch of N per group (replicated)")
    print()
    print("| case  | Shoal layout                        |    Shoal | DTensor gloo | Shoal / "
          "DTensor-gloo | DTensor on shoal | DTensor-shoal / DTensor-gloo |")
    print("|-------|-------------------------------------|---------:|-------------:|"
          "--------------------:|-----------------:|-----------------------------:|")
    for case in cases:
        gloo, on_shoal = (case, "dtensor-gloo"), (case, "dtensor-shoal")
        for side in ("shoal-prescaled", "shoal-default"):
            if side not in sides:
                continue
            ours = (case, side)
            print(f"| {case:<5} | {layouts[side]:<35} | {cell(ours, 8)} | {cell(gloo, 12)} | "
                  f"{ratio(ours, gloo, 20)} | {cell(on_shoal, 16)} | "
                  f"{ratio(on_shoal, gloo, 28)} |")
    print()
    for (case, side), diff in sorted(worst.items()):
        print(f"loss check {case} {side}: largest relative difference {diff:.1e}")
    if failures:
        print(f"results equal: FAILED (tolerance {TOLERANCE:g} relative)")
        for failure in failures:
            print("  " + failure)
        raise SystemExit(1)
    print(f"results equal: ok (the first {CHECKED_STEPS} losses of every side within "
          f"{TOLERANCE:g} relative of one process's; shoal-default: each rank's first)")
    for case in cases:
        ours, gloo = (case, "shoal-prescaled"), (case, "dtensor-gloo")
        if ours in rate and gloo in rate:
            value = rate[ours] / rate[gloo]
            print(f"goal {case}: shoal-prescaled >= 1.5x DTensor-gloo: {value:.2f}x, "
                  f"{'met' if value >= 1.5 else 'missed'}")

if __name__ == "__main__":
    main()
