"""The system monitor's records (Debugger's JSON lines) and files (one per node and minute)."""

from __future__ import annotations

import json
import threading
import time

import psutil
from shoal.profiler import data, layout, system_monitor


class NoGpus:
    def sample(self):
        return [("gpu0", "GPUUtilization", 42.0), ("gpu0", "GPUMemoryUtilization", 7.5)]


def test_a_sample_has_every_metric_debugger_records():
    sampler = system_monitor.Sampler("algo-2", gpus=NoGpus())
    records = sampler.sample()
    keys = {(r["Type"], r["Name"], r["Dimension"]) for r in records}
    cores = psutil.cpu_count()
    assert {("cpu", f"cpu{i}", "CPUUtilization") for i in range(cores)} <= keys
    assert {("cpu", f"cpu{i}", "I/OWaitPercentage") for i in range(cores)} <= keys
    assert {("memory", "MemoryUsedPercent", ""), ("i/o", "IOPS", ""),
            ("i/o", "ReadThroughputInBytesPerSecond", ""),
            ("i/o", "WriteThroughputInBytesPerSecond", ""),
            ("network", "ReceiveBytesPerSecond", "Algorithm"),
            ("network", "TransmitBytesPerSecond", "Algorithm"),
            ("gpu", "gpu0", "GPUUtilization"), ("gpu", "gpu0", "GPUMemoryUtilization")} <= keys
    assert {r["NodeId"] for r in records} == {"algo-2"}
    assert len({r["Timestamp"] for r in records}) == 1  # one snapshot
    for r in records:
        assert set(r) == {"Type", "Name", "Dimension", "Value", "NodeId", "Timestamp"}
        assert 0 <= r["Value"] <= 100 or r["Type"] in ("i/o", "network")


def test_files_rotate_per_minute_and_read_back(tmp_path):
    writer = system_monitor.Writer(tmp_path, "algo-1")
    t0 = 1_790_000_000 // 60 * 60 + 50.0  # ten seconds before a minute ends
    for i in range(4):
        writer.write([{"Type": "memory", "Name": "MemoryUsedPercent", "Dimension": "",
                       "Value": float(i), "NodeId": "algo-1", "Timestamp": t0 + 5 * i}])
    writer.close()
    files = layout.system_files(tmp_path)
    assert [f.name for f in files] == [f"{int(t0) // 60 * 60}.algo-1.json",
                                       f"{int(t0) // 60 * 60 + 60}.algo-1.json"]
    assert files[0].parent.name == time.strftime("%Y%m%d%H", time.gmtime(t0))
    values = [m.value for f in files for m in data.read_metrics(f)]
    assert values == [0.0, 1.0, 2.0, 3.0]


def test_a_half_written_line_is_skipped(tmp_path):
    path = layout.system_file(tmp_path, "algo-1", 1_790_000_000)
    path.parent.mkdir(parents=True)
    good = {"Type": "cpu", "Name": "cpu0", "Dimension": "CPUUtilization", "Value": 5,
            "NodeId": "algo-1", "Timestamp": 1_790_000_000.5}
    path.write_text(json.dumps(good) + "\n" + json.dumps(good)[:30])
    assert [m.value for m in data.read_metrics(path)] == [5.0]


def test_run_samples_at_the_interval_until_stopped(tmp_path):
    stop = threading.Event()
    thread = threading.Thread(target=system_monitor.run, args=(tmp_path, "algo-1", 100, stop))

    def stamps():
        return sorted({m.ts for f in layout.system_files(tmp_path) for m in data.read_metrics(f)})

    start = time.monotonic()
    thread.start()
    while len(stamps()) < 5 and time.monotonic() - start < 30:
        time.sleep(0.05)
    stop.set()
    thread.join(5)
    elapsed = time.monotonic() - start
    assert not thread.is_alive()
    seen = stamps()
    assert len(seen) >= 5
    # on the interval's grid: never more samples than intervals elapsed (no catch-up burst)
    assert len(seen) <= elapsed / 0.1 + 1
    assert all(b > a for a, b in zip(seen, seen[1:]))
