"""benchmarks/serve_predict.py's arithmetic: percentiles and the client threads."""

from __future__ import annotations

import importlib.util
import threading
from pathlib import Path

import pytest

PATH = Path(__file__).resolve().parents[2] / "benchmarks" / "serve_predict.py"
spec = importlib.util.spec_from_file_location("serve_predict", PATH)
bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)


def test_percentiles_are_in_milliseconds():
    samples = [i / 1000 for i in range(1, 101)]  # 1..100 ms
    p50, p99 = bench.percentiles(samples)
    assert p50 == pytest.approx(50.5) and p99 == pytest.approx(100.0)


def test_every_client_makes_its_share_of_the_calls_at_once():
    seen, lock, inside, most = [], threading.Lock(), [0], [0]

    def call():
        with lock:
            inside[0] += 1
            most[0] = max(most[0], inside[0])
        threading.Event().wait(0.002)
        with lock:
            inside[0] -= 1
            seen.append(1)

    p50, p99, rate = bench.run_clients(call, 4, 40)
    assert len(seen) == 40 and most[0] > 1  # concurrent
    assert 2 <= p50 <= p99 and rate > 0
