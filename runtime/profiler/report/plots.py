"""The report's plots, as inline SVG (matplotlib, Agg): utilization per host and core (and
GPU) over time, step durations with their outliers, load across ranks, compute against
collectives on a timeline, data-loading time. Each function returns the SVG text, or None
when the job recorded nothing it could show."""

from __future__ import annotations

import io
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from shoal.profiler.data import Store, exposed_time  # noqa: E402

COLORS = plt.get_cmap("tab10").colors


def _svg(fig) -> str:
    buf = io.StringIO()
    fig.savefig(buf, format="svg", bbox_inches="tight",
                metadata={"Creator": None, "Date": None, "Format": None, "Type": None})
    plt.close(fig)
    text = buf.getvalue()
    return text[text.index("<svg"):]


def _t0(store: Store) -> float:
    span = store.span()
    return span[0] if span else 0.0


def utilization(store: Store) -> str | None:
    """CPU per core (and GPU per device) over time, one panel per host."""
    fig = utilization_figure(store)
    return _svg(fig) if fig is not None else None


def utilization_figure(store: Store):
    """The figure ``utilization`` draws: constrained layout keeps each host's title clear of
    the x-axis labels of the panel above it (fixed margins let them overlap)."""
    nodes = [n for n in store.nodes if store.metrics.get(n)]
    if not nodes:
        return None
    t0 = _t0(store)
    fig, axes = plt.subplots(len(nodes), 1, figsize=(10, 2.8 * len(nodes)), squeeze=False,
                             layout="constrained")
    for ax, node in zip(axes[:, 0], nodes):
        lines = defaultdict(list)
        for m in store.metrics[node]:
            if m.dimension in ("CPUUtilization", "GPUUtilization"):
                lines[(m.dimension, m.name)].append((m.ts - t0, m.value))
        for i, ((dimension, name), points) in enumerate(sorted(lines.items())):
            xs, ys = zip(*points)
            style = "-" if dimension == "CPUUtilization" else "--"
            ax.plot(xs, ys, style, lw=1, color=COLORS[i % 10], label=name)
        ax.set_ylim(0, 105)
        ax.set_ylabel("%")
        ax.set_title(f"{node}: utilization per core and GPU")
        ax.legend(loc="upper right", fontsize=7, ncol=min(8, max(1, len(lines))))
    axes[-1, 0].set_xlabel("seconds since the job's first record")
    return fig


def _steps(store: Store):
    out = defaultdict(list)  # (node, rank) -> [(start, duration, step_num)]
    for node, events in store.events.items():
        for e in events:
            if e.phase.startswith("Step:ModeKeys."):
                out[(node, e.args.get("rank", 0))].append((e.start, e.duration,
                                                           e.args.get("step_num", -1)))
    return out


def step_durations(store: Store, outliers: set | None = None) -> str | None:
    """The distribution of step times, the outliers (StepOutlier's) drawn apart."""
    steps = _steps(store)
    durations = [d for v in steps.values() for _, d, _ in v]
    if not durations:
        return None
    outliers = outliers or set()
    normal = [d for v in steps.values() for _, d, n in v if n not in outliers]
    slow = [d for v in steps.values() for _, d, n in v if n in outliers]
    fig, ax = plt.subplots(figsize=(10, 3))
    bins = np.histogram_bin_edges(durations, bins=60)
    ax.hist(normal, bins=bins, color=COLORS[0], label="steps")
    if slow:
        ax.hist(slow, bins=bins, color=COLORS[3], label=f"outliers ({len(slow)})")
    ax.set_xlabel("step duration (s)")
    ax.set_ylabel("steps")
    ax.set_title("Step durations")
    ax.legend()
    return _svg(fig)


def load_across_ranks(store: Store) -> str | None:
    """Step time per rank (box per rank): an uneven load shows as shifted boxes."""
    steps = _steps(store)
    if not steps:
        return None
    keys = sorted(steps, key=lambda k: (k[0], int(k[1])))
    fig, ax = plt.subplots(figsize=(10, 3))
    ax.boxplot([[d for _, d, _ in steps[k]] for k in keys], showfliers=True)
    ax.set_xticks(range(1, len(keys) + 1), [f"{n} rank {r}" for n, r in keys], fontsize=8)
    ax.set_ylabel("step duration (s)")
    ax.set_title("Load across ranks")
    return _svg(fig)


def compute_and_collectives(store: Store, max_steps: int = 40) -> str | None:
    """Each rank's last steps on a timeline, with the time it waited for collectives and,
    apart, the collectives that ran beside its compute (DDP's buckets)."""
    steps = _steps(store)
    if not steps:
        return None
    comm, overlapped = defaultdict(list), defaultdict(list)
    for node, events in store.events.items():
        for e in events:
            if e.phase != "Collective":
                continue
            key, exposed = (node, e.args.get("rank", 0)), exposed_time(e)
            if exposed is None:
                overlapped[key].append((e.start, e.duration))
            elif exposed > 0:  # the wait is the call's last part
                comm[key].append((e.start + e.duration - exposed, exposed))
    keys = sorted(steps, key=lambda k: (k[0], int(k[1])))
    last = max(s + d for v in steps.values() for s, d, _ in v)
    first = min(s for v in steps.values() for s, _, _ in sorted(v)[-max_steps:])
    fig, ax = plt.subplots(figsize=(10, 0.6 * len(keys) + 1.5))
    for row, key in enumerate(keys):
        bars = [(s - first, d) for s, d, _ in steps[key] if s >= first]
        ax.broken_barh(bars, (row - 0.35, 0.7), facecolors=[COLORS[i % 2] for i in range(len(bars))])
        beside = [(s - first, d) for s, d in overlapped.get(key, []) if s >= first]
        if beside:
            ax.broken_barh(beside, (row + 0.2, 0.15), facecolors=COLORS[2])
        waits = [(s - first, d) for s, d in comm.get(key, []) if s >= first]
        if waits:
            ax.broken_barh(waits, (row - 0.15, 0.3), facecolors=COLORS[3])
    ax.set_yticks(range(len(keys)), [f"{n} rank {r}" for n, r in keys], fontsize=8)
    ax.set_xlim(0, last - first)
    ax.set_xlabel("seconds (steps alternate in colour; red: waiting for collectives; "
                  "thin: collectives beside compute)")
    ax.set_title("Compute and collectives")
    return _svg(fig)


def data_loading(store: Store) -> str | None:
    times = [e.duration for events in store.events.values() for e in events
             if e.phase == "DataLoaderIter"]
    if not times:
        return None
    fig, ax = plt.subplots(figsize=(10, 3))
    ax.hist(times, bins=50, color=COLORS[2])
    ax.set_xlabel("time to fetch a batch (s)")
    ax.set_ylabel("batches")
    ax.set_title("Data loading")
    return _svg(fig)


def training_metrics(series, t0: float) -> str | None:
    """Each of the job's metrics (its MetricDefinitions' values) over time, a panel each."""
    series = {name: sorted(points) for name, points in series.items() if points}
    if not series:
        return None
    fig, axes = plt.subplots(len(series), 1, figsize=(10, 2.4 * len(series)), squeeze=False,
                             layout="constrained")
    for i, (ax, (name, points)) in enumerate(zip(axes[:, 0], series.items())):
        ax.plot([t - t0 for t, _ in points], [v for _, v in points], marker=".", lw=1,
                color=COLORS[i % 10])
        ax.set_title(name)
    axes[-1, 0].set_xlabel("seconds since the job's first record")
    return _svg(fig)
