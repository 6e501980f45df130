"""The local job's record: transitions and writes that readers and other writers can trust."""

from __future__ import annotations

import json
import threading

from shoal.local import state


def _request(name="job-a"):
    return {"TrainingJobName": name, "ResourceConfig": {"InstanceCount": 1}}


def test_a_transition_sets_the_primary_status_and_closes_the_previous_one():
    record = state.transition(state.initial(_request()), "Training")
    assert record["TrainingJobStatus"] == "InProgress" and record["SecondaryStatus"] == "Training"
    first, second = record["SecondaryStatusTransitions"]
    assert first["EndTime"] == second["StartTime"] and "EndTime" not in second
    done = state.transition(record, "Completed")
    assert done["TrainingJobStatus"] == "Completed"
    assert done["TrainingEndTime"] >= done["TrainingStartTime"]
    assert done["TrainingTimeInSeconds"] == done["BillableTimeInSeconds"] >= 0


def test_a_written_record_reads_back_with_aware_times(tmp_path):
    record = state.initial(_request())
    state.write(tmp_path / "job.json", record)
    back = state.read(tmp_path / "job.json")
    assert back == record and back["CreationTime"].tzinfo is not None


def test_threads_writing_at_once_never_publish_a_mixed_record(tmp_path):
    """Records of different lengths written by several threads of one process: every read sees
    one whole record (a shared temporary name once published one record with another's tail)."""
    path, writers, rounds = tmp_path / "job.json", 4, 300
    state.write(path, {"writer": -1})
    start, done = threading.Barrier(writers + 1), threading.Event()
    errors: list[str] = []

    def write(w):
        start.wait()
        for i in range(rounds):
            try:
                state.write(path, {"writer": w, "round": i, "pad": "x" * (w * 700 + i % 7)})
            except OSError as error:  # another thread renamed the temporary file away
                errors.append(repr(error))

    def read():
        start.wait()
        while not done.is_set():
            try:
                json.loads(path.read_text())
            except ValueError as error:
                errors.append(str(error))

    threads = [threading.Thread(target=write, args=(w,)) for w in range(writers)]
    reader = threading.Thread(target=read)
    for t in threads + [reader]:
        t.start()
    for t in threads:
        t.join()
    done.set()
    reader.join()
    assert errors == []
    final = state.read(path)
    assert final["round"] == rounds - 1 and final["pad"] == "x" * (final["writer"] * 700 + final["round"] % 7)
    assert not list(tmp_path.glob(".job.json.*.tmp"))
