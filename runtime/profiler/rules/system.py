"""The rules over system metrics: CPUBottleneck, IOBottleneck, LowGPUUtilization,
GPUMemoryIncrease, LoadBalancing, BatchSize, OverallSystemUsage (Debugger's parameters,
defaults and trigger conditions; see ``shoal.profiler.rule_table``)."""

from __future__ import annotations

import itertools
from collections import defaultdict

import numpy as np
from shoal.profiler.rules.base import Rule, series, snapshots, stats


class _Bottleneck(Rule):
    """Snapshots in which a GPU idles (below ``gpu_threshold``) while a core is busy (above
    the rule's own threshold); an issue once more than ``patience`` snapshots were seen and
    more than ``threshold`` percent of them are such."""

    dimension = ""
    limit = ""

    def __init__(self, parameters=None):
        super().__init__(parameters)
        self.count = self.low_gpu = self.gpu_seen = 0
        self.times: list[float] = []

    def scan(self, metrics, events):
        for node_metrics in metrics.values():
            for snap in snapshots(node_metrics):
                gpus = [m.value for m in snap if m.dimension == "GPUUtilization"]
                cores = [m.value for m in snap if m.dimension == self.dimension]
                if not cores:
                    continue
                self.report["Datapoints"] += 1
                self.gpu_seen += bool(gpus)
                idle = bool(gpus) and min(gpus) < self.gpu_threshold
                self.low_gpu += idle
                if idle and max(cores) > self.params[self.limit]:
                    self.count += 1
                    self.times.append(snap[0].ts)
        n = self.report["Datapoints"]
        self.report["Details"] = {"bottlenecks": self.count, "low_gpu_utilization": self.low_gpu,
                                  "bottleneck_times": self.times[-100:]}
        if n > self.patience and 100.0 * self.count / n > self.threshold:
            self.trigger(self.count)

    @property
    def finding(self) -> str:
        n = self.report["Datapoints"]
        return (f"a GPU under {self.gpu_threshold:g} % while {self.what} was above "
                f"{self.params[self.limit]:g} % in {self.count} of {n} snapshots "
                f"({100.0 * self.count / max(n, 1):.0f} %, the rule's threshold {self.threshold:g} %)")

    def finish(self):
        n = self.report["Datapoints"]
        if n <= self.patience:
            self.insufficient = f"{n} snapshots, the rule needs more than patience={self.patience}"
        elif not self.gpu_seen:
            self.insufficient = "no GPU utilization was recorded (a CPU-only job)"


class CPUBottleneck(_Bottleneck):
    name = "CPUBottleneck"
    dimension, limit = "CPUUtilization", "cpu_threshold"
    what = "a CPU core"
    description = "Checks whether the CPU is busy while the GPUs idle."
    recommendation = ("Consider increasing the number of data loaders or applying data "
                      "pre-fetching.")


class IOBottleneck(_Bottleneck):
    name = "IOBottleneck"
    dimension, limit = "I/OWaitPercentage", "io_threshold"
    what = "I/O wait"
    description = "Checks whether I/O wait is high while the GPUs idle."
    recommendation = ("Pre-fetch data or choose different file formats, such as binary formats "
                      "that improve I/O performance.")


class _PerGpu(Rule):
    """Keeps every GPU's values of one dimension, by node."""

    dimension = "GPUUtilization"

    def __init__(self, parameters=None):
        super().__init__(parameters)
        self.values: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))

    def collect(self, metrics) -> None:
        for node, node_metrics in metrics.items():
            for gpu, points in series(node_metrics, self.dimension).items():
                self.values[node][gpu].extend(v for _, v in points)
        self.report["Datapoints"] = sum(len(v) for g in self.values.values() for v in g.values())

    def finish(self):
        most = max((len(v) for g in self.values.values() for v in g.values()), default=0)
        if most == 0:
            self.insufficient = "no GPU was recorded (a CPU-only job)"
        elif most <= self.patience:
            self.insufficient = f"{most} samples per GPU, the rule needs more than patience={self.patience}"


class LowGPUUtilization(_PerGpu):
    name = "LowGPUUtilization"
    description = "Checks for GPUs that are underutilized or whose utilization fluctuates."
    recommendation = ("Check if there are bottlenecks, minimize blocking calls, change "
                      "distributed training strategy, or increase the batch size.")

    def scan(self, metrics, events):
        self.collect(metrics)
        for node, gpus in self.values.items():
            for gpu, v in gpus.items():
                if len(v) <= self.patience:
                    continue
                recent = v[-self.window:]
                p95, p5 = np.percentile(recent, 95), np.percentile(recent, 5)
                entry = {**stats(recent), "gpu_95": float(p95), "gpu_5": float(p5),
                         "gpu_max": float(max(v))}
                self.report["Details"].setdefault(node, {})[gpu] = entry
                if p95 < self.threshold_p95:
                    entry["issue"] = "underutilized"
                    self.trigger()
                elif p5 < self.threshold_p5:
                    entry["issue"] = "fluctuating"
                    self.trigger()

    @property
    def finding(self) -> str:
        entries = [e for gpus in self.report["Details"].values() for e in gpus.values()
                   if isinstance(e, dict)]
        low = [e["gpu_95"] for e in entries if e.get("issue") == "underutilized"]
        fluctuating = [e["gpu_5"] for e in entries if e.get("issue") == "fluctuating"]
        parts = []
        if low:
            parts.append(f"GPU utilization (p95) under {self.threshold_p95:g} % on {len(low)} of "
                         f"{len(entries)} GPU(s), lowest {min(low):.0f} %")
        if fluctuating:
            parts.append(f"GPU utilization fluctuating (p5 under {self.threshold_p5:g} %) on "
                         f"{len(fluctuating)} of {len(entries)} GPU(s)")
        return "; ".join(parts) or super().finding


class GPUMemoryIncrease(_PerGpu):
    name = "GPUMemoryIncrease"
    dimension = "GPUMemoryUtilization"
    description = "Checks for a large increase of GPU memory use."
    recommendation = ("Choose a larger instance type with more memory if footprint is close to "
                      "maximum available memory.")

    def scan(self, metrics, events):
        self.collect(metrics)
        w = self.window
        for node, gpus in self.values.items():
            for gpu, v in gpus.items():
                if len(v) <= self.patience or len(v) < 2 * w:
                    continue
                increase = float(np.mean(v[-w:]) - np.mean(v[-2 * w:-w]))
                self.report["Details"].setdefault(node, {})[gpu] = {
                    **stats(v), "increase": increase, "gpu_max": float(max(v))}
                if increase > self.increase:
                    self.trigger()

    @property
    def finding(self) -> str:
        grew = [e["increase"] for gpus in self.report["Details"].values() for e in gpus.values()
                if e["increase"] > self.increase]
        if not grew:
            return super().finding
        return (f"GPU memory use grew by up to {max(grew):.1f} points (more than "
                f"{self.increase:g}) on {len(grew)} GPU(s) within {self.window} samples")


class LoadBalancing(_PerGpu):
    name = "LoadBalancing"
    description = "Checks whether the GPUs of a node carry the same load."
    recommendation = ("Choose a different distributed training strategy or a different "
                      "distributed training framework.")
    bins = np.arange(0, 102, 2)

    def scan(self, metrics, events):
        self.collect(metrics)
        for node, gpus in self.values.items():
            if min((len(v) for v in gpus.values()), default=0) <= self.patience or len(gpus) < 2:
                continue
            hists = {g: np.histogram(v, bins=self.bins)[0] + 1e-9 for g, v in gpus.items()}
            distances = {}
            for a, b in itertools.combinations(sorted(hists), 2):
                d = jensen_shannon(hists[a], hists[b])
                distances.setdefault(a, {})[b] = d
                if d > self.threshold:
                    self.trigger()
            self.report["Details"][node] = {
                "workloads": {g: h.round().astype(int).tolist() for g, h in hists.items()},
                "distances": distances}

    @property
    def finding(self) -> str:
        pairs = [d for node in self.report["Details"].values()
                 for row in node["distances"].values() for d in row.values()]
        unbalanced = [d for d in pairs if d > self.threshold]
        if not unbalanced:
            return super().finding
        return (f"{len(unbalanced)} of {len(pairs)} GPU pair(s) carried different loads "
                f"(workload distance up to {max(unbalanced):.2f}, threshold {self.threshold:g})")


def jensen_shannon(p, q) -> float:
    """Distance between two histograms: sqrt((KL(p||m) + KL(q||m)) / 2), m = (p + q) / 2."""
    p, q = np.asarray(p, float) / np.sum(p), np.asarray(q, float) / np.sum(q)
    m = (p + q) / 2
    kl = lambda a, b: float(np.sum(a * np.log(a / b)))  # noqa: E731
    return float(np.sqrt(max(0.0, (kl(p, m) + kl(q, m)) / 2)))


class BatchSize(Rule):
    name = "BatchSize"
    description = "Checks whether the instance is underutilized: a bigger batch would use it."
    recommendation = ("The GPUs are underutilized. Consider running on a smaller instance type "
                      "or increasing the batch size.")

    def __init__(self, parameters=None):
        super().__init__(parameters)
        self.cpu: dict[str, list[float]] = defaultdict(list)
        self.gpu: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))

    def scan(self, metrics, events):
        for node, node_metrics in metrics.items():
            for snap in snapshots(node_metrics):
                cores = [m.value for m in snap if m.dimension == "CPUUtilization"]
                if cores:
                    self.cpu[node].append(sum(cores) / len(cores))
                for m in snap:
                    if m.dimension in ("GPUUtilization", "GPUMemoryUtilization"):
                        self.gpu[node][f"{m.name}_{m.dimension}"].append(m.value)
        self.report["Datapoints"] = sum(len(v) for v in self.cpu.values())
        w = self.window
        for node, cpu in self.cpu.items():
            if len(cpu) <= max(w, self.patience):
                continue
            cpu95 = np.percentile(cpu[-w:], 95)
            details = {"cpu": stats(cpu[-w:])}
            low_gpus = []
            for key in [k for k in self.gpu[node] if k.endswith("_GPUUtilization")]:
                gpu = key.split("_")[0]
                util = self.gpu[node][key][-w:]
                memory = self.gpu[node].get(f"{gpu}_GPUMemoryUtilization", [0.0])[-w:]
                details[gpu], details[f"{gpu}_memory"] = stats(util), stats(memory)
                if (np.percentile(util, 95) < self.gpu_threshold_p95
                        and np.percentile(memory, 95) < self.gpu_memory_threshold_p95):
                    low_gpus.append(gpu)
            self.report["Details"][node] = details
            if cpu95 < self.cpu_threshold_p95 and low_gpus:
                self.trigger(len(low_gpus))
                self.low_gpus = low_gpus

    @property
    def finding(self) -> str:
        low = getattr(self, "low_gpus", [])
        return (f"CPU (p95) under {self.cpu_threshold_p95:g} % while {len(low)} GPU(s) stayed under "
                f"{self.gpu_threshold_p95:g} % utilization and {self.gpu_memory_threshold_p95:g} % "
                f"memory (p95) over the last {self.window} samples")

    def finish(self):
        if not any(self.gpu.values()):
            self.insufficient = "no GPU was recorded (a CPU-only job)"
        elif max((len(v) for v in self.cpu.values()), default=0) <= max(self.window, self.patience):
            self.insufficient = (f"fewer samples than window={self.window} and "
                                 f"patience={self.patience}")


class OverallSystemUsage(Rule):
    """Never an issue: the usage of every resource, per node."""

    name = "OverallSystemUsage"
    description = "Summarizes the system usage per node (never raises an issue)."
    recommendation = ""
    categories = {"CPUUtilization": "CPU", "I/OWaitPercentage": "I/O",
                  "GPUUtilization": "GPU", "GPUMemoryUtilization": "GPU memory"}

    def __init__(self, parameters=None):
        super().__init__(parameters)
        self.values: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))

    def scan(self, metrics, events):
        for node, node_metrics in metrics.items():
            for snap in snapshots(node_metrics):
                sums: dict[str, list[float]] = defaultdict(list)
                for m in snap:
                    category = self.categories.get(m.dimension)
                    if m.name == "MemoryUsedPercent":
                        category = "CPU memory"
                    elif m.kind == "network":
                        category = "Network"
                    if category:
                        sums[category].append(m.value)
                for category, vs in sums.items():
                    per_unit = category in ("CPU", "I/O", "GPU", "GPU memory")
                    self.values[node][category].append(sum(vs) / len(vs) if per_unit else sum(vs))
                self.report["Datapoints"] += 1
        self.report["Details"] = {node: {c: stats(v) for c, v in cats.items()}
                                  for node, cats in self.values.items()}
