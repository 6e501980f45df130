"""Sharded-data-parallel benchmark: Shoal's SDP 4 (SMP v1's ``sharded_data_parallel_degree``,
ZeRO-3 within a sharding group) against torch's FSDP2 (``fully_shard``) on gloo and on
Shoal's torch backend, for the same GPT-like transformer trained with AdamW.

    .venv/bin/python benchmarks/sharded_data_parallel.py [--hidden 256] [--layers 4] [--seq 128]
        [--batch 2] [--reduce-bucket N] [--max-live N] [--steps 5] [--repeats 5] [--rounds 1]
        [--quick]

The model: token and position embeddings, ``--layers`` pre-LayerNorm blocks (causal
self-attention through one fused QKV projection and an output projection, then an MLP of
4 x hidden with gelu), a final LayerNorm and an untied vocabulary head; dropout 0. Next-token
cross-entropy on random tokens; each of the 4 ranks trains on its own ``--batch`` sequences,
so a step trains on a global batch of 4 x batch.

One training step: forward, loss, backward, AdamW (lr 1e-3, weight decay 0.01), the
gradient's global L2 norm clipped to ``--clip`` (SMP's default, 1.0; 0 turns clipping off).
One mpirun job of 4 ranks; in it three sides take turns (the order rotating every repeat, so
that drifting machine load falls on all of them):

- **Shoal SDP 4**: ``smp.init({"ddp": True, "sharded_data_parallel_degree": 4,
  "sdp_param_persistence_threshold": 10 * hidden, "sdp_gradient_clipping": clip})``,
  ``smp.DistributedModel``, ``smp.DistributedOptimizer(torch.optim.AdamW(...))`` and
  ``@smp.step`` with ``model.backward(loss)``. The threshold is DeepSpeed's ``auto`` for a
  model of this width (10 x hidden): LayerNorms and biases stay whole on every rank, every
  matrix is sharded. The other ``sdp_*`` keys keep SMP's defaults, as the library's example
  scripts do (``--reduce-bucket`` and ``--max-live`` set ``sdp_reduce_bucket_size`` and
  ``sdp_max_live_parameters``); for a model of 4 M parameters the defaults (5e8 and 1e9
  elements) mean one reduce-scatter of every gradient after the backward and, in the
  forward and again in the backward, one prefetch of all the parameters after the first
  module's. SMP clips inside
  ``optimizer.step()``;
- **FSDP2 on gloo**: ``fully_shard`` on every block and then on the root, on a 1-D
  ``DeviceMesh`` over a gloo group of the 4 ranks; ``torch.optim.AdamW(foreach=True)`` on
  the DTensor parameters (the multi-tensor implementation torch uses by default on GPUs;
  on CPU tensors it defaults to a per-parameter loop, slower under DTensor's dispatch),
  ``torch.nn.utils.clip_grad_norm_`` before its step;
- **FSDP2 on shoal**: the same on the default group, which smp started on Shoal's
  torch.distributed backend (``backend="shoal"``).

Every side starts from the same full weights (one seeded ``torch.nn`` model, sharded by each
side its own way); the driver checks every rank's losses of the first three steps against
the same model trained in one process on the global batch (each rank's loss: the mean over
its own sequences' tokens, the one-process model's loss on the same sequences): within
``1e-4`` relative, or the run fails. From the second step on, the losses depend on the
earlier steps' averaged gradients, clipping and AdamW. Throughput: after warm-up,
``--repeats`` times ``--steps`` steps of each side between barriers, timed on rank 0; the
table shows the medians (samples/s, a sample being one sequence of the global batch) and the
median of the ratios of sides timed back to back.
"""

from __future__ import annotations

import argparse
import json
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
RANKS = 4
SDP = 4
LR = 1e-3
WEIGHT_DECAY = 0.01
TOLERANCE = 1e-4
CHECKED_STEPS = 3
SIDES = ("sdp", "fsdp2-gloo", "fsdp2-shoal")


# -- the model, unsharded -----------------------------------------------------------------


def gpt_class(args):
    """The plain torch model, defined lazily so that the driver's argument parsing needs no
    torch."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    class Attention(nn.Module):
        def __init__(self, hidden, heads):
            super().__init__()
            self.heads = heads
            self.qkv = nn.Linear(hidden, 3 * hidden)
            self.proj = nn.Linear(hidden, hidden)

        def forward(self, x):
            n, s, h = x.shape
            q, k, v = self.qkv(x).view(n, s, 3, self.heads, h // self.heads).permute(
                2, 0, 3, 1, 4).unbind(0)
            context = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            return self.proj(context.transpose(1, 2).reshape(n, s, h))

    class MLP(nn.Module):
        def __init__(self, hidden):
            super().__init__()
            self.fc = nn.Linear(hidden, 4 * hidden)
            self.out = nn.Linear(4 * hidden, hidden)

        def forward(self, x):
            return self.out(F.gelu(self.fc(x)))

    class Block(nn.Module):
        """Pre-LayerNorm: x + attn(ln1(x)), then + mlp(ln2(x))."""

        def __init__(self, hidden, heads):
            super().__init__()
            self.ln1 = nn.LayerNorm(hidden)
            self.attn = Attention(hidden, heads)
            self.ln2 = nn.LayerNorm(hidden)
            self.mlp = MLP(hidden)

        def forward(self, x):
            x = x + self.attn(self.ln1(x))
            return x + self.mlp(self.ln2(x))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            hidden = args.hidden
            self.wte = nn.Embedding(args.vocab, hidden)
            self.wpe = nn.Embedding(args.seq, hidden)
            self.blocks = nn.ModuleList(Block(hidden, hidden // args.head_size)
                                        for _ in range(args.layers))
            self.ln_f = nn.LayerNorm(hidden)
            self.head = nn.Linear(hidden, args.vocab, bias=False)

        def forward(self, tokens):
            positions = torch.arange(tokens.shape[1])
            x = self.wte(tokens) + self.wpe(positions)
            for block in self.blocks:
                x = block(x)
            return self.head(self.ln_f(x))

    return GPT


def reference_model(args):
    import torch

    torch.manual_seed(0)
    return gpt_class(args)()


def batch(seed: int, args):
    """(tokens [N, S], next tokens [N, S]) of ``seed``: rank r trains on seed ``1 + r``."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    stream = torch.randint(0, args.vocab, (args.batch, args.seq + 1), generator=gen)
    return stream[:, :-1].contiguous(), stream[:, 1:].contiguous()


def lm_loss(logits, targets):
    import torch.nn.functional as F

    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def adamw(params, foreach=None):
    import torch

    return torch.optim.AdamW(params, lr=LR, weight_decay=WEIGHT_DECAY, foreach=foreach)


def reference_losses(args, steps):
    """The model trained in one process on every rank's batch together (the mean over all
    tokens), ``steps`` steps: each step's loss on each rank's batch (``[step][rank]``)."""
    import torch

    model = reference_model(args)
    optimizer = adamw(model.parameters())
    batches = [batch(1 + rank, args) for rank in range(RANKS)]
    tokens, targets = (torch.cat(parts) for parts in zip(*batches))
    losses = []
    for _ in range(steps):
        optimizer.zero_grad()
        logits = model(tokens)
        per_rank = [lm_loss(part, goal) for part, goal in
                    zip(logits.chunk(RANKS), targets.chunk(RANKS))]
        torch.stack(per_rank).mean().backward()
        if args.clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
        optimizer.step()
        losses.append([loss.item() for loss in per_rank])
    return losses


def one_process_rate(args) -> float:
    """Samples/s of the whole model on one thread and one rank's batch, timed as the ranks
    time theirs: what each of the 4 data-parallel ranks would reach with a core to itself
    and free communication."""
    import torch

    model = reference_model(args)
    optimizer = adamw(model.parameters())
    tokens, targets = batch(1, args)

    def step():
        optimizer.zero_grad()
        lm_loss(model(tokens), targets).backward()
        if args.clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
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


def parameter_counts(args) -> tuple[int, int]:
    """(all parameters, those below the persistence threshold: whole on every SDP rank)."""
    model = reference_model(args)
    sizes = [p.numel() for p in model.parameters()]
    return sum(sizes), sum(n for n in sizes if n < persistence_threshold(args))


def persistence_threshold(args) -> int:
    # DeepSpeed's "auto" stage3_param_persistence_threshold: 10 x hidden size.
    return 10 * args.hidden


def sdp_sizes(args) -> dict:
    """The sdp_* sizes given on the command line (SMP's defaults otherwise)."""
    sizes = {}
    if args.reduce_bucket:
        sizes["sdp_reduce_bucket_size"] = args.reduce_bucket
    if args.max_live:
        sizes["sdp_max_live_parameters"] = args.max_live
    return sizes


# -- the ranks ----------------------------------------------------------------------------


def fsdp2_step(args, group, rank):
    """A training step under FSDP2 on ``group``: every block a unit, the rest the root's."""
    import torch
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import fully_shard

    model = reference_model(args)
    mesh = DeviceMesh.from_group(group, "cpu")
    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    # foreach: one multi-tensor kernel per update term over all the DTensor shards, the
    # implementation torch picks by default on GPUs. On CPU tensors its default is a loop
    # over the parameters, each DTensor op dispatched on its own, which made FSDP2's
    # optimizer step several times slower here.
    optimizer = adamw(model.parameters(), foreach=True)
    tokens, targets = batch(1 + rank, args)

    def step():
        optimizer.zero_grad()
        loss = lm_loss(model(tokens), targets)
        loss.backward()
        if args.clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
        optimizer.step()
        return loss.item()

    return step


def sdp_step(args, smp, rank):
    """A training step under smp's sharded data parallelism (``@smp.step``)."""
    net = reference_model(args)
    model = smp.DistributedModel(net)
    optimizer = smp.DistributedOptimizer(adamw(model.parameters()))
    tokens, targets = batch(1 + rank, args)

    @smp.step
    def train(model, tokens, targets):
        loss = lm_loss(model(tokens), targets)
        model.backward(loss)
        return loss

    def step():
        optimizer.zero_grad()
        loss = train(model, tokens, targets)
        optimizer.step()  # clips to sdp_gradient_clipping inside, as SMP's does
        return loss.reduce_mean().item()

    return step


def worker(args) -> None:
    """The three sides' steps alternate in this job."""
    import smdistributed.modelparallel.torch as smp
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    # ddp: smp starts torch.distributed on Shoal's backend (the default group) itself.
    smp.init({"ddp": True, "sharded_data_parallel_degree": SDP,
              "sdp_param_persistence_threshold": persistence_threshold(args),
              "sdp_gradient_clipping": args.clip, **sdp_sizes(args)})
    rank = dist.get_rank()
    gloo = dist.new_group(list(range(dist.get_world_size())), backend="gloo")
    sides = {"sdp": sdp_step(args, smp, rank),
             "fsdp2-gloo": fsdp2_step(args, gloo, rank),
             "fsdp2-shoal": fsdp2_step(args, dist.group.WORLD, rank)}
    names = list(sides)
    losses = {name: [step() for _ in range(CHECKED_STEPS)] for name, step in sides.items()}
    for _ in range(max(0, args.warmup - CHECKED_STEPS)):
        for step in sides.values():
            step()
    samples = RANKS * args.batch
    rates: dict[str, list[float]] = {name: [] for name in names}
    cpu: dict[str, list[float]] = {name: [] for name in names}
    for repeat in range(args.repeats):
        # The order rotates every repeat, so that drifting load falls on every side.
        for name in names[repeat % len(names):] + names[:repeat % len(names)]:
            step = sides[name]
            dist.barrier()
            start, clock = time.perf_counter(), time.process_time()
            for _ in range(args.steps):
                step()
            # This process's CPU time (all its threads) per step: what the side costs the
            # machine, less sensitive than the wall clock to other work sharing the cores.
            cpu[name].append((time.process_time() - clock) / args.steps)
            dist.barrier()
            rates[name].append(samples * args.steps / (time.perf_counter() - start))
    report = {"rank": rank, "losses": losses, "rates": rates, "cpu": cpu}
    with open(os.path.join(args.out, f"rank{rank}.json"), "w") as handle:
        json.dump(report, handle)
    dist.barrier()


# -- the driver ---------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(args) -> list[dict]:
    with tempfile.TemporaryDirectory(prefix="shoal-sdp-bench-") as folder:
        env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()),
                   SHOAL_JOB_ID=uuid.uuid4().hex[:12], SHOAL_COLLECTIVE_TIMEOUT="120")
        argv = [*MPIRUN, "-np", str(RANKS)]
        for name in ("MASTER_ADDR", "MASTER_PORT", "SHOAL_JOB_ID", "SHOAL_COLLECTIVE_TIMEOUT"):
            argv += ["-x", name]
        argv += [sys.executable, HERE, "worker", "--out", folder, *forwarded(args)]
        done = subprocess.run(argv, env=env, capture_output=True, text=True,
                              timeout=args.timeout)
        if done.returncode != 0:
            raise SystemExit(f"job failed (exit {done.returncode}):\n"
                             + done.stdout[-3000:] + done.stderr[-5000:])
        reports = []
        for rank in range(RANKS):
            path = os.path.join(folder, f"rank{rank}.json")
            if not os.path.exists(path):
                raise SystemExit(f"rank {rank} wrote no report:\n"
                                 + done.stdout[-3000:] + done.stderr[-3000:])
            with open(path) as handle:
                reports.append(json.load(handle))
        return reports


def forwarded(args) -> list[str]:
    return ["--hidden", str(args.hidden), "--head-size", str(args.head_size),
            "--layers", str(args.layers), "--vocab", str(args.vocab), "--batch", str(args.batch),
            "--seq", str(args.seq), "--clip", str(args.clip), "--steps", str(args.steps),
            "--reduce-bucket", str(args.reduce_bucket), "--max-live", str(args.max_live),
            "--warmup", str(args.warmup), "--repeats", str(args.repeats)]


def relative(a: float, b: float) -> float:
    return abs(a - b) / max(abs(b), 1e-12)


def check(reports, side, expected) -> tuple[float, str]:
    """The largest relative difference of a side's losses on every rank from one
    process's (``expected[step][rank]``)."""
    worst, what = 0.0, ""
    for report in reports:
        for step, got in enumerate(report["losses"][side]):
            want = expected[step][report["rank"]]
            diff = relative(got, want)
            if diff >= worst:
                worst, what = diff, f"rank {report['rank']} step {step + 1}: {got:.7g} vs {want:.7g}"
    return worst, what


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", nargs="?", default="driver", choices=("driver", "worker"))
    parser.add_argument("--out", help="(worker) the folder of the ranks' reports")
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--head-size", type=int, default=64)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=2048)
    parser.add_argument("--batch", type=int, default=2, help="sequences per rank and step")
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--clip", type=float, default=1.0,
                        help="gradient norm clipping on every side (SMP's default 1.0; 0: off)")
    parser.add_argument("--reduce-bucket", type=int, default=0,
                        help="sdp_reduce_bucket_size (0: SMP's default, 5e8 elements)")
    parser.add_argument("--max-live", type=int, default=0,
                        help="sdp_max_live_parameters (0: SMP's default, 1e9 elements)")
    parser.add_argument("--steps", type=int, default=5, help="steps per timed repeat")
    parser.add_argument("--warmup", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=5,
                        help="timed repeats per side in a job (sides alternating)")
    parser.add_argument("--rounds", type=int, default=1, help="jobs")
    parser.add_argument("--timeout", type=int, default=900, help="seconds per job")
    parser.add_argument("--quick", action="store_true",
                        help="tiny sizes, 2 steps: a smoke run (its figures mean nothing)")
    args = parser.parse_args(argv)
    if args.quick:
        args.hidden, args.head_size, args.layers, args.vocab = 64, 32, 2, 128
        args.batch, args.seq = 2, 16
        args.steps, args.warmup, args.repeats = 2, CHECKED_STEPS, 1
    if args.mode == "worker":
        worker(args)
        return
    if shutil.which(MPIRUN[0]) is None:
        raise SystemExit("mpirun (Open MPI) is not on PATH")
    import torch

    torch.set_num_threads(1)
    total, persistent = parameter_counts(args)
    print(f"sharded data parallel {SDP} on {RANKS} ranks, training step (forward, "
          f"cross-entropy, backward, clip {args.clip:g}, AdamW): GPT {args.layers} x hidden "
          f"{args.hidden} (heads of {args.head_size}, MLP {4 * args.hidden}), vocab "
          f"{args.vocab}, {total / 1e6:.2f} M parameters ({persistent} below the persistence "
          f"threshold {persistence_threshold(args)}); {args.batch} x seq {args.seq} per rank, "
          f"global batch {RANKS * args.batch}; {os.cpu_count()} cores, torch threads 1 per "
          f"rank; per job {args.repeats} x {args.steps} timed steps per side (sides "
          f"alternating) after {max(args.warmup, CHECKED_STEPS)} warm-up, {args.rounds} job(s)",
          flush=True)
    expected = reference_losses(args, CHECKED_STEPS)
    rates: dict[str, list[float]] = {side: [] for side in SIDES}
    cpu: dict[str, list[float]] = {side: [] for side in SIDES}
    worst = {side: 0.0 for side in SIDES}
    failures = []
    for _ in range(args.rounds):
        reports = launch(args)
        for side in SIDES:
            diff, what = check(reports, side, expected)
            worst[side] = max(worst[side], diff)
            if not diff < TOLERANCE:
                failures.append(f"{side}: {what} (relative {diff:.2e})")
            rates[side].extend(reports[0]["rates"][side])
            cpu[side].append(statistics.median(
                statistics.mean(r["cpu"][side][i] for r in reports)
                for i in range(args.repeats)))
    alone = one_process_rate(args)

    median = {side: statistics.median(values) for side, values in rates.items()}

    def ratios(a, b):  # each repeat's ratio, the sides timed back to back
        return [x / y for x, y in zip(rates[a], rates[b])]

    def paired(a, b):
        return statistics.median(ratios(a, b))

    vs_gloo, vs_shoal = paired("sdp", "fsdp2-gloo"), paired("sdp", "fsdp2-shoal")
    backends = paired("fsdp2-shoal", "fsdp2-gloo")
    print()
    print("samples/s (a sample: one sequence of the global batch); medians over the timed "
          "repeats; ratios: medians of the ratios of sides timed back to back")
    print()
    print("| model | Shoal SDP 4 | FSDP2 gloo | SDP / FSDP2-gloo | FSDP2 on shoal | "
          "SDP / FSDP2-shoal | FSDP2-shoal / FSDP2-gloo |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    label = f"GPT {args.layers} x {args.hidden}, seq {args.seq}, {RANKS} x {args.batch}"
    print(f"| {label} | {median['sdp']:.1f} | {median['fsdp2-gloo']:.1f} | {vs_gloo:.2f} | "
          f"{median['fsdp2-shoal']:.1f} | {vs_shoal:.2f} | {backends:.2f} |")
    print()
    print(f"one process, whole model, 1 thread, one rank's batch of {args.batch}: {alone:.1f} "
          f"samples/s (4 ranks on {os.cpu_count()} cores with free communication: about "
          f"{min(RANKS, os.cpu_count() or 1) * alone:.1f})")
    busy = {side: statistics.median(values) * 1000 for side, values in cpu.items()}
    print(f"CPU time per step and rank (all threads; median over the repeats of the ranks' "
          f"mean): SDP {busy['sdp']:.1f} ms, FSDP2-gloo {busy['fsdp2-gloo']:.1f} ms, "
          f"FSDP2-shoal {busy['fsdp2-shoal']:.1f} ms (FSDP2-gloo / SDP "
          f"{busy['fsdp2-gloo'] / busy['sdp']:.2f}, FSDP2-shoal / SDP "
          f"{busy['fsdp2-shoal'] / busy['sdp']:.2f})")
    for a, b in (("sdp", "fsdp2-gloo"), ("sdp", "fsdp2-shoal")):
        spread = ratios(a, b)
        print(f"{a} / {b} over the {len(spread)} repeats: {min(spread):.2f} to "
              f"{max(spread):.2f}")
    for side in SIDES:
        print(f"loss check {side}: largest relative difference {worst[side]:.1e}")
    if failures:
        print(f"results equal: FAILED (tolerance {TOLERANCE:g} relative)")
        for failure in failures:
            print("  " + failure)
        raise SystemExit(1)
    print(f"results equal: ok (the first {CHECKED_STEPS} losses of every side on every rank "
          f"within {TOLERANCE:g} relative of one process's)")
    print(f"goal: SDP 4 >= 1.5x FSDP2-gloo: {vs_gloo:.2f}x, "
          f"{'met' if vs_gloo >= 1.5 else 'missed'}; against FSDP2 on shoal: {vs_shoal:.2f}x")


if __name__ == "__main__":
    main()
