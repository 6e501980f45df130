"""The model-parallel runtime's timelines joined to a job's framework events: its spans on
the epoch clock, on their rank's host, as ModelParallel phases."""

from __future__ import annotations

import json
import time

import pytest
from shoal.profiler import data, timelines

pytest.importorskip("torch")


def test_a_ranks_timeline_joins_on_the_epoch_clock(tmp_path, monkeypatch):
    from shoal.modelparallel.torch.timeline import Timeline

    monkeypatch.setenv("SHOAL_HOST", "algo-2")
    before = time.time()
    line = Timeline(str(tmp_path / timelines.MP_DIR), rank=3)
    start = line.now()
    line.span("fwd mb0", "forward", start, start + 2000, microbatch=0)
    line.span("step", "step", start, start + 5000)
    line.instant("send", "message", peer=1)
    line.write()
    assert timelines.join_model_parallel(tmp_path) == 2
    store = data.Store(tmp_path)
    store.load()
    events = {e.phase: e for e in store.events["algo-2"]}
    assert set(events) == {"ModelParallel:forward", "ModelParallel:step"}
    forward = events["ModelParallel:forward"]
    assert forward.args == {"microbatch": 0, "rank": 3}
    assert abs(forward.duration - 0.002) < 1e-5
    assert before - 1 < forward.start < time.time() + 1  # epoch seconds, not perf_counter
    # the bubble benchmark still reads the file as before
    raw = json.loads((tmp_path / timelines.MP_DIR / "timeline-rank3.json").read_text())
    assert len(raw["traceEvents"]) == 3 and raw["otherData"]["host"] == "algo-2"


def test_a_truncated_timeline_is_skipped(tmp_path):
    folder = tmp_path / timelines.MP_DIR
    folder.mkdir(parents=True)
    (folder / "timeline-rank0.json").write_text('{"traceEvents": [')
    assert timelines.join_model_parallel(tmp_path) == 0
