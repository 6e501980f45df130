"""Framework events from an unchanged PyTorch script: the bootstrap on PYTHONPATH hooks torch
once it is imported; steps are numbered from 0; ``steps`` mode records steps and
collectives only; a sitecustomize the bootstrap shadows still runs."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from shoal.profiler import data

pytest.importorskip("torch")
BOOTSTRAP = Path(__file__).resolve().parents[2] / "runtime" / "profiler" / "bootstrap"
SCRIPT = """
import time, torch
model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(32, 8), torch.randn(32, 1)), batch_size=8)
for n, (x, y) in enumerate(data):
    if n == 2:
        time.sleep(1.0)  # far above any step a loaded machine slows
    loss = torch.nn.functional.mse_loss(model(x), y)
    opt.zero_grad(); loss.backward(); opt.step()
print("trained")
"""


def run(tmp_path, events: str, extra_path: str | None = None) -> data.Store:
    (tmp_path / "train.py").write_text(SCRIPT)
    out = tmp_path / "prof"
    path = os.pathsep.join(p for p in (str(BOOTSTRAP), extra_path) if p)
    env = {**os.environ, "SHOAL_PROFILER_DIR": str(out), "SHOAL_PROFILER_EVENTS": events,
           "SHOAL_HOST": "algo-3", "PYTHONPATH": path}
    done = subprocess.run([sys.executable, str(tmp_path / "train.py")], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "trained" in done.stdout, done.stderr
    store = data.Store(out)
    store.load()
    return store, done


def test_every_span_from_an_unchanged_script(tmp_path):
    store, _ = run(tmp_path, "all")
    events = store.events["algo-3"]
    phases = Counter(e.phase for e in events)
    assert phases["Step:ModeKeys.TRAIN"] == 4 and phases["Forward"] == 4
    assert phases["Backward"] == 4 and phases["DataLoaderIter"] >= 4
    assert phases["DataLoaderIterInitialize"] == 1
    steps = sorted((e.args["step_num"], e.duration) for e in events if e.phase.startswith("Step"))
    assert [n for n, _ in steps] == [0, 1, 2, 3]
    assert max(steps, key=lambda s: s[1])[0] == 2  # the stalled one


def test_steps_mode_records_steps_only_and_numbers_them_still(tmp_path):
    store, _ = run(tmp_path, "steps")
    phases = Counter(e.phase for e in store.events["algo-3"])
    assert set(phases) == {"Step:ModeKeys.TRAIN"}
    # the first step's start is unknown without forwards: steps 1..3, still numbered right
    assert sorted(e.args["step_num"] for e in store.events["algo-3"]) == [1, 2, 3]


def test_a_shadowed_sitecustomize_still_runs(tmp_path):
    other = tmp_path / "other"
    other.mkdir()
    (other / "sitecustomize.py").write_text("import sys; sys.stderr.write('chained\\\\n')\n")
    _, done = run(tmp_path, "steps", extra_path=str(other))
    assert "chained" in done.stderr


KERAS = """
import importlib.util
import os
os.environ["KERAS_BACKEND"] = "tensorflow"
import numpy as np, keras
model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
model.compile(optimizer="sgd", loss="mse")
x, y = np.random.rand(40, 4), np.random.rand(40, 1)
model.fit(x, y, batch_size=8, epochs=3, validation_data=(x[:16], y[:16]), verbose=0)
print("trained")
"""


@pytest.mark.tensorflow
@pytest.mark.skipif(importlib.util.find_spec("keras") is None, reason="Keras is not installed")
def test_keras_fit_batches_are_steps(tmp_path):
    (tmp_path / "train.py").write_text(KERAS)
    out = tmp_path / "prof"
    env = {**os.environ, "SHOAL_PROFILER_DIR": str(out), "SHOAL_PROFILER_EVENTS": "steps",
           "SHOAL_HOST": "algo-1", "PYTHONPATH": str(BOOTSTRAP), "TF_CPP_MIN_LOG_LEVEL": "3"}
    done = subprocess.run([sys.executable, str(tmp_path / "train.py")], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "trained" in done.stdout, done.stderr[-3000:]
    store = data.Store(out)
    store.load()
    steps = Counter(e.phase for e in store.events["algo-1"])
    assert steps == {"Step:ModeKeys.TRAIN": 15, "Step:ModeKeys.EVAL": 6}  # 3 x 5 and 3 x 2
    train = sorted(e.args["step_num"] for e in store.events["algo-1"] if e.phase.endswith("TRAIN"))
    assert train == list(range(15))
