"""The profiler report in a real browser: Debian's Chromium, headless, opens the page from
disk with the network closed to it, lays out every plot, and keeps a screenshot
(``build/test-artifacts/profiler-report.png``)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
from shoal.profiler import engine, report

from tests.unit.test_profiler_rules import write_steps, write_system
from tests.unit.test_profiler_shoal_rules import write_collectives

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
ARTIFACTS = Path(__file__).resolve().parents[2] / "build" / "test-artifacts"
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="Chromium is not installed (make test "
                                                          "installs Debian's chromium package)")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--proxy-server=127.0.0.1:9", "--hide-scrollbars"]


def chromium(tmp_path, *args, timeout=120) -> subprocess.CompletedProcess:
    profile = tmp_path / f"chromium-{len(list(tmp_path.glob('chromium-*')))}"
    return subprocess.run([CHROMIUM, *FLAGS, f"--user-data-dir={profile}", *args],
                          capture_output=True, text=True, timeout=timeout)


@pytest.fixture
def page(tmp_path):
    data = tmp_path / "profiler-output"
    write_system(data, "algo-1", 240, cpu=lambda i, c: 30 + (i * 7 + c * 13) % 60, gpus=2,
                 gpu_util=lambda i, g: 60 + (i + 20 * g) % 35)
    durations = [0.6 if n % 13 == 5 else 0.05 + 0.002 * (n % 5) for n in range(160)]
    write_steps(data, "algo-1", durations)
    write_collectives(data, "algo-1", [(1 + 0.1 * i, 0.004) for i in range(300)])
    rules = tmp_path / "rule-output" / "ProfilerReport" / "profiler-output"
    evaluation = engine.Evaluation(data, engine.rules_for("ProfilerReport", {}), rules)
    evaluation.advance(final=True)
    shoal_rules = tmp_path / "rule-output" / "ShoalRules" / "profiler-output"
    engine.Evaluation(data, engine.rules_for("ShoalRules", {}), shoal_rules).advance(final=True)
    path = report.write(rules / report.REPORT_FILE, "report-job", data, [rules, shoal_rules],
                        evaluation.statuses())
    return path


def test_the_report_opens_in_chromium_with_every_plot_drawn(page, tmp_path):
    html = page.read_text()
    # nothing is fetched: no script, stylesheet, image or font from anywhere else
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//|url\(\s*["']?(https?:)?//|@import""", html)
    expected = int(re.search(r'data-plots="(\d+)"', html).group(1))
    assert expected == 4  # utilization, steps, load across ranks, compute and collectives
    done = chromium(tmp_path, "--virtual-time-budget=5000", "--dump-dom", page.as_uri())
    assert done.returncode == 0, done.stderr[-2000:]
    body = re.search(r"<body[^>]*>", done.stdout).group(0)
    assert f'data-plots-rendered="{expected}"' in body, body
    assert "StepOutlier" in done.stdout and "IssuesFound" in done.stdout
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    shot = ARTIFACTS / "profiler-report.png"
    done = chromium(tmp_path, "--window-size=1200,3200", f"--screenshot={shot}", page.as_uri())
    assert done.returncode == 0 and shot.stat().st_size > 50_000, done.stderr[-2000:]


def test_the_report_says_what_it_could_not_judge(page):
    html = page.read_text()
    assert "Insufficient data" in html  # a CPU-heavy rule with patience 1000 on 240 samples
    assert "Step durations and outliers" in html and "Load across ranks" in html
