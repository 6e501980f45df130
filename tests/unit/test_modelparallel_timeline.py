"""Timelines: Chrome-trace events per rank and the idle fraction of each step."""

import json

from shoal.modelparallel.torch.timeline import Timeline, idle_fraction


def test_spans_and_instants_are_written_as_trace_events(tmp_path):
    timeline = Timeline(str(tmp_path), rank=3)
    timeline.span("forward mb0", "task", 10.0, 30.0, task="mb0")
    timeline.instant("call", "transfer", peer=1, bytes=64)
    timeline.write()
    events = json.loads((tmp_path / "timeline-rank3.json").read_text())["traceEvents"]
    assert events[0] == {"name": "forward mb0", "cat": "task", "ph": "X", "ts": 10.0,
                         "dur": 20.0, "pid": 3, "tid": 0, "args": {"task": "mb0"}}
    assert events[1]["ph"] == "i" and events[1]["args"] == {"peer": 1, "bytes": 64}


def test_idle_fraction_is_the_share_of_a_step_without_a_task():
    events = [{"cat": "step", "ts": 0.0, "dur": 100.0},
              {"cat": "task", "ts": 0.0, "dur": 25.0},
              {"cat": "task", "ts": 50.0, "dur": 25.0},
              {"cat": "task", "ts": 90.0, "dur": 30.0},  # runs past the step's end
              {"cat": "step", "ts": 200.0, "dur": 10.0}]
    assert idle_fraction(events) == [0.4, 1.0]
