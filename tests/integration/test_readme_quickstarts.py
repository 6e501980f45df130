"""The README's quick-starts run exactly as printed, in bash, on a machine that has never
seen AWS: a fresh HOME, no AWS variables, the project's virtualenv on PATH, and a copy of
the repository's examples (the block writes its job's outputs beside them)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

pytestmark = [pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
SERVE_SECTION = "## Boto3 and the AWS CLI (`shoal serve`)"
DEPLOY_SECTION = "## Deploying: `deploy()`, `predict()` and the model server"


def shell_block(section: str, language: str = "sh") -> str:
    """The first ```<language> block under the README's heading ``section``."""
    text = (REPO / "README.md").read_text()
    assert section in text, f"README.md has no section {section!r}"
    after = text.split(section, 1)[1].split("\n## ", 1)[0]
    found = re.search(rf"^```{language}\n(.*?)^```", after, re.S | re.M)
    assert found, f"no {language} block under {section!r}"
    return found.group(1)


def fresh_machine(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """A checkout's examples and the environment of a user who has never configured AWS."""
    checkout = tmp_path / "checkout"
    shutil.copytree(REPO / "examples", checkout / "examples",
                    ignore=shutil.ignore_patterns("__pycache__", "out"))
    home = tmp_path / "home"
    home.mkdir()
    env = {"HOME": str(home), "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    env.update({k: os.environ[k] for k in ("LANG", "LC_ALL", "TMPDIR") if k in os.environ})
    assert shutil.which("aws", path=env["PATH"]), "the AWS CLI: pip install -e '.[test]'"
    return checkout, env


def processes_of(home: Path) -> list[psutil.Process]:
    """What the block left running: processes with its HOME."""
    found = []
    for process in psutil.process_iter():
        try:
            if process.environ().get("HOME") == str(home):
                found.append(process)
        except (psutil.AccessDenied, psutil.NoSuchProcess, psutil.ZombieProcess):
            pass
    return found


def test_the_shoal_serve_quick_start_runs_as_printed(tmp_path):
    checkout, env = fresh_machine(tmp_path)
    output = tmp_path / "output.txt"
    try:
        with open(output, "w") as out:  # a file, not a pipe: a server left behind keeps a pipe open
            done = subprocess.run(["bash", "-e", "-c", shell_block(SERVE_SECTION)],
                                  cwd=checkout, env=env, stdout=out, stderr=subprocess.STDOUT,
                                  timeout=300)
        printed = output.read_text()
        assert done.returncode == 0, printed
        for epoch in range(1, 9):  # the training script's lines, read back from its log stream
            assert re.search(rf"^algo-1 epoch {epoch}: loss \d+\.\d+$", printed, re.M), printed
        assert re.search(r"^saved the model: y = 2\.99x \+ 1\.00$", printed, re.M), printed
        _, alive = psutil.wait_procs(processes_of(Path(env["HOME"])), timeout=30)
        assert alive == [], "the block's kill left the server running"
    finally:
        for process in processes_of(Path(env["HOME"])):
            process.kill()


@pytest.mark.torch
def test_the_deploy_quick_start_trains_serves_predicts_and_deletes(tmp_path):
    pytest.importorskip("torch", reason="the example trains and serves a PyTorch model")
    checkout, env = fresh_machine(tmp_path)
    env["SHOAL_LOCAL_ROOT"] = str(tmp_path / "jobs")
    script = tmp_path / "quickstart.py"
    script.write_text(shell_block(DEPLOY_SECTION, "python"))
    done = subprocess.run([sys.executable, str(script)], cwd=checkout / "examples" / "deploy",
                          env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    printed = done.stdout.strip().splitlines()[-1]
    assert re.fullmatch(r"\[\[1\.5\d*\]\]|\[\[1\.4\d*\]\]", printed), printed
    assert not list((tmp_path / "jobs" / ".endpoints").glob("*/endpoint.json"))  # deleted
    assert not (tmp_path / "jobs" / ".models").exists() or not list(
        (tmp_path / "jobs" / ".models").glob("*.json"))


SLURM_SECTION = '## Running on Slurm (`backend="slurm"`)'


@pytest.mark.slurm
@pytest.mark.skipif(os.geteuid() != 0, reason="the local Slurm cluster needs root")
@pytest.mark.skipif(shutil.which("slurmd") is None,
                    reason="Debian's Slurm is not installed (make test installs it)")
def test_the_slurm_quick_start_runs_a_two_node_job_as_printed(tmp_path):
    from shoal.slurm import devcluster

    was_up = devcluster.healthy(devcluster.plan(2))
    shared = Path("/tmp/shoal-slurm")
    existed = shared.exists()
    try:
        done = subprocess.run(["bash", "-e", "-c", shell_block(SLURM_SECTION)], cwd=REPO,
                              capture_output=True, text=True, timeout=600)
        printed = done.stdout + done.stderr
        assert done.returncode == 0, printed[-4000:]
        assert "[slurm] Training job completed" in printed
        assert re.search(r"^slurm://shoal-pytorch-training-\S+\s+Completed\s", printed, re.M)
        assert "hosts on the Slurm allocation: algo-1 node1" in printed
    finally:
        if not was_up:
            devcluster.down(say=lambda *_: None)
        if not existed:
            shutil.rmtree(shared, ignore_errors=True)
