"""``shoal plan strategy``: one JSON object or a short table; impossible inputs exit 2."""

import json

import pytest
from shoal import cli

GPT = "transformer:layers=24,hidden=2304,heads=24,seq=2048,vocab=51200"
ARGS = ["plan", "strategy", "--model", GPT, "--global-batch", "512",
        "--instance-type", "ml.p4de.24xlarge", "--instance-count", "4", "--precision", "fp16"]

FACTORY = """
import torch
from torch import nn

class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.up, self.down = nn.Linear(256, 1024), nn.Linear(1024, 256)

    def forward(self, x):
        return x + self.down(torch.relu(self.up(x)))

def build():
    return nn.Sequential(nn.Linear(64, 256), *[Block() for _ in range(8)], nn.Linear(256, 10))
"""


def run(capsys, *argv):
    code = cli.main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_json_output_has_the_contracts_fields(capsys):
    code, out, _ = run(capsys, *ARGS, "--output", "json")
    assert code == 0
    plan = json.loads(out)
    assert {"distribution", "degrees", "microbatches", "activation_checkpointing", "predicted",
            "alternatives"} <= set(plan)
    assert set(plan["degrees"]) == {"data", "pipeline", "tensor", "sharded_data"}
    assert {"step_seconds", "memory_gib_per_device", "memory_gib", "seconds"} <= set(
        plan["predicted"])
    assert all("lost_because" in alt for alt in plan["alternatives"])


def test_text_output_is_a_short_summary_and_table(capsys):
    code, out, _ = run(capsys, *ARGS)
    assert code == 0
    assert "runners-up" in out and "lost because" in out and "distribution" in out
    assert len(out.splitlines()) < 40


def test_pins_reach_the_planner(capsys):
    code, out, _ = run(capsys, *ARGS, "--pin", "tensor=2", "--pin", "pipeline=2",
                       "--output", "json")
    assert code == 0
    degrees = json.loads(out)["degrees"]
    assert degrees["tensor"] == 2 and degrees["pipeline"] == 2


@pytest.mark.parametrize("extra,message", [
    (["--pin", "tensors=2"], "KEY one of data, pipeline"),
    (["--pin", "tensor=two"], "tensor takes an int"),
    (["--pin", "checkpointing=maybe"], "checkpointing takes true or false"),
])
def test_bad_pins_are_usage_errors(capsys, extra, message):
    code, _, err = run(capsys, *ARGS, *extra)
    assert code == 2 and message in err


@pytest.mark.parametrize("changes,message", [
    ({"--model": GPT.replace("heads=24", "heads=25")}, "must be divisible by 'heads'"),
    ({"--instance-type": "ml.p4dd.24xlarge"}, "did you mean 'ml.p4d.24xlarge'"),
    ({"--model": "gpt:layers=2"}, "must start with 'transformer:'"),
    ({"--model": GPT + ",layer=3"}, "unknown transformer key 'layer' (did you mean 'layers'?)"),
])
def test_impossible_inputs_exit_2_with_the_fix_and_no_traceback(capsys, changes, message):
    argv = list(ARGS)
    for flag, value in changes.items():
        argv[argv.index(flag) + 1] = value
    code, out, err = run(capsys, *argv)
    assert code == 2
    assert message in err and "Traceback" not in err + out


def test_a_factory_is_traced_with_the_sample_shape(capsys, tmp_path):
    path = tmp_path / "my_model.py"
    path.write_text(FACTORY)
    code, out, _ = run(capsys, "plan", "strategy", "--model", f"{path}:build",
                       "--sample-input-shape", "32,64", "--global-batch", "4096",
                       "--instance-type", "ml.g5.12xlarge", "--instance-count", "1",
                       "--output", "json")
    assert code == 0, out
    plan = json.loads(out)
    # a 4.2M-parameter model with enough work per step: plain data parallelism on 4 GPUs
    assert plan["degrees"] == {"data": 4, "pipeline": 1, "tensor": 1, "sharded_data": 1}
    assert plan["predicted"]["memory_gib"]["parameters"] * 1024**3 == pytest.approx(
        4 * 4_223_754)  # every weight in fp32, from the traced model
    code, _, err = run(capsys, "plan", "strategy", "--model", f"{path}:build",
                       "--global-batch", "64", "--instance-type", "ml.g5.12xlarge")
    assert code == 2 and "needs --sample-input-shape" in err


def test_a_calibration_file_replaces_the_table(capsys, tmp_path):
    calib = tmp_path / "calibration.json"
    calib.write_text(json.dumps({"calibration": {"flops": 1e12}}))
    _, fast, _ = run(capsys, *ARGS, "--output", "json")
    code, slow, _ = run(capsys, *ARGS, "--calibration", str(calib), "--output", "json")
    assert code == 0
    assert (json.loads(slow)["predicted"]["step_seconds"]
            > 10 * json.loads(fast)["predicted"]["step_seconds"])
