"""Shoal's own rules on recorded data: collectives slowed by busy CPUs, steps that wait for
communication, data parallelism inside one node; each triggered and not."""

from __future__ import annotations

import pytest
from shoal.profiler.trace import TraceWriter

from tests.unit.test_profiler_rules import T0, evaluate, result, status, write_system


def write_collectives(root, node, plan, rank=0, nbytes=1 << 20):
    """``plan``: (start offset s, duration s) of each synchronous all_reduce."""
    trace = TraceWriter(root, node)
    for n, (offset, duration) in enumerate(plan):
        trace.span("Collective", "all_reduce", T0 + offset, duration, bytes=nbytes, rank=rank,
                   step_num=n, backend="shoal")
    trace.close()


def write_steps_with_comm(root, node, steps, step_s, comm_s, ranks=(0,)):
    trace = TraceWriter(root, node)
    for rank in ranks:
        t = T0
        for n in range(steps):
            trace.span("Step:ModeKeys.TRAIN", "Step", t, step_s, step_num=n, rank=rank)
            trace.span("Collective", "all_reduce", t + step_s - comm_s, comm_s, step_num=n,
                       rank=rank, bytes=4096)
            t += step_s
    trace.close()


def test_collectives_slowed_by_busy_cpus(tmp_path):
    # 40 s of samples: calm (20 %) for 10 s, then saturated (98 %)
    for case in ("contended", "calm"):
        root = tmp_path / case
        busy = (lambda i, c: 20 if i < 20 else 98) if case == "contended" else 20
        write_system(root, "algo-1", 80, cpu=busy, gpus=0)
        calm = [(0.05 * i, 0.0001) for i in range(150)]  # 7.5 s at 20 collectives a second
        later = [(12 + 0.05 * i, 0.002 if case == "contended" else 0.00012) for i in range(200)]
        write_collectives(root, "algo-1", calm + later)
    found = evaluate(tmp_path / "contended", "CollectiveCPUContention")
    fine = evaluate(tmp_path / "calm", "CollectiveCPUContention")
    assert status(found, "CollectiveCPUContention")["RuleEvaluationStatus"] == "IssuesFound"
    details = result(found, "CollectiveCPUContention")["Details"]["1048576 bytes"]
    assert details["contended_collectives"] == 200 and details["contended_seconds"] == 10
    assert details["worst_inflation"] == pytest.approx(20)
    assert "move preprocessing" in status(found, "CollectiveCPUContention")["StatusDetails"]
    assert status(found, "CollectiveCPUContention")["StatusDetails"].startswith(
        "200 of 350 collectives ran while the CPU was busy above 90 %, at least 3x slower than "
        "calm (10 contended second(s), worst 20.0x) (triggered 1 time(s)). Fix: ")
    assert status(fine, "CollectiveCPUContention")["RuleEvaluationStatus"] == "NoIssuesFound"


def test_busy_cpus_without_slower_collectives_are_no_issue(tmp_path):
    write_system(tmp_path, "algo-1", 80, cpu=98, gpus=0)
    write_collectives(tmp_path, "algo-1", [(0.05 * i, 0.001 * (1 + i % 3)) for i in range(600)])
    ev = evaluate(tmp_path, "CollectiveCPUContention")
    assert status(ev, "CollectiveCPUContention")["RuleEvaluationStatus"] == "NoIssuesFound"


@pytest.mark.parametrize("comm_s, expected", [(0.04, "IssuesFound"), (0.01, "NoIssuesFound")])
def test_communication_bound_steps(tmp_path, comm_s, expected):
    write_steps_with_comm(tmp_path, "algo-1", 30, 0.1, comm_s)
    ev = evaluate(tmp_path, "CommunicationBound")
    assert status(ev, "CommunicationBound")["RuleEvaluationStatus"] == expected
    share = result(ev, "CommunicationBound")["Details"]["collective_share_percent"]["p50"]
    assert share == pytest.approx(100 * comm_s / 0.1)


def write_ddp_steps(root, node, steps, step_s, tail_s, buckets=4):
    """DDP as Shoal's backend records it: each step's buckets queued during the backward
    pass (no caller waits on them: no ``exposed_s``), the last issued ``tail_s`` before the
    step's collectives end; and one small synchronous broadcast the caller waited on."""
    trace = TraceWriter(root, node)
    t = T0
    for n in range(steps):
        trace.span("Step:ModeKeys.TRAIN", "Step", t, step_s, step_num=n, rank=0)
        comm_end = t + step_s - 0.005
        last_issue = comm_end - tail_s
        for b in range(buckets):
            issued = last_issue - (buckets - 1 - b) * 0.01
            start = max(issued, last_issue - 0.002 * (buckets - b))  # queued behind the others
            end = comm_end - 0.001 * (buckets - 1 - b)
            trace.span("Collective", "allreduce", start, end - start, step_num=n, rank=0,
                       bytes=1 << 20, backend="shoal", mode="queued", queued_s=start - issued)
        trace.span("Collective", "broadcast", t, 0.001, step_num=n, rank=0, bytes=8,
                   backend="shoal", mode="eager", queued_s=0.0, exposed_s=0.001)
        t += step_s
    trace.close()


@pytest.mark.parametrize("tail_s, expected", [(0.05, "IssuesFound"), (0.005, "NoIssuesFound")])
def test_communication_bound_counts_what_ddp_waits_for_after_its_last_bucket(
        tmp_path, tail_s, expected):
    # the buckets span about 40 ms of each 100 ms step, but only the tail after the last
    # one's issue is waiting: with a 5 ms tail the step is not communication-bound
    write_ddp_steps(tmp_path, "algo-1", 30, 0.1, tail_s)
    ev = evaluate(tmp_path, "CommunicationBound")
    assert status(ev, "CommunicationBound")["RuleEvaluationStatus"] == expected
    details = result(ev, "CommunicationBound")["Details"]
    assert details["collective_share_percent"]["p50"] == pytest.approx(
        100 * (tail_s + 0.001) / 0.1, abs=0.01)
    assert details["steps_with_overlapped_collectives"] == 30


def write_overlapping_waits(root, node, steps, step_s, buckets=4, wait_s=0.04):
    """Each step's ``buckets`` allreduces queued together and waited on at once by as many
    threads: their waits (``exposed_s``) cover the same ``wait_s`` before the step ends."""
    trace = TraceWriter(root, node)
    t = T0
    for n in range(steps):
        trace.span("Step:ModeKeys.TRAIN", "Step", t, step_s, step_num=n, rank=0)
        for b in range(buckets):
            end = t + step_s - 0.005 - 0.0001 * b
            trace.span("Collective", "allreduce", end - wait_s - 0.01, wait_s + 0.01, step_num=n,
                       rank=0, bytes=1 << 20, backend="shoal", mode="queued", queued_s=0.0,
                       exposed_s=wait_s)
        t += step_s
    trace.close()


def test_communication_share_merges_overlapping_waits(tmp_path):
    # summed, four 40 ms waits made 160 % of a 100 ms step; merged, they are about 40 %
    write_overlapping_waits(tmp_path, "algo-1", 30, 0.1)
    ev = evaluate(tmp_path, "CommunicationBound")
    share = result(ev, "CommunicationBound")["Details"]["collective_share_percent"]
    assert share["max"] <= 100
    assert share["p50"] == pytest.approx(40.3, abs=0.1)


def test_communication_share_counts_only_the_wait_inside_each_step(tmp_path):
    # DDP's constructor waits 0.5 s on its broadcast before the first step, which the hooks
    # number 0 (the first step to end after it): it is no part of step 0's 100 ms
    write_steps_with_comm(tmp_path, "algo-1", 30, 0.1, 0.01)
    trace = TraceWriter(tmp_path, "algo-1")
    trace.span("Collective", "broadcast", T0 - 0.6, 0.5, step_num=0, rank=0, bytes=1 << 20,
               backend="shoal", mode="eager", queued_s=0.0, exposed_s=0.5)
    trace.close()
    ev = evaluate(tmp_path, "CommunicationBound")
    share = result(ev, "CommunicationBound")["Details"]["collective_share_percent"]
    assert share["max"] == pytest.approx(10, abs=0.01) and share["min"] == pytest.approx(10, abs=0.01)


def test_single_node_data_parallel(tmp_path):
    write_steps_with_comm(tmp_path / "one", "algo-1", 20, 0.1, 0.01, ranks=(0, 1))
    write_steps_with_comm(tmp_path / "two", "algo-1", 20, 0.1, 0.01, ranks=(0,))
    write_steps_with_comm(tmp_path / "two", "algo-2", 20, 0.1, 0.01, ranks=(1,))
    assert status(evaluate(tmp_path / "one", "SingleNodeDataParallel"),
                  "SingleNodeDataParallel")["RuleEvaluationStatus"] == "IssuesFound"
    assert status(evaluate(tmp_path / "two", "SingleNodeDataParallel"),
                  "SingleNodeDataParallel")["RuleEvaluationStatus"] == "NoIssuesFound"


def test_shoal_rules_run_together_and_say_when_data_is_missing(tmp_path):
    write_system(tmp_path, "algo-1", 10, gpus=0)
    ev = evaluate(tmp_path, "ShoalRules")
    details = {s["Rule"]: s["StatusDetails"] for s in ev.statuses()}
    assert set(details) == {"CollectiveCPUContention", "CommunicationBound", "SingleNodeDataParallel"}
    assert all(d.startswith("Insufficient data") for d in details.values()), details
