"""The calibration job's estimator: the probe script it runs, and what it is told."""

import ast

import pytest
from shoal.errors import ValidationError
from shoal.planning import calibrate

ROLE = "arn:aws:iam::111122223333:role/ShoalLocal"


def test_the_probe_measures_in_the_precision_being_planned(tmp_path):
    estimator = calibrate.probe_estimator("local", 2, 2, role=ROLE, precision="bf16",
                                          source_dir=str(tmp_path))
    script = (tmp_path / "calibrate.py").read_text()
    call = next(node for node in ast.walk(ast.parse(script)) if isinstance(node, ast.Call)
                and getattr(node.func, "id", None) == "main")
    args = call.args[0].elts
    assert [a.value for a in args if isinstance(a, ast.Constant)][-2:] == ["--precision", "bf16"]
    assert estimator.instance_count == 2
    assert estimator.distribution == {"mpi": {"enabled": True, "processes_per_host": 2}}


def test_an_unknown_precision_is_refused_before_any_file_is_written(tmp_path):
    with pytest.raises(ValidationError, match="'precision' must be one of fp32, fp16, bf16"):
        calibrate.probe_estimator("local", 1, 1, role=ROLE, precision="fp8'); import os; ('",
                                  source_dir=str(tmp_path))
    assert not list(tmp_path.iterdir())
