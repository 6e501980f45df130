"""The profiler report in a real browser: Debian's Chromium, headless, opens the page from
disk with the network closed to it, lays out every plot, and keeps a screenshot
at two widths (``build/test-artifacts/profiler-report-<width>.png``)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
from shoal.profiler import engine, report

from tests.unit.test_profiler_rules import T0, write_steps, write_system
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
    metrics = {"train:loss": [(T0 + i, 2.0 / (1 + i)) for i in range(60)],
               "train:accuracy": [(T0 + i, 1 - 1 / (2 + i)) for i in range(60)]}
    path = report.write(rules / report.REPORT_FILE, "report-job", data, [rules, shoal_rules],
                        evaluation.statuses(), metrics)
    return path


def laid_out(tmp_path, page, width: int) -> dict[str, str]:
    """The page's own layout figures (its load handler's body attributes) in a window
    ``width`` CSS pixels wide."""
    done = chromium(tmp_path, f"--window-size={width},900", "--virtual-time-budget=5000",
                    "--dump-dom", page.as_uri())
    assert done.returncode == 0, done.stderr[-2000:]
    body = re.search(r"<body[^>]*>", done.stdout).group(0)
    return dict(re.findall(r'(data-[a-z-]+)="([^"]*)"', body)) | {"dom": done.stdout}


@pytest.mark.parametrize("width", [1366, 800])  # a laptop's screen; half of a wide one
def test_the_report_fits_the_window_with_margins_and_every_plot_drawn(page, tmp_path, width):
    html = page.read_text()
    # nothing is fetched: no script, stylesheet, image or font from anywhere else
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//|url\(\s*["']?(https?:)?//|@import""", html)
    layout = laid_out(tmp_path, page, width)
    # training metrics, utilization, steps, load across ranks, compute and collectives
    assert layout["data-plots"] == layout["data-plots-rendered"] == "5"
    assert layout["data-overflow"] == "none"  # no table, cell or plot wider than the window
    assert layout["data-page-width"] == f"{width}/{width}"  # no horizontal scrolling
    assert int(layout["data-margin"]) >= 16
    assert "StepOutlier" in layout["dom"] and "IssuesFound" in layout["dom"]
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    shot = ARTIFACTS / f"profiler-report-{width}.png"
    done = chromium(tmp_path, f"--window-size={width},3600", f"--screenshot={shot}", page.as_uri())
    assert done.returncode == 0 and shot.stat().st_size > 50_000, done.stderr[-2000:]


def test_the_layout_check_sees_a_table_that_does_not_fit(page, tmp_path):
    """The check above can fail: a cell that cannot wrap is reported."""
    wide = "x" * 400
    page.write_text(page.read_text().replace("overflow-wrap: anywhere;", "").replace(
        "<td>algo-1</td>", f"<td>{wide}</td>", 1))
    assert page.read_text().count(wide) == 1
    assert laid_out(tmp_path, page, 800)["data-overflow"] != "none"


def test_the_report_says_what_it_could_not_judge(page):
    html = page.read_text()
    # a CPU-heavy rule with patience 1000 on 240 samples: listed apart, with what it lacked
    assert re.search(r'<li data-lacking="CPUBottleneck"><strong>CPUBottleneck</strong>: 240 snapshots', html)
    assert "Step durations and outliers" in html and "Load across ranks" in html
