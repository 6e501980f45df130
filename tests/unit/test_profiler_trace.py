"""Framework trace files: Debugger's Chrome-trace layout, read back exactly; two ranks of one
node ending at the same microsecond keep both files."""

from __future__ import annotations

import json

from shoal.profiler import data, layout
from shoal.profiler.trace import TraceWriter

T0 = 1_790_000_000.0


def test_events_round_trip_with_their_phase_and_args(tmp_path):
    trace = TraceWriter(tmp_path, "algo-2")
    trace.span("Step:ModeKeys.TRAIN", "Step", T0, 0.25, step_num=3)
    trace.span("Collective", "all_reduce", T0 + 0.1, 0.05, bytes=4096)
    trace.close()
    [path] = layout.framework_files(tmp_path)
    raw = json.loads(path.read_text())
    assert raw[0]["args"]["start_time_since_epoch_in_micros"] == int(T0 * 1e6)
    assert path.name == f"{int((T0 + 0.25) * 1e6)}_algo-2_model_timeline.json"
    events = data.read_events(path, "algo-2")
    assert [(e.phase, e.name, e.args) for e in events] == [
        ("Step:ModeKeys.TRAIN", "Step", {"step_num": 3}),
        ("Collective", "all_reduce", {"bytes": 4096})]
    assert events[0].start == T0 and abs(events[0].duration - 0.25) < 1e-6


def test_two_writers_ending_together_keep_both_files(tmp_path):
    for rank in (0, 1):
        trace = TraceWriter(tmp_path, "algo-1")
        trace.span("Collective", "allreduce", T0, 0.001, rank=rank)
        trace.close()
    files = layout.framework_files(tmp_path)
    assert len(files) == 2
    store = data.Store(tmp_path)
    store.load()
    assert sorted(e.args["rank"] for e in store.events["algo-1"]) == [0, 1]


def test_begin_end_pairs_and_a_broken_file(tmp_path):
    path = layout.framework_file(tmp_path, "algo-1", int(T0 * 1e6))
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps([
        {"name": "process_name", "ph": "M", "pid": 0, "args": {"start_time_since_epoch_in_micros": int(T0 * 1e6)}},
        {"name": "process_name", "ph": "M", "pid": 1, "args": {"name": "Forward"}},
        {"name": "fwd", "ph": "B", "pid": 1, "tid": 7, "ts": 100},
        {"name": "fwd", "ph": "E", "pid": 1, "tid": 7, "ts": 600}]))
    [event] = data.read_events(path, "algo-1")
    assert (event.phase, event.name) == ("Forward", "fwd") and abs(event.duration - 0.0005) < 1e-6  # doubles at this epoch: 0.2 us
    path.write_text('[{"name": "x", "ph": "X"')  # still being written elsewhere
    assert data.read_events(path, "algo-1") == []
