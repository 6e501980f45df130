"""``benchmarks/tensor_parallel.py --quick`` under the real mpirun: every side (torch's
tensor parallelism on gloo and on Shoal's backend, Shoal's ``smp.nn`` prescaled and default)
runs both cases, the table has its rows, and every side's losses matched the one-process
model's. No timing is asserted.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_collectives import MPI_MARKS  # noqa: E402

pytestmark = [*MPI_MARKS, pytest.mark.torch, pytest.mark.slow]
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "benchmarks", "tensor_parallel.py")


def test_quick_run_prints_every_row_and_equal_results():
    proc = subprocess.run([sys.executable, SCRIPT, "--quick"], capture_output=True, text=True,
                          timeout=900, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    out = proc.stdout
    number = r"\s*[0-9]+\.[0-9]+\s*"
    for case in ("mlp", "block"):
        for layout in ("prescaled: one batch of N per group", "default: N per rank, 2N per group"):
            row = re.escape(f"| {case}") + r"\s*\|\s*" + re.escape(layout) + \
                rf"\s*\|{number}\|{number}\|{number}\|{number}\|{number}\|"
            assert re.search(row, out), f"no row for {case} / {layout}:\n{out}"
        for side in ("dtensor-gloo", "dtensor-shoal", "shoal-prescaled", "shoal-default"):
            assert f"loss check {case} {side}: " in out, out
    assert "results equal: ok" in out, out
    assert "FAILED" not in out, out
