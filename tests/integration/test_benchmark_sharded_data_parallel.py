"""``benchmarks/sharded_data_parallel.py --quick`` under the real mpirun: every side (Shoal's
sharded data parallelism at degree 4, torch's FSDP2 ``fully_shard`` on gloo and on Shoal's
backend) trains the same transformer in one 4-rank job, the table has its row, and every
side's losses matched the one-process model's. No timing is asserted.
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
SCRIPT = os.path.join(ROOT, "benchmarks", "sharded_data_parallel.py")


def test_quick_run_prints_the_row_and_equal_results():
    proc = subprocess.run([sys.executable, SCRIPT, "--quick"], capture_output=True, text=True,
                          timeout=900, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    out = proc.stdout
    number = r"\s*[0-9]+\.[0-9]+\s*"
    row = re.escape("| GPT 2 x 64, seq 16, 4 x 2 ") + rf"\|{number}" * 6 + r"\|"
    assert re.search(row, out), f"no table row:\n{out}"
    for side in ("sdp", "fsdp2-gloo", "fsdp2-shoal"):
        assert re.search(rf"loss check {side}: largest relative difference ", out), out
    assert re.search(r"CPU time per step and rank .*: SDP [0-9.]+ ms, FSDP2-gloo [0-9.]+ ms, "
                     r"FSDP2-shoal [0-9.]+ ms", out), out
    assert "results equal: ok" in out, out
    assert "FAILED" not in out, out
    assert re.search(r"goal: SDP 4 >= 1\.5x FSDP2-gloo: [0-9.]+x, (met|missed)", out), out
