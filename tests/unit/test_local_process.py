"""Ending a local job's process tree: SIGTERM, then SIGKILL after the grace; a zombie counts
as gone (where nothing reaps orphans, waiting on one would take the whole grace)."""

import subprocess
import time

import psutil
from shoal.local import process


def test_a_zombie_that_is_not_our_child_counts_as_gone():
    # `sleep 0.1` is a child of the exec'd `sleep 30`, which never reaps it: a zombie.
    parent = subprocess.Popen(["sh", "-c", "sleep 0.1 & exec sleep 30"])
    try:
        deadline = time.monotonic() + 10
        while True:
            kids = psutil.Process(parent.pid).children()
            if kids and kids[0].status() == psutil.STATUS_ZOMBIE:
                break
            assert time.monotonic() < deadline, "no zombie appeared"
            time.sleep(0.05)
        start = time.monotonic()
        assert process._wait_gone(kids, timeout=5) == []
        assert time.monotonic() - start < 1
    finally:
        parent.kill()
        parent.wait()


def test_terminate_tree_ends_a_tree_that_ignores_sigterm_after_the_grace():
    root = subprocess.Popen(["sh", "-c", "trap '' TERM; sleep 30 & trap '' TERM; wait"])
    try:
        time.sleep(0.3)
        tree = process.tree(psutil.Process(root.pid))
        assert len(tree) >= 2
        start = time.monotonic()
        process.terminate_tree(psutil.Process(root.pid), grace=1)
        assert 0.9 <= time.monotonic() - start < 8
        assert not any(process._running(p) for p in tree)
    finally:
        root.kill()
        root.wait()
