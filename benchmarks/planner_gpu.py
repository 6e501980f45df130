"""The planner's cost model against one real GPU: step time and peak memory of GPT models.

The grid (``planner_grid.py``) checks the planner's ranking on CPU ranks; this checks its
figures where they matter, on an accelerator. For each GPT model and configuration (batch,
microbatches, activation checkpointing) it trains a few steps in plain PyTorch, as the
planner's transformer description means it (pre-layer-norm blocks with fused attention,
dropout, a tied head; AdamW; 16-bit matmuls through autocast with fp32 weights and
gradients, which hold the 16 bytes per parameter the model counts for 16-bit training), and
compares with the cost model's prediction for one device:

* memory: the peak the caching allocator hands out during a steady step
  (``torch.cuda.max_memory_allocated``), against the sum of the predicted terms;
* time: the median step, against the predicted step, with the device's figures measured by
  the calibration probe (``shoal.profiler.calibration.device_figures``) and, for
  comparison, the instance table's (H200: ml.p5e.48xlarge at the default efficiency).

    python benchmarks/planner_gpu.py --json planner_gpu.json
    python benchmarks/planner_gpu.py --quick      # tiny models on whatever device, a smoke test
    python benchmarks/planner_gpu.py --regrade results/planner_gpu-2026-11-29.json
                                                  # a saved run against this checkout's model
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time

from planner_grid import spearman  # ties at their average rank, as the grid ranks

MIB = 1024**2
GPU_MODELS = [  # layers, hidden, heads, seq, vocab
    (12, 1024, 16, 1024, 50304),
    (8, 2048, 16, 2048, 50304),
    (4, 4096, 32, 2048, 50304),
]
QUICK_MODELS = [(2, 64, 4, 32, 512), (3, 128, 4, 64, 1024)]
CONFIGS = [  # batch, microbatches, checkpointing
    (4, 1, False), (4, 1, True), (8, 1, False), (8, 2, False), (8, 1, True), (16, 2, True),
]
INSTANCE = "ml.p5e.48xlarge"  # H200s, the table's row the measured figures replace


def gpt(layers: int, hidden: int, heads: int, seq: int, vocab: int):
    """A GPT as ``TransformerSpec(flash=True, dropout=True, tied=True)`` describes it."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(hidden), nn.LayerNorm(hidden)
            self.qkv, self.proj = nn.Linear(hidden, 3 * hidden), nn.Linear(hidden, hidden)
            self.fc, self.out = nn.Linear(hidden, 4 * hidden), nn.Linear(4 * hidden, hidden)
            self.drop = nn.Dropout(0.1)

        def forward(self, x):
            b, s, h = x.shape
            q, k, v = self.qkv(self.ln1(x)).view(b, s, 3, heads, h // heads).unbind(2)
            y = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                               v.transpose(1, 2), is_causal=True)
            x = x + self.drop(self.proj(y.transpose(1, 2).reshape(b, s, h)))
            return x + self.drop(self.out(F.gelu(self.fc(self.ln2(x)))))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.tokens, self.positions = nn.Embedding(vocab, hidden), nn.Embedding(seq, hidden)
            self.blocks = nn.ModuleList(Block() for _ in range(layers))
            self.norm = nn.LayerNorm(hidden)
            self.checkpointing = False

        def forward(self, ids, targets):
            x = self.tokens(ids) + self.positions.weight[: ids.shape[1]]
            for block in self.blocks:
                if self.checkpointing:
                    x = torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False)
                else:
                    x = block(x)
            logits = self.norm(x) @ self.tokens.weight.t()  # the tied head
            return F.cross_entropy(logits.float().view(-1, vocab), targets.view(-1))

    return GPT()


def spec(dims):
    from shoal.planning.models import TransformerSpec

    layers, hidden, heads, seq, vocab = dims
    return TransformerSpec(layers=layers, hidden=hidden, heads=heads, seq=seq, vocab=vocab,
                           tied=True, flash=True, dropout=True)


def measure(dims, batch: int, micro: int, ckpt: bool, device, steps: int) -> dict:
    """Median step seconds and the peak bytes allocated in a steady step."""
    import torch

    torch.manual_seed(0)
    model = gpt(*dims).to(device.name)
    model.checkpointing = ckpt
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4,
                                  fused=device.kind == "cuda")
    seq, vocab = dims[3], dims[4]
    ids = torch.randint(vocab, (batch, seq), device=device.name)
    targets = torch.randint(vocab, (batch, seq), device=device.name)
    autocast = torch.autocast(device.kind, dtype=getattr(torch, device.dtype),
                              enabled=device.dtype != "float32")

    def step():
        for chunk, target in zip(ids.chunk(micro), targets.chunk(micro)):
            with autocast:
                loss = model(chunk, target) / micro
            loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    times, peak = [], 0
    for i in range(steps + 2):  # two warm-up steps: the optimizer's state, the autotuner
        device.sync()
        if device.kind == "cuda":
            torch.cuda.reset_peak_memory_stats()
        started = time.perf_counter()
        step()
        device.sync()
        if i >= 2:
            times.append(time.perf_counter() - started)
            if device.kind == "cuda":
                peak = max(peak, torch.cuda.max_memory_allocated())
    return {"seconds": statistics.median(times), "peak_bytes": peak or None}


def predict(dims, batch: int, micro: int, ckpt: bool, precision: str, calibration) -> dict:
    import attrs
    from shoal.planning import strategy
    from shoal.planning.costs import Candidate, CostModel, Workload

    hw = attrs.evolve(strategy.hardware(INSTANCE, 1, precision, strategy.Constraints(
        processes_per_host=1), calibration), memory=math.inf)
    estimate = CostModel(Workload(spec(dims).profile(), batch, precision, "adamw"),
                         hw).estimate(Candidate(1, 1, 1, microbatches=micro, checkpointing=ckpt))
    return {"seconds": estimate.step_seconds, "memory_bytes": estimate.memory_bytes,
            "memory": estimate.memory, "time": estimate.time}


def run(args) -> dict:
    import torch
    from shoal.planning.strategy import Calibration
    from shoal.profiler import calibration as probe

    torch.backends.cuda.matmul.allow_tf32 = True  # what an fp32 job on a GPU runs with
    device = probe.pick_device(0, args.precision)
    if device.kind != "cuda" and not args.quick:
        raise SystemExit("no CUDA device: run with --quick for a smoke test on this machine")
    figures = probe.device_figures(device, hidden=64 if args.quick else None,
                                   repeats=2 if args.quick else 5)
    measured_hw = Calibration(**figures)
    print(f"device {device.name} ({torch.cuda.get_device_name() if device.kind == 'cuda' else 'cpu'})"
          f", {args.precision}: matmul {figures['flops'] / 1e12:.1f} TFLOP/s, module call "
          f"{figures['layer_overhead'] * 1e6:.1f} us, optimizer {figures['hbm'] / 1e9:.0f} GB/s",
          flush=True)
    rows = []
    for dims in QUICK_MODELS if args.quick else GPU_MODELS:
        for batch, micro, ckpt in CONFIGS[:3] if args.quick else CONFIGS:
            got = measure(dims, batch, micro, ckpt, device, args.steps)
            calibrated = predict(dims, batch, micro, ckpt, args.precision, measured_hw)
            table = predict(dims, batch, micro, ckpt, args.precision, None)
            row = {"model": "L{}-h{}-a{}-s{}-v{}".format(*dims), "batch": batch,
                   "microbatches": micro, "checkpointing": ckpt, "measured": got,
                   "predicted": calibrated, "predicted_table_seconds": table["seconds"]}
            rows.append(row)
            print(line(row), flush=True)
    return {"device": device.name, "precision": args.precision, "calibration": figures,
            "rows": rows, "summary": summary(rows)}


def regrade(saved: dict) -> dict:
    """A saved run's measurements against this checkout's cost model: the same rows and
    measured device figures, the predictions made again."""
    from shoal.planning.strategy import Calibration

    measured_hw = Calibration(**saved["calibration"])
    rows = []
    for old in saved["rows"]:
        dims = tuple(int(part[1:] if part[0] in "Lhasv" else part)
                     for part in old["model"].split("-"))
        case = (dims, old["batch"], old["microbatches"], old["checkpointing"],
                saved["precision"])
        row = dict(old, predicted=predict(*case, measured_hw),
                   predicted_table_seconds=predict(*case, None)["seconds"])
        rows.append(row)
        print(line(row))
    return dict(saved, rows=rows, summary=summary(rows))


def line(row: dict) -> str:
    got, want = row["measured"], row["predicted"]
    memory = ("" if got["peak_bytes"] is None else
              f", memory {want['memory_bytes'] / MIB:.0f} MiB predicted, "
              f"{got['peak_bytes'] / MIB:.0f} measured")
    return (f"  {row['model']} batch {row['batch']} x{row['microbatches']}"
            f"{' ckpt' if row['checkpointing'] else ''}: step {want['seconds'] * 1e3:.1f} ms "
            f"predicted (table {row['predicted_table_seconds'] * 1e3:.1f}), "
            f"{got['seconds'] * 1e3:.1f} measured{memory}")


def summary(rows: list) -> dict:
    measured = [r["measured"]["seconds"] for r in rows]
    predicted = [r["predicted"]["seconds"] for r in rows]
    out = {"spearman_time": spearman(predicted, measured),
           "time_ratio_median": statistics.median(p / m for p, m in zip(predicted, measured)),
           "table_time_ratio_median": statistics.median(
               r["predicted_table_seconds"] / r["measured"]["seconds"] for r in rows)}
    peaks = [(r["predicted"]["memory_bytes"], r["measured"]["peak_bytes"]) for r in rows
             if r["measured"]["peak_bytes"]]
    if peaks:
        errors = [(p - m) / m for p, m in peaks]
        out.update(memory_error_median=statistics.median(errors),
                   memory_error_worst=max(errors, key=abs),
                   spearman_memory=spearman(*zip(*peaks)))
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--precision", choices=["fp32", "fp16", "bf16"], default="bf16")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--quick", action="store_true",
                        help="tiny models, three configurations: checks the script anywhere")
    parser.add_argument("--json", help="write the rows and the summary here")
    parser.add_argument("--regrade", metavar="JSON",
                        help="price a saved run's rows again (no GPU needed)")
    args = parser.parse_args(argv)
    if args.regrade:
        with open(args.regrade, encoding="utf-8") as handle:
            result = regrade(json.load(handle))
    else:
        result = run(args)
    print(json.dumps(result["summary"], indent=2))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump(result, handle, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
