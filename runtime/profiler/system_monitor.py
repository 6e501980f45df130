"""The system monitor: what SageMaker's platform agent records beside every training
instance, at ``ProfilingIntervalInMilliseconds``, in Debugger's JSON-lines format:

    {"Type": "cpu", "Name": "cpu0", "Dimension": "CPUUtilization", "Value": 4.76,
     "NodeId": "algo-1", "Timestamp": 1591160699.457}

CPU per core (utilisation and I/O wait), memory used, disk IOPS and throughput, network
throughput, and per GPU (NVML through nvidia-ml-py, where GPUs and the library exist)
utilisation and memory. One file per node and minute (``layout.system_file``).

    python -m shoal.profiler.system_monitor --out DIR --node algo-1 --interval-ms 500

runs until SIGTERM or SIGINT. Simulated hosts on one machine each see the whole machine.
"""

from __future__ import annotations

import argparse
import json
import signal
import threading
import time
from pathlib import Path

import psutil
from shoal.profiler import layout


class Gpus:
    """NVML's view of the GPUs, or none when NVML or its library is absent."""

    def __init__(self):
        self.handles = []
        try:
            import pynvml

            pynvml.nvmlInit()
            self.nvml = pynvml
            self.handles = [pynvml.nvmlDeviceGetHandleByIndex(i)
                            for i in range(pynvml.nvmlDeviceGetCount())]
        except Exception:  # no library, no driver, no device: a CPU host
            self.handles = []

    def sample(self) -> list[tuple[str, str, float]]:
        out = []
        for i, handle in enumerate(self.handles):
            util = self.nvml.nvmlDeviceGetUtilizationRates(handle)
            memory = self.nvml.nvmlDeviceGetMemoryInfo(handle)
            out.append((f"gpu{i}", "GPUUtilization", float(util.gpu)))
            out.append((f"gpu{i}", "GPUMemoryUtilization", 100.0 * memory.used / max(memory.total, 1)))
        return out


class Sampler:
    """Turns the counters' differences since the previous sample into Debugger's records."""

    def __init__(self, node: str, gpus: Gpus | None = None):
        self.node = node
        self.gpus = gpus if gpus is not None else Gpus()
        psutil.cpu_times_percent(percpu=True)  # starts the interval
        self.last = (time.time(), psutil.disk_io_counters(), psutil.net_io_counters())

    def record(self, kind: str, name: str, dimension: str, value: float, ts: float) -> dict:
        return {"Type": kind, "Name": name, "Dimension": dimension, "Value": round(value, 4),
                "NodeId": self.node, "Timestamp": ts}

    def sample(self) -> list[dict]:
        now = time.time()
        records = []
        for i, core in enumerate(psutil.cpu_times_percent(percpu=True)):
            busy = max(0.0, 100.0 - core.idle - getattr(core, "iowait", 0.0))
            records.append(self.record("cpu", f"cpu{i}", "CPUUtilization", busy, now))
            records.append(self.record("cpu", f"cpu{i}", "I/OWaitPercentage",
                                       getattr(core, "iowait", 0.0), now))
        records.append(self.record("memory", "MemoryUsedPercent", "",
                                   psutil.virtual_memory().percent, now))
        then, disk0, net0 = self.last
        disk, net = psutil.disk_io_counters(), psutil.net_io_counters()
        dt = max(now - then, 1e-6)
        if disk is not None and disk0 is not None:
            ops = (disk.read_count - disk0.read_count) + (disk.write_count - disk0.write_count)
            records.append(self.record("i/o", "IOPS", "", ops / dt, now))
            records.append(self.record("i/o", "ReadThroughputInBytesPerSecond", "",
                                       (disk.read_bytes - disk0.read_bytes) / dt, now))
            records.append(self.record("i/o", "WriteThroughputInBytesPerSecond", "",
                                       (disk.write_bytes - disk0.write_bytes) / dt, now))
        if net is not None and net0 is not None:
            records.append(self.record("network", "ReceiveBytesPerSecond", "Algorithm",
                                       (net.bytes_recv - net0.bytes_recv) / dt, now))
            records.append(self.record("network", "TransmitBytesPerSecond", "Algorithm",
                                       (net.bytes_sent - net0.bytes_sent) / dt, now))
        for name, dimension, value in self.gpus.sample():
            records.append(self.record("gpu", name, dimension, value, now))
        self.last = (now, disk, net)
        return records


class Writer:
    """Appends records to the current minute's file, a whole line per write."""

    def __init__(self, root: Path, node: str):
        self.root, self.node = Path(root), node
        self.path: Path | None = None
        self.file = None

    def write(self, records: list[dict]) -> None:
        if not records:
            return
        path = layout.system_file(self.root, self.node, records[0]["Timestamp"])
        if path != self.path:
            self.close()
            path.parent.mkdir(parents=True, exist_ok=True)
            self.path, self.file = path, open(path, "a", encoding="utf-8")
        self.file.write("".join(json.dumps(r) + "\n" for r in records))
        self.file.flush()

    def close(self) -> None:
        if self.file is not None:
            self.file.close()
            self.file = None


def run(root: Path, node: str, interval_ms: int, stop: threading.Event) -> None:
    """Sample every ``interval_ms`` until ``stop`` is set (on the interval's grid)."""
    sampler, writer = Sampler(node), Writer(root, node)
    period = interval_ms / 1000.0
    deadline = time.monotonic() + period
    try:
        while not stop.wait(max(0.0, deadline - time.monotonic())):
            writer.write(sampler.sample())
            deadline += period
            if deadline < time.monotonic():  # fell behind (a stalled machine): skip, not burst
                deadline = time.monotonic() + period
    finally:
        writer.close()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="the profiler's output directory")
    parser.add_argument("--node", required=True, help="this host's name (algo-N)")
    parser.add_argument("--interval-ms", type=int, default=500)
    args = parser.parse_args(argv)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    run(Path(args.out), args.node, args.interval_ms, stop)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
