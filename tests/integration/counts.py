"""Counting what a process holds (descriptors, native threads) for the leak tests: a
baseline once it holds still, and a later count once it is back or a time-out passed."""

from __future__ import annotations

import os
import time


def fd_count() -> int:
    return len(os.listdir("/proc/self/fd"))


def task_count() -> int:
    return len(os.listdir("/proc/self/task"))


def steady(count, quiet=0.5, seconds=10.0):
    """``count()`` once it has not changed for ``quiet`` seconds: the baseline must not hold
    what an earlier check is still releasing (a lingering thread and its descriptors), or
    the count after the checked work comes out lower than it."""
    deadline = time.monotonic() + seconds
    value, since = count(), time.monotonic()
    while time.monotonic() - since < quiet and time.monotonic() < deadline:
        time.sleep(0.02)
        now = count()
        if now != value:
            value, since = now, time.monotonic()
    return value


def settle(count, want, seconds=5.0):
    """``count()`` once it equals ``want`` or after ``seconds``: a joined thread's task and
    a closed socket's descriptor go a moment after the call that ends them returns."""
    deadline = time.monotonic() + seconds
    value = count()
    while value != want and time.monotonic() < deadline:
        time.sleep(0.01)
        value = count()
    return value
