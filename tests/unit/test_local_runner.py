"""The local runner's output: lines relayed from several hosts at once stay whole."""

from __future__ import annotations

import json
import threading

from shoal.local import runner


def test_hosts_printing_at_once_never_join_or_split_lines(capsys):
    hosts, lines = 4, 2000
    start = threading.Barrier(hosts)

    def relay(h):
        start.wait()
        for i in range(lines):
            runner.host_line(f"algo-{h}", f"line {i} of host {h} " + "x" * (i % 50))

    threads = [threading.Thread(target=relay, args=(h,)) for h in range(1, hosts + 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    out = capsys.readouterr().out.splitlines()
    assert len(out) == hosts * lines
    for h in range(1, hosts + 1):
        mine = [ln for ln in out if ln.startswith(f"[algo-{h}] ")]
        assert mine == [f"[algo-{h}] line {i} of host {h} " + "x" * (i % 50) for i in range(lines)]


def test_a_line_that_names_its_rank_keeps_its_own_tag(capsys):
    runner.host_line("algo-2", "[1,mpirank:3,algo-2]<stdout>:hello")
    runner.say("Training job completed")
    assert capsys.readouterr().out == ("[1,mpirank:3,algo-2]<stdout>:hello\n"
                                       "[local] Training job completed\n")


def test_the_downloading_message_names_the_channels():
    assert runner.input_message([]) == "No input data to download"
    assert runner.input_message(["train"]) == "Downloading input data (channel train)"
    assert runner.input_message(["test", "train"]) == (
        "Downloading input data (2 channels: test, train)")


def test_rule_verdicts_recorded_while_the_job_moves_lose_no_transition(tmp_path, monkeypatch):
    """The rules thread records verdicts while the main thread moves the job: both changes
    survive (each read-modify-write of job.json holds the supervisor's record lock)."""
    from shoal.local import state

    request = {"TrainingJobName": "job-a",
               "ResourceConfig": {"InstanceCount": 1, "InstanceType": "local"}}
    (tmp_path / "request.json").write_text(json.dumps(request))
    state.write(tmp_path / "job.json", state.initial(request))
    monkeypatch.setattr(runner, "say", lambda message: None)
    sup = runner.Supervisor(tmp_path)
    moves = ["Downloading", "Training"] * 60 + ["Uploading"]
    verdicts = 200
    start = threading.Barrier(2)

    def move():
        start.wait()
        for status in moves:
            sup.move(status)

    def record():
        start.wait()
        for i in range(verdicts):
            sup.record_rules([{"RuleConfigurationName": "LowGPUUtilization",
                               "RuleEvaluationStatus": "InProgress", "Round": i}])

    threads = [threading.Thread(target=move), threading.Thread(target=record)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    final = state.read(tmp_path / "job.json")
    assert [t["Status"] for t in final["SecondaryStatusTransitions"]] == ["Starting"] + moves
    assert final["ProfilerRuleEvaluationStatuses"][0]["Round"] == verdicts - 1
