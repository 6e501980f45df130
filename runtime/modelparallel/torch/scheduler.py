"""Which microbatch a pipeline rank works on next: cooperative tasks and SMP's two schedules.

Each piece of work on a rank (the step body for one microbatch on the pipeline's first rank,
a module's forward or backward that another rank asked for) is a task on its own thread
(kept in a pool from one task to the next), but only the task holding the rank's single turn computes. A task gives its turn up when it
waits for another rank (a remote module's outputs, its input gradients) and, on the first
rank, when its microbatch turns from forward to backward. The turn then goes to the best
ready task under the schedule:

- ``interleaved``: a task in its backward first, else the lowest microbatch's forward
  (microbatches in flight are capped by ``active_microbatches``): the 1F1B order.
- ``simple``: every forward first; a backward only once no task on this rank is in its
  forward (GPipe's order).

The turn is held only while the rank is inside ``smp.step`` (``open``/``close``), so work
that arrives early waits until the rank's own step has begun.
"""

from __future__ import annotations

import contextlib
import itertools
import threading
from collections.abc import Callable
from typing import Any

from shoal.modelparallel.errors import SMPPeerError

FORWARD, BACKWARD = "forward", "backward"


class Task:
    """One unit of work of one microbatch; ``phase`` is FORWARD or BACKWARD."""

    def __init__(self, name: str, microbatch: int, phase: str, seq: int) -> None:
        self.name, self.microbatch, self.phase, self.seq = name, microbatch, phase, seq
        self.result: Any = None
        self.error: BaseException | None = None
        self.done = False
        self.waiting = False
        self.parked = False  # in wait_reply, its turn given up: deliver() queues it
        self.reply: Any = None
        self.wake: threading.Condition | None = None  # on the scheduler's lock


class _Workers:
    """Threads kept from one task to the next: starting a thread for every request costs
    more than a small microbatch's work. A task may block (waiting for its turn or a
    reply), so the pool grows to the most tasks alive at once and keeps them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._idle: list[_Worker] = []

    def run(self, job: Callable[[], None]) -> None:
        with self._lock:
            worker = self._idle.pop() if self._idle else None
        (worker or _Worker(self)).give(job)

    def rest(self, worker: _Worker) -> None:
        with self._lock:
            self._idle.append(worker)


class _Worker:
    def __init__(self, pool: _Workers) -> None:
        self._pool = pool
        # One lock; the main thread's waits (wait_idle) use _cv, each task its own
        # condition, so a change wakes only the thread it concerns.
        self._lock = threading.Lock()
        self._cv = threading.Condition(self._lock)
        self._workers = _Workers()
        self._job: Callable[[], None] | None = None
        threading.Thread(target=self._loop, name="shoal-mp-task", daemon=True).start()

    def give(self, job: Callable[[], None]) -> None:
        with self._cv:
            self._job = job
            self._cv.notify()

    def _loop(self) -> None:
        while True:
            with self._cv:
                self._cv.wait_for(lambda: self._job is not None)
                job, self._job = self._job, None
            job()
            self._pool.rest(self)


_current = threading.local()


def current_task() -> Task | None:
    """The task this thread runs, or None outside the scheduler."""
    return getattr(_current, "task", None)


class Scheduler:
    def __init__(self, pipeline: str, timeline=None) -> None:
        if pipeline not in ("interleaved", "simple"):
            raise ValueError(f"'pipeline' must be 'interleaved' or 'simple' (got {pipeline!r})")
        self.pipeline = pipeline
        self._timeline = timeline
        self._turn_began = 0.0
        # One lock; the main thread's waits (wait_idle) use _cv, each task its own
        # condition, so a change wakes only the thread it concerns.
        self._lock = threading.Lock()
        self._cv = threading.Condition(self._lock)
        self._workers = _Workers()
        self._running: Task | None = None
        self._ready: list[Task] = []
        self._alive: set[Task] = set()
        self._seq = itertools.count()
        self._open = False
        self.peak_alive = 0  # most tasks alive at once (on the leader: microbatches in flight)
        self._error: BaseException | None = None
        self._finished: list[Task] = []

    # -- the step's window ------------------------------------------------------------
    def open(self) -> None:
        with self._cv:
            self._open = True
            self._dispatch()

    def close(self) -> None:
        with self._cv:
            self._open = False

    def wait_idle(self, until: Callable[[], bool] = lambda: True, timeout: float | None = None):
        """Blocks until no task is alive and ``until()`` holds (checked under the lock)."""
        with self._cv:
            ok = self._cv.wait_for(
                lambda: self._error is not None or (not self._alive and until()), timeout)
            self._raise_failure()
            return ok

    def notify(self) -> None:
        """Re-evaluates ``wait_idle``'s condition after state it reads has changed."""
        with self._cv:
            self._cv.notify_all()

    # -- tasks ------------------------------------------------------------------------
    def spawn(self, name: str, microbatch: int, phase: str, body: Callable[[], Any],
              on_done: Callable[[Task], None] | None = None) -> Task:
        task = Task(name, microbatch, phase, next(self._seq))
        task.wake = threading.Condition(self._lock)
        with self._cv:
            self._alive.add(task)
            self.peak_alive = max(self.peak_alive, len(self._alive))
            self._ready.append(task)
        self._workers.run(lambda: self._run(task, body, on_done))
        with self._cv:
            self._dispatch()
        return task

    def _run(self, task: Task, body, on_done) -> None:
        _current.task = task
        try:
            self._acquire(task)
            task.result = body()
        except BaseException as exc:  # noqa: BLE001 - the step's owner re-raises it
            task.error = exc
        finally:
            with self._cv:
                task.done = True
                self._alive.discard(task)
                if task in self._ready:  # it raised while queued (a peer failed)
                    self._ready.remove(task)
                if self._running is task:
                    self._running = None
                self._dispatch()
                self._cv.notify_all()
            if on_done is not None:
                on_done(task)
            _current.task = None  # the thread goes back to the pool

    def _acquire(self, task: Task) -> None:
        with self._cv:
            task.wake.wait_for(lambda: self._running is task or self._error is not None)
            self._raise_failure()

    def expect(self, task: Task) -> None:
        """Marks the task as waiting for a reply, before the request leaves (a fast reply
        may be delivered before the task reaches ``wait_reply``)."""
        with self._cv:
            task.waiting = True

    def wait_reply(self, task: Task, timeout: float | None = None, late: str = "") -> Any:
        """Gives the turn up until ``deliver(task, ...)``; returns what was delivered.
        Raises SMPPeerError with ``late`` when nothing came within ``timeout`` seconds."""
        with self._cv:
            self._running = None
            self._dispatch()
            if task.waiting:
                # deliver() queues the task for the turn: its thread wakes once, with it.
                task.parked = True
                has_turn = task.wake.wait_for(
                    lambda: self._running is task or self._error is not None, timeout)
                if not has_turn and task.waiting and self._error is None:
                    task.parked = False
                    raise SMPPeerError(late or f"no reply within {timeout}s")
                task.parked = False
            else:
                self._ready.append(task)
                self._dispatch()
            task.wake.wait_for(lambda: self._running is task or self._error is not None)
            self._raise_failure()
            reply, task.reply = task.reply, None
            return reply

    @contextlib.contextmanager
    def off_turn(self, task: Task):
        """Gives the turn up for the body's blocking wait (a tensor-parallel exchange with
        peers that may be on another microbatch), then queues the task for it again."""
        with self._cv:
            self._running = None
            self._dispatch()
        try:
            yield
        finally:
            with self._cv:
                self._ready.append(task)
                self._dispatch()
                task.wake.wait_for(lambda: self._running is task or self._error is not None)
                self._raise_failure()

    def deliver(self, task: Task, reply: Any) -> None:
        with self._cv:
            task.reply = reply
            task.waiting = False
            if task.parked:
                self._ready.append(task)
                self._dispatch()

    def switch_phase(self, task: Task, phase: str) -> None:
        """The task's microbatch moves to ``phase``; the schedule may now prefer another."""
        with self._cv:
            task.phase = phase
            self._running = None
            self._ready.append(task)
            self._dispatch()
            task.wake.wait_for(lambda: self._running is task or self._error is not None)
            self._raise_failure()

    def fail(self, error: BaseException) -> None:
        """A peer failed: every waiting task raises SMPPeerError from it."""
        with self._cv:
            if self._error is None:
                self._error = error
            for task in self._alive:
                task.wake.notify_all()
            self._cv.notify_all()

    def _raise_failure(self) -> None:
        if self._error is not None:
            raise SMPPeerError(f"a pipeline peer failed: {self._error}") from self._error

    # -- the turn, recorded on the timeline --------------------------------------------
    @property
    def _running(self) -> Task | None:
        return self.__running

    @_running.setter
    def _running(self, task: Task | None) -> None:
        previous = getattr(self, "_Scheduler__running", None)
        if self._timeline is not None and previous is not None and previous is not task:
            self._timeline.span(f"{previous.phase} mb{previous.microbatch}", "task",
                                self._turn_began, self._timeline.now(), task=previous.name)
        if task is not None and task is not previous and self._timeline is not None:
            self._turn_began = self._timeline.now()
        self.__running = task

    # -- the schedule -----------------------------------------------------------------
    def _dispatch(self) -> None:
        if self._running is not None or not self._open or not self._ready:
            return
        eligible = self._ready
        if self.pipeline == "simple" and any(
            t.phase == FORWARD and not t.done for t in self._alive
        ):
            eligible = [t for t in self._ready if t.phase == FORWARD] or []
        if not eligible:
            return
        best = min(eligible, key=self._priority)
        self._ready.remove(best)
        self._running = best
        best.wake.notify()

    def _priority(self, task: Task):
        backward_first = 0 if task.phase == BACKWARD else 1
        if self.pipeline == "simple":
            backward_first = 1 - backward_first
        return (backward_first, task.microbatch, task.seq)
