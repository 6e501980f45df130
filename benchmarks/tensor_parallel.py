"""Tensor-parallel benchmark: Shoal's ``smp.nn`` modules (SMP v1 API) at degree 2 against
``torch.distributed.tensor.parallel`` (ColwiseParallel / RowwiseParallel on a 1-D CPU
DeviceMesh) on gloo and on Shoal's torch backend, for the same MLP and transformer block.

    .venv/bin/python benchmarks/tensor_parallel.py [--hidden 512] [--steps 3] [--repeats 3] [--quick]

Two cases, both post-LayerNorm, dropout 0, exact gelu:

- ``mlp``: ``smp.nn.DistributedTransformerOutputLayer`` (dense1 column-split, dense2
  row-split + all-reduce, residual, LayerNorm); torch: the same module with
  ``dense1: ColwiseParallel``, ``dense2: RowwiseParallel``.
- ``block``: ``smp.nn.DistributedTransformerLayer`` (self-attention with its heads split,
  then the MLP above), with an additive attention mask; torch: Q/K/V ``ColwiseParallel``,
  the attention's output projection and dense2 ``RowwiseParallel``.

One training step: forward, MSE loss against a fixed target, backward, SGD. One mpirun job
of 2 ranks per case and smp layout; in it three sides take turns (the order rotating every
repeat, so that drifting machine load falls on all of them):

- **Shoal**: ``smp.init({"tensor_parallel_degree": 2, "ddp": True, "optimize": "speed",
  "prescaled_batch": ...})``, ``smp.DistributedModel``, ``smp.DistributedOptimizer`` and
  ``@smp.step``. ``prescaled``: the TP group shares one batch of N sequences, the layout
  equivalent to torch's (the same work per step). ``default`` (SMP's default): each rank
  brings its own batch of N, so the group trains on 2N sequences a step (counted so);
- **DTensor on gloo**: ``parallelize_module`` on a ``DeviceMesh`` over a gloo group;
  every rank computes on the same (replicated) batch of N;
- **DTensor on shoal**: the same on the default group, which smp started on Shoal's
  torch.distributed backend (``backend="shoal"``).

Every side starts from the same full weights (one seeded ``torch.nn`` model, split by each
side its own way); the driver checks every rank's losses of the first two steps against the
same model trained in one process (for the default layout: on both ranks' batches together,
the mean squared error over the 2N sequences, each rank's loss on its own N): within
``1e-4`` relative, or the run fails. The second step's loss depends on the first step's
gradients. Throughput: after warm-up, ``--repeats`` times ``--steps`` steps of each side
between barriers, timed on rank 0; the table shows the medians and the median of the
ratios of sides timed back to back.
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


def reference_losses(case, args, seeds, steps):
    """The unsplit model trained in one process on the batches of ``seeds`` together (the
    mean squared error over all of them), ``steps`` SGD steps: each step's loss on each
    seed's batch (``[step][seed]``)."""
    import torch

    model = reference_model(case, args)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    batches = [batch(seed, args) for seed in seeds]
    x, mask, target = (torch.cat(parts) for parts in zip(*batches))
    losses = []
    for _ in range(steps):
        optimizer.zero_grad()
        errors = (model(x, mask) - target).pow(2).view(len(seeds), -1).mean(1)
        errors.mean().backward()
        optimizer.step()
        losses.append(errors.tolist())
    return losses


def one_process_rate(case, args) -> float:
    """Samples/s of the unsplit model on one thread (the batch of N), timed as the ranks
    time theirs: what tensor parallelism divides."""
    import torch
    import torch.nn.functional as F

    model = reference_model(case, args)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    x, mask, target = batch(1, args)

    def step():
        optimizer.zero_grad()
        F.mse_loss(model(x, mask), target).backward()
        optimizer.step()

    for _ in range(args.warmup):
        step()
    rates = []
    for _ in range(args.repeats):
        start = time.perf_counter()
        for _ in range(args.steps):
            step()
        rates.append(args.batch * args.steps / (time.perf_counter() - start))
    return statistics.median(rates)


# -- the ranks ----------------------------------------------------------------------------


def dtensor_step(case, args, group):
    """A training step of the case under torch's tensor parallelism on ``group``."""
    import torch
    import torch.nn.functional as F
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor.parallel import parallelize_module

    model = reference_model(case, args)
    parallelize_module(model, DeviceMesh.from_group(group, "cpu"), torch_plan(case))
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    x, mask, target = batch(1, args)

    def step():
        optimizer.zero_grad()
        loss = F.mse_loss(model(x, mask), target)
        loss.backward()
        optimizer.step()
        return loss.item()

    return step


def shoal_step(case, args, smp, prescaled):
    """A training step of the case on smp.nn (``@smp.step``), and which batch this rank
    trains on."""
    import torch
    import torch.nn.functional as F

    net = shoal_model(case, args)
    load_full_weights(net, reference_model(case, args).state_dict())
    model = smp.DistributedModel(net)
    optimizer = smp.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=LR))
    which = 0 if prescaled else smp.tp_rank()
    x, mask, target = batch(1 + which, args)

    @smp.step
    def train(model, x, mask, target):
        loss = F.mse_loss(model(x, mask), target)
        model.backward(loss)
        return loss

    def step():
        optimizer.zero_grad()
        loss = train(model, x, mask, target)
        optimizer.step()
        return loss.reduce_mean().item()

    return step, which


def worker(args) -> None:
    """One case, one smp layout; the three sides' steps alternate in this job."""
    import smdistributed.modelparallel.torch as smp
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    prescaled = args.layout == "prescaled"
    # ddp: smp starts torch.distributed on Shoal's backend (the default group) itself.
    smp.init({"tensor_parallel_degree": TP, "ddp": True, "optimize": "speed",
              "prescaled_batch": prescaled})
    rank = dist.get_rank()
    gloo = dist.new_group(list(range(dist.get_world_size())), backend="gloo")
    shoal_train, which = shoal_step(args.case, args, smp, prescaled)
    sides = {"shoal": (shoal_train, args.batch * (1 if prescaled else TP), which),
             "dtensor-gloo": (dtensor_step(args.case, args, gloo), args.batch, 0),
             "dtensor-shoal": (dtensor_step(args.case, args, dist.group.WORLD), args.batch, 0)}
    names = list(sides)
    losses = {name: [step() for _ in range(CHECKED_STEPS)]
              for name, (step, _, _) in sides.items()}
    for _ in range(max(0, args.warmup - CHECKED_STEPS)):
        for step, _, _ in sides.values():
            step()
    rates: dict[str, list[float]] = {name: [] for name in names}
    for repeat in range(args.repeats):
        # The order rotates every repeat, so that drifting load falls on every side.
        for name in names[repeat % len(names):] + names[:repeat % len(names)]:
            step, samples, _ = sides[name]
            dist.barrier()
            start = time.perf_counter()
            for _ in range(args.steps):
                step()
            dist.barrier()
            rates[name].append(samples * args.steps / (time.perf_counter() - start))
    report = {"rank": rank, "losses": losses, "batch": {n: sides[n][2] for n in names},
              "rates": rates}
    with open(os.path.join(args.out, f"rank{rank}.json"), "w") as handle:
        json.dump(report, handle)
    dist.barrier()


# -- the driver ---------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(case, layout, args) -> list[dict]:
    with tempfile.TemporaryDirectory(prefix="shoal-tp-bench-") as folder:
        env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()),
                   SHOAL_JOB_ID=uuid.uuid4().hex[:12], SHOAL_COLLECTIVE_TIMEOUT="120")
        argv = [*MPIRUN, "-np", str(TP)]
        for name in ("MASTER_ADDR", "MASTER_PORT", "SHOAL_JOB_ID", "SHOAL_COLLECTIVE_TIMEOUT"):
            argv += ["-x", name]
        argv += [sys.executable, HERE, "worker", "--case", case, "--layout", layout,
                 "--out", folder, *forwarded(args)]
        done = subprocess.run(argv, env=env, capture_output=True, text=True,
                              timeout=args.timeout)
        if done.returncode != 0:
            raise SystemExit(f"{case} {layout} failed (exit {done.returncode}):\n"
                             + done.stdout[-3000:] + done.stderr[-5000:])
        reports = []
        for rank in range(TP):
            path = os.path.join(folder, f"rank{rank}.json")
            if not os.path.exists(path):
                raise SystemExit(f"{case} {layout}: rank {rank} wrote no report:\n"
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


def check(reports, side, expected) -> tuple[float, str]:
    """The largest relative difference of a side's losses on every rank from one
    process's (``expected[step][i]``: the loss on the batch of seed ``1 + i``)."""
    worst, what = 0.0, ""
    for report in reports:
        for step, got in enumerate(report["losses"][side]):
            want = expected[step][report["batch"][side]]
            diff = relative(got, want)
            if diff >= worst:
                worst, what = diff, f"rank {report['rank']} step {step + 1}: {got:.7g} vs {want:.7g}"
    return worst, what


LAYOUTS = {"prescaled": "prescaled: one batch of N per group",
           "default": "default: N per rank, 2N per group"}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", nargs="?", default="driver", choices=("driver", "worker"))
    parser.add_argument("--case", choices=CASES, help="(worker)")
    parser.add_argument("--layout", choices=tuple(LAYOUTS), help="(worker)")
    parser.add_argument("--out", help="(worker) the folder of the ranks' reports")
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--layouts", default=",".join(LAYOUTS), help="smp layouts to run")
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--head-size", type=int, default=64)
    parser.add_argument("--batch", type=int, default=8, help="sequences per step (per rank "
                        "for smp's default layout)")
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--steps", type=int, default=3, help="steps per timed repeat")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3,
                        help="timed repeats per side in a job (sides alternating)")
    parser.add_argument("--rounds", type=int, default=1, help="jobs per case and layout")
    parser.add_argument("--timeout", type=int, default=600, help="seconds per job")
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
    cases, layouts = args.cases.split(","), args.layouts.split(",")
    print(f"tensor parallel 2, training step (forward, backward, SGD), hidden {args.hidden}, "
          f"heads of {args.head_size}, intermediate {4 * args.hidden}, batch N = {args.batch} "
          f"x seq {args.seq} = {args.batch * args.seq} tokens; {os.cpu_count()} cores, torch "
          f"threads 1 per rank; per job {args.repeats} x {args.steps} timed steps per side "
          f"(sides alternating) after {args.warmup} warm-up, {args.rounds} job(s) per row",
          flush=True)
    rows = {}
    worst: dict[tuple[str, str], float] = {}
    failures = []
    for case in cases:
        expected = {"shared": reference_losses(case, args, [1], CHECKED_STEPS),
                    "own": reference_losses(case, args, [1 + r for r in range(TP)],
                                            CHECKED_STEPS)}
        for layout in layouts:
            rates: dict[str, list[float]] = {}
            for _ in range(args.rounds):
                reports = launch(case, layout, args)
                for side in ("shoal", "dtensor-gloo", "dtensor-shoal"):
                    which = "own" if side == "shoal" and layout == "default" else "shared"
                    diff, what = check(reports, side, expected[which])
                    name = f"shoal-{layout}" if side == "shoal" else side
                    worst[(case, name)] = max(worst.get((case, name), 0.0), diff)
                    if not diff < TOLERANCE:
                        failures.append(f"{case} {name} ({layout} job): {what} "
                                        f"(relative {diff:.2e})")
                    rates.setdefault(side, []).extend(reports[0]["rates"][side])
            rows[(case, layout)] = rates
    alone = {case: one_process_rate(case, args) for case in cases}

    print()
    print("samples/s (a sample: one sequence of the batch); medians over the timed repeats; "
          "DTensor: one replicated batch of N per group, in the same jobs as the smp row")
    print()
    print("| case  | smp layout                          |    Shoal | DTensor gloo | Shoal / "
          "DTensor-gloo | DTensor on shoal | DTensor-shoal / DTensor-gloo |")
    print("|-------|-------------------------------------|---------:|-------------:|"
          "--------------------:|-----------------:|-----------------------------:|")
    for (case, layout), rates in rows.items():
        median = {side: statistics.median(values) for side, values in rates.items()}
        # Paired: each repeat's ratio, the sides timed back to back; the median of those.
        ours = statistics.median(a / b for a, b in zip(rates["shoal"], rates["dtensor-gloo"]))
        theirs = statistics.median(a / b for a, b in zip(rates["dtensor-shoal"],
                                                         rates["dtensor-gloo"]))
        rows[(case, layout)] = ours
        print(f"| {case:<5} | {LAYOUTS[layout]:<35} | {median['shoal']:8.1f} | "
              f"{median['dtensor-gloo']:12.1f} | {ours:20.2f} | {median['dtensor-shoal']:16.1f} "
              f"| {theirs:28.2f} |")
    print()
    for case in cases:
        print(f"one process, whole model, 1 thread, {case}: {alone[case]:.1f} samples/s "
              f"(TP 2 with free communication: {TP * alone[case]:.1f})")
    for (case, side), diff in sorted(worst.items()):
        print(f"loss check {case} {side}: largest relative difference {diff:.1e}")
    if failures:
        print(f"results equal: FAILED (tolerance {TOLERANCE:g} relative)")
        for failure in failures:
            print("  " + failure)
        raise SystemExit(1)
    print(f"results equal: ok (the first {CHECKED_STEPS} losses of every side on every rank "
          f"within {TOLERANCE:g} relative of one process's)")
    for case in cases:
        if (case, "prescaled") in rows:
            value = rows[(case, "prescaled")]
            print(f"goal {case}: smp prescaled >= 1.5x DTensor-gloo: {value:.2f}x, "
                  f"{'met' if value >= 1.5 else 'missed'}")


if __name__ == "__main__":
    main()
