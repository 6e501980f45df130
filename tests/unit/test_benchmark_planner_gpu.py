"""benchmarks/planner_gpu.py: a saved GPU run priced again, and the script end to end on
whatever device this machine has (tiny models)."""

import importlib.util
import json
import pathlib
import sys

import pytest

BENCHMARKS = pathlib.Path(__file__).parents[2] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))  # the benchmark imports the grid's rank correlation
spec = importlib.util.spec_from_file_location("planner_gpu", BENCHMARKS / "planner_gpu.py")
gpu = importlib.util.module_from_spec(spec)
spec.loader.exec_module(gpu)

SAVED = {"device": "cuda:0", "precision": "bf16",
         "calibration": {"flops": 7e14, "layer_overhead": 3e-5, "hbm": 1.2e12},
         "rows": [{"model": "L2-h256-a4-s128-v1000", "batch": b, "microbatches": m,
                   "checkpointing": c, "measured": {"seconds": s, "peak_bytes": p},
                   "predicted": {}, "predicted_table_seconds": 0.0}
                  for b, m, c, s, p in [(4, 1, False, 0.010, 60e6), (8, 1, False, 0.015, 110e6),
                                        (8, 2, True, 0.030, 70e6)]]}


def test_a_saved_run_is_priced_again_by_this_checkouts_model(capsys):
    result = gpu.regrade(json.loads(json.dumps(SAVED)))
    for row in result["rows"]:
        dims = (2, 256, 4, 128, 1000)
        want = gpu.predict(dims, row["batch"], row["microbatches"], row["checkpointing"],
                           "bf16", gpu_calibration())
        assert row["predicted"]["seconds"] == pytest.approx(want["seconds"])
        assert row["predicted"]["memory_bytes"] == pytest.approx(want["memory_bytes"])
    summary = result["summary"]
    errors = sorted(row["predicted"]["memory_bytes"] / row["measured"]["peak_bytes"] - 1
                    for row in result["rows"])
    assert summary["memory_error_median"] == pytest.approx(errors[1])
    assert summary["memory_error_worst"] == pytest.approx(max(errors, key=abs))
    ratios = sorted(row["predicted"]["seconds"] / row["measured"]["seconds"]
                    for row in result["rows"])
    assert summary["time_ratio_median"] == pytest.approx(ratios[1])
    assert "L2-h256-a4-s128-v1000 batch 8 x2 ckpt" in capsys.readouterr().out


def gpu_calibration():
    from shoal.planning.strategy import Calibration

    return Calibration(**SAVED["calibration"])


def test_quick_runs_end_to_end_on_this_machine(tmp_path):
    pytest.importorskip("torch")
    out = tmp_path / "run.json"
    assert gpu.main(["--quick", "--precision", "fp32", "--steps", "1",
                     "--json", str(out)]) == 0
    saved = json.loads(out.read_text())
    assert len(saved["rows"]) == 2 * 3
    assert all(row["measured"]["seconds"] > 0 for row in saved["rows"])
    assert set(saved["calibration"]) == {"flops", "layer_overhead", "hbm"}
