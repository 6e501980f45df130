"""Simulated hosts on a busy machine: consecutive 2x2 jobs while both cores are loaded.

Every simulated host's Open MPI daemon must keep its own session directory; when two of them
shared one, a loaded machine made jobs fail now and then with "orte_session_dir failed" or
"ORTE does not know how to route a message". mpirun is started once per job (no retry), so
any such failure fails a job here.
"""

import os
import shutil
import subprocess
import sys

import pytest
from shoal.launcher.simulate import run_job

from tests.integration.test_launcher_jobs import HOSTS, WRITE_RANK, make_job

pytestmark = [
    pytest.mark.mpi,
    pytest.mark.slow,
    pytest.mark.stress,
    pytest.mark.skipif(shutil.which("mpirun") is None, reason="Open MPI's mpirun is not installed"),
]

JOBS = 15


@pytest.fixture
def busy_cores():
    load = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
            for _ in range(os.cpu_count() or 2)]  # fmt: skip
    yield
    for p in load:
        p.kill()
        p.wait()


def test_consecutive_simulated_jobs_on_loaded_cores_all_succeed(tmp_path, busy_cores):
    lines = []
    codes = []
    for i in range(JOBS):
        root = make_job(tmp_path / f"job-{i}", WRITE_RANK)
        codes.append(run_job(str(root), HOSTS, timeout=120,
                             output=lambda host, line: lines.append(line)))  # fmt: skip
        assert len(list(root.glob("algo-*/model/rank-*.json"))) == 4
    assert codes == [0] * JOBS
    daemon_trouble = [ln for ln in lines if "orte_session_dir" in ln or "route" in ln]
    assert daemon_trouble == []
