"""The pipeline scheduler: one task computes at a time, SMP's two schedules, replies."""

import threading

import pytest
from shoal.modelparallel.errors import SMPPeerError
from shoal.modelparallel.torch.scheduler import BACKWARD, FORWARD, Scheduler, current_task


def run_all(pipeline, tasks):
    """Spawns (name, microbatch, phase) tasks while closed, opens, returns the run order."""
    scheduler = Scheduler(pipeline)
    order, done = [], threading.Event()
    running = []

    def body(name):
        def run():
            running.append(name)
            assert len(running) == 1, running  # never two at once
            order.append(name)
            running.remove(name)
        return run

    for name, mb, phase in tasks:
        scheduler.spawn(name, mb, phase, body(name),
                        lambda t: done.set() if len(order) == len(tasks) else None)
    scheduler.open()
    assert scheduler.wait_idle(timeout=10)
    return order


TASKS = [("f2", 2, FORWARD), ("b0", 0, BACKWARD), ("f1", 1, FORWARD), ("b1", 1, BACKWARD)]


def test_interleaved_prefers_a_backward_then_the_lowest_microbatch():
    assert run_all("interleaved", TASKS) == ["b0", "b1", "f1", "f2"]


def test_simple_runs_every_forward_before_any_backward():
    assert run_all("simple", TASKS) == ["f1", "f2", "b0", "b1"]


def test_nothing_runs_while_closed():
    scheduler = Scheduler("interleaved")
    ran = threading.Event()
    scheduler.spawn("t", 0, FORWARD, ran.set)
    assert not ran.wait(0.2)
    scheduler.open()
    assert ran.wait(5)


def test_a_waiting_task_gives_its_turn_and_gets_an_early_reply():
    scheduler = Scheduler("interleaved")
    order = []

    def waiter():
        task = current_task()
        scheduler.expect(task)
        scheduler.deliver(task, "early")  # the reply beats the wait
        order.append("waiting")
        reply = scheduler.wait_reply(task, timeout=5)
        order.append(reply)

    scheduler.spawn("w", 0, FORWARD, waiter)
    scheduler.spawn("o", 1, FORWARD, lambda: order.append("other"))
    scheduler.open()
    assert scheduler.wait_idle(timeout=10)
    assert order == ["waiting", "other", "early"]


def test_a_reply_that_never_comes_times_out_with_the_message():
    scheduler = Scheduler("interleaved")
    caught = []

    def waiter():
        task = current_task()
        scheduler.expect(task)
        try:
            scheduler.wait_reply(task, timeout=0.1, late="rank 3 sent nothing")
        except SMPPeerError as exc:
            caught.append(str(exc))

    scheduler.spawn("w", 0, FORWARD, waiter)
    scheduler.open()
    assert scheduler.wait_idle(timeout=10)
    assert caught == ["rank 3 sent nothing"]


def test_a_peer_failure_wakes_every_waiter():
    scheduler = Scheduler("interleaved")
    started = threading.Event()

    def waiter():
        task = current_task()
        scheduler.expect(task)
        started.set()
        scheduler.wait_reply(task)

    task = scheduler.spawn("w", 0, FORWARD, waiter)
    scheduler.open()
    assert started.wait(5)
    scheduler.fail(RuntimeError("rank 1 died"))
    with pytest.raises(SMPPeerError, match="rank 1 died"):
        scheduler.wait_idle(timeout=10)
    for _ in range(100):
        if task.done:
            break
        threading.Event().wait(0.05)
    assert isinstance(task.error, SMPPeerError)


def test_unknown_schedule_is_refused():
    with pytest.raises(ValueError, match="'interleaved' or 'simple'"):
        Scheduler("gpipe")
