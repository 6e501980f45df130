"""The profiler rules' table as the rule engine reads it: request strings back to values,
over the defaults, checked."""

import pytest
from shoal.profiler import rule_table


@pytest.mark.parametrize("text, value", [
    ("50", 50), ("0.5", 0.5), ("None", None), ("True", True), ("TRAIN", "TRAIN"),
    ("__import__('os').system('x')", "__import__('os').system('x')"), (" 7 ", 7), (3, 3),
])
def test_parse_value_reads_literals_only(text, value):
    assert rule_table.parse_value(text) == value


def test_resolve_applies_request_strings_over_defaults():
    values = rule_table.resolve("CPUBottleneck", {"rule_to_invoke": "CPUBottleneck",
                                                  "threshold": "20", "patience": "5"})
    assert values == {"threshold": 20, "gpu_threshold": 10, "cpu_threshold": 90, "patience": 5,
                      "scan_interval_us": 60_000_000}
    assert rule_table.resolve("StepOutlier", {"mode": "None"})["mode"] is None
    assert rule_table.resolve("OverallFrameworkMetrics", {}) == {"scan_interval_us": 60_000_000}


@pytest.mark.parametrize("rule, params, message", [
    ("CPUBottleneck", {"threshold": "150"}, r"CPUBottleneck: 'threshold' must be a percentile .*'150'"),
    ("StepOutlier", {"stddev": "0"}, r"StepOutlier: 'stddev' must be > 0"),
    ("LoadBalancing", {"threshold": "half"}, r"'threshold' must be a number \(got 'half'\)"),
])
def test_resolve_refuses_out_of_range_values(rule, params, message):
    with pytest.raises(ValueError, match=message):
        rule_table.resolve(rule, params)


def test_report_keys_any_case():
    assert rule_table.report_key("cpubottleneck_THRESHOLD") == ("CPUBottleneck", "threshold")
    assert rule_table.report_key("BatchSize_gpu_memory_threshold_p95") == (
        "BatchSize", "gpu_memory_threshold_p95")
