"""The local runner's output: lines relayed from several hosts at once stay whole."""

from __future__ import annotations

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
