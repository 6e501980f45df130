"""The profiler report's page: the system-usage table gives every value its unit."""

from __future__ import annotations

import re

from shoal.profiler import engine, report, system_monitor

from tests.unit.test_profiler_rules import T0, record, write_steps, write_system


def write_network(root, node, samples, rate, interval=0.5):
    """Receive and transmit rates joining ``write_system``'s snapshots, ``rate`` each."""
    writer = system_monitor.Writer(root, node)
    for i in range(samples):
        ts = T0 + i * interval
        writer.write([record(node, "network", name, "Algorithm", rate, ts)
                      for name in ("ReceiveBytesPerSecond", "TransmitBytesPerSecond")])
    writer.close()


def usage_table(html: str) -> dict[str, list[str]]:
    """The first host's system-usage rows: resource -> its cells."""
    section = html[html.index(">System usage</h2>"):]
    table = section[:section.index("</table>")]
    rows = {}
    for row in re.findall(r"<tr>(.*?)</tr>", table, re.S)[1:]:
        name, *cells = re.findall(r"<td[^>]*>(.*?)</td>", row, re.S)
        rows[name] = cells
    return rows


def test_the_system_usage_table_gives_every_value_its_unit(tmp_path):
    data = tmp_path / "profiler-output"
    write_system(data, "algo-1", 20, gpus=1, cpu=37.5)
    write_network(data, "algo-1", 20, 1_284_945.05)
    rules = tmp_path / "rule-output" / "ProfilerReport" / "profiler-output"
    engine.Evaluation(data, engine.rules_for("OverallSystemUsage", {}), rules).advance(final=True)
    rows = usage_table(report.render("units-job", data, [rules]))
    assert rows["Network, received + sent"] == ["2.57 MB/s"] * 5
    assert rows["CPU utilization"] == ["37.5 %"] * 5
    assert set(rows) == {"CPU utilization", "CPU memory used", "GPU utilization",
                         "GPU memory used", "I/O wait", "Network, received + sent"}
    assert all(cell.endswith((" %", "B/s")) for cells in rows.values() for cell in cells)


def test_network_rates_read_in_decimal_units():
    assert [report._rate(v) for v in (512, 2_569_890.1, 12_500, 3.2e9)] == [
        "512 B/s", "2.57 MB/s", "12.50 kB/s", "3.20 GB/s"]


def _rules_page(tmp_path, metrics=None) -> str:
    data = tmp_path / "profiler-output"
    write_system(data, "algo-1", 20, gpus=1, cpu=37.5)
    rules = tmp_path / "rule-output" / "ProfilerReport" / "profiler-output"
    evaluation = engine.Evaluation(data, engine.rules_for("ProfilerReport", {}), rules)
    evaluation.advance(final=True)
    return report.render("lacking-job", data, [rules], evaluation.statuses(), metrics)


def test_a_rule_without_data_keeps_the_services_status_but_is_not_shown_as_a_pass(tmp_path):
    html = _rules_page(tmp_path)
    row = re.search(r'<tr data-rule="LowGPUUtilization">(.*?)</tr>', html, re.S).group(1)
    assert "NoIssuesFound" in row and "not judged" in row
    assert 'class="status NoIssuesFound"' not in row  # not the green of a clean pass
    lacking = re.findall(r'<li data-lacking="([^"]+)">', html)
    assert "LowGPUUtilization" in lacking and "OverallSystemUsage" not in lacking
    tally = re.search(r"<div class=\"tally\".*?</div>", html, re.S).group(0)
    assert f"{len(lacking)} not judged" in tally


def test_the_training_metrics_are_plotted_when_the_job_has_them(tmp_path):
    assert "Training metrics" not in _rules_page(tmp_path)
    html = _rules_page(tmp_path / "with", {"train:loss": [(T0 + i, 1.0 / (i + 1)) for i in range(30)]})
    figure = re.search(r'<figure data-plot="Training metrics[^"]*">(.*?)</figure>', html, re.S)
    assert figure and "train:loss" in figure.group(1) and "<svg" in figure.group(1)


def test_evidence_is_tables_not_json(tmp_path):
    data = tmp_path / "profiler-output"
    write_steps(data, "algo-1", [0.6 if n % 13 == 5 else 0.05 for n in range(160)])
    rules = tmp_path / "rule-output" / "ProfilerReport" / "profiler-output"
    engine.Evaluation(data, engine.rules_for("StepOutlier", {}), rules).advance(final=True)
    html = report.render("evidence-job", data, [rules])
    finding = re.search(r'<section class="finding" data-finding="StepOutlier">(.*?)</section>',
                        html, re.S).group(1)
    assert "<table class=\"evidence\">" in finding and "{" not in finding
    assert "number of outliers" in finding and "<th class=\"num\">p99</th>" in finding
