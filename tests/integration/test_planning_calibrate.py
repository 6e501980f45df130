"""``shoal plan strategy --calibrate`` on this machine: a local job of 2 hosts x 2 processes."""

import json

import pytest
from shoal import cli
from shoal.planning.models import parse_description

pytestmark = [pytest.mark.mpi, pytest.mark.runtime, pytest.mark.torch, pytest.mark.slow]

MODEL = "transformer:layers=4,hidden=256,heads=4,seq=128,vocab=8192"


def test_calibrate_measures_this_machine_and_plans_with_it(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "calibration.json"
    code = cli.main(["plan", "strategy", "--model", MODEL, "--global-batch", "16",
                     "--instance-type", "local", "--instance-count", "2",
                     "--processes-per-host", "2", "--calibrate", "--calibration-out", str(out),
                     "--output", "json"])
    captured = capsys.readouterr()
    assert code == 0, captured.err[-3000:]
    measured = json.loads(out.read_text())["calibration"]
    # every figure the probe measures, with two simulated hosts of two ranks
    assert set(measured) == {"flops", "layer_overhead", "hbm", "alpha_intra", "intra_bw",
                             "overlap", "alpha_net", "net_bw", "contention"}
    assert measured["flops"] > 1e8 and measured["intra_bw"] > 1e6 and measured["net_bw"] > 1e6
    # four ranks on this machine's cores: alone, a rank computes up to ranks/cores faster
    assert 1.0 <= measured["contention"] <= 4 * 1.25
    assert 0.0 <= measured["overlap"] <= 1.0
    plan = json.loads(captured.out)
    degrees = plan["degrees"]
    assert degrees["data"] * degrees["tensor"] * degrees["pipeline"] == 4
    # the plan's compute is the model's FLOPs at the measured rate, and CPU ranks dispatch
    # each layer's operations (counted in tiny module calls) in line with them
    code = cli.main(["plan", "strategy", "--model", MODEL, "--global-batch", "16",
                     "--instance-type", "local", "--instance-count", "2",
                     "--processes-per-host", "2", "--calibration", str(out), "--output", "json",
                     "--pin", "data=4", "--pin", "microbatches=1"])
    again = json.loads(capsys.readouterr().out)
    assert code == 0
    profile = parse_description(MODEL).profile()
    per_rank = 16 // 4
    expected = (3 * profile.flops * per_rank / measured["flops"]
                + 3 * sum(layer.calls for layer in profile.layers) * measured["layer_overhead"])
    assert again["predicted"]["seconds"]["compute"] == pytest.approx(expected, rel=1e-9)
