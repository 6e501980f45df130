"""Framework events from a PyTorch training script, without changes to it: training steps
(torch's global optimizer-step hooks), forward passes of the outermost module, backward
passes, and data-loader fetches, written as Debugger's framework trace
(``Step:ModeKeys.TRAIN`` with ``step_num``, ``Forward``, ``Backward``, ``DataLoaderIter``).

The job's launcher puts ``bootstrap/`` first on PYTHONPATH and ``SHOAL_PROFILER_DIR`` in the
environment; ``install_when_imported`` then waits, at no cost, until the script imports
``torch.optim`` and installs the hooks there. ``SHOAL_PROFILER_EVENTS=steps`` (what system
monitoring alone needs) records the steps only; ``all`` (framework profiling, or rules over
framework events) adds forward, backward and data-loader spans. A script may also mark its own steps with
:func:`step` (then optimizer steps are not counted as steps).

Collectives are ``Collective`` spans with their bytes and backend. Shoal's c10d backend
records its own operations (csrc/activity.h), DDP's buckets included, which no Python
wrapper sees; a thread here takes them every ``DRAIN_INTERVAL_S`` and at exit. Each says
how it ran (``mode``: eager on the caller's thread, queued on the core's, transfer), how long
it queued, and how long a caller waited on it (``exposed_s``; absent for DDP's buckets,
which the reducer waits on in C++). Other backends' synchronous calls are timed here, as
the caller's wait.
"""

from __future__ import annotations

import atexit
import bisect
import importlib.abc
import os
import sys
import threading
import time
from contextlib import contextmanager

from shoal.profiler.trace import TraceWriter

TRAIN = "Step:ModeKeys.TRAIN"
SHOAL_BACKENDS = ("shoal", "smddp")
DRAIN_INTERVAL_S = 1.0
STEP_ENDS_KEPT = 4096  # records are taken within seconds: older step ends are not needed
_state = threading.local()


class Recorder:
    """This process's events and step clock."""

    def __init__(self, root: str, node: str, rank: int):
        self.writer = TraceWriter(root, node)
        self.rank = rank
        self.step_num = 0
        self.step_start: float | None = None
        self.manual = False
        self.step_ends: list[float] = []  # when recent steps ended, and their numbers
        self.step_nums: list[int] = []
        self.drain_lock = threading.Lock()
        self.draining = False
        atexit.register(self.close)

    def close(self) -> None:
        self.drain_backend()
        self.writer.close()

    def marked_step(self, start: float, end: float, mode: str = "TRAIN",
                    step_num: int | None = None) -> None:
        """A step the script (or its framework's loop) marked itself: then optimizer steps
        are not counted as steps."""
        self.manual = True
        num = self.step_num if step_num is None else step_num
        self.span(f"Step:ModeKeys.{mode}", "Step", start, end, step_num=num)
        self.step_ended(end, num)
        self.step_num += 1

    def step_ended(self, now: float, step_num: int) -> None:
        self.step_ends.append(now)
        self.step_nums.append(step_num)
        if len(self.step_ends) > 2 * STEP_ENDS_KEPT:
            del self.step_ends[:-STEP_ENDS_KEPT], self.step_nums[:-STEP_ENDS_KEPT]

    def step_at(self, ts: float) -> int:
        """The step a collective issued at ``ts`` belongs to: the first to end after it."""
        i = bisect.bisect_left(self.step_ends, ts)
        return self.step_nums[i] if i < len(self.step_nums) else self.step_num

    def drain_backend(self) -> int:
        """Writes the operations Shoal's c10d backend recorded since the last call."""
        backend = sys.modules.get("shoal.dataparallel.torch.backend")
        if backend is None:
            return 0
        with self.drain_lock:
            records, dropped = backend.take_activity()
            for name, mode, issued, started, ended, exposed, nbytes, across, ok in records:
                args = {"step_num": self.step_at(issued / 1e6), "bytes": nbytes,
                        "backend": "shoal", "mode": mode, "queued_s": (started - issued) / 1e6,
                        "across_hosts": bool(across)}
                if exposed >= 0:
                    args["exposed_s"] = exposed / 1e6
                if not ok:
                    args["failed"] = True
                self.span("Collective", name, started / 1e6, ended / 1e6, **args)
            if dropped:
                now = time.time()
                self.span("Profiler", "collective_records_dropped", now, now, dropped=dropped)
        return len(records)

    def start_draining(self) -> None:
        if self.draining:
            return
        self.draining = True

        def loop():
            while True:
                time.sleep(DRAIN_INTERVAL_S)
                try:
                    self.drain_backend()
                except Exception:  # profiling must never stop a job; the exit drain reports
                    return

        threading.Thread(target=loop, name="shoal-profiler-drain", daemon=True).start()

    def span(self, phase, name, start, end, **args):
        self.writer.span(phase, name, start, end - start, rank=self.rank, **args)

    def optimizer_stepped(self) -> None:
        """Step k (from 0) ends with the (k+1)-th optimizer step and began where step k-1
        ended (step 0: at the first forward, when forwards are recorded)."""
        now = time.time()
        if not self.manual:
            if self.step_start is not None:
                self.span(TRAIN, "Step", self.step_start, now, step_num=self.step_num)
            self.step_ended(now, self.step_num)
            self.step_num += 1
        self.step_start = now

    def forward_began(self) -> None:
        if self.step_start is None:  # the first step starts with the first forward
            self.step_start = time.time()


_recorder: Recorder | None = None


def recorder() -> Recorder | None:
    global _recorder
    root = os.environ.get("SHOAL_PROFILER_DIR")
    if _recorder is None and root:
        node = os.environ.get("SHOAL_HOST") or os.environ.get("SM_CURRENT_HOST") or "algo-1"
        _recorder = Recorder(root, node, int(os.environ.get("RANK", "0") or 0))
    return _recorder


@contextmanager
def step(step_num: int | None = None, mode: str = "TRAIN"):
    """Mark one step yourself: ``with shoal.profiler.hooks.step(): train_one_batch()``."""
    rec = recorder()
    start = time.time()
    try:
        yield
    finally:
        if rec is not None:
            rec.marked_step(start, time.time(), mode, step_num)


def install_torch() -> None:
    """Hook torch: optimizer steps, outermost forwards, backwards, data-loader fetches."""
    import torch
    from torch.nn.modules import module as nn_module
    from torch.optim import optimizer as optim

    rec = recorder()
    if rec is None or getattr(torch, "_shoal_profiler_hooked", False):
        return
    torch._shoal_profiler_hooked = True
    optim.register_optimizer_step_post_hook(lambda *_: rec.optimizer_stepped())
    rec.start_draining()
    _hook_collectives(rec)
    hook_core(rec)
    if os.environ.get("SHOAL_PROFILER_EVENTS", "all") == "steps":
        return

    def pre(module, args):
        depth = getattr(_state, "depth", 0)
        if depth == 0:
            rec.forward_began()
            _state.start = time.time()
        _state.depth = depth + 1

    def post(module, args, output):
        _state.depth = getattr(_state, "depth", 1) - 1
        if _state.depth == 0:
            rec.span("Forward", type(module).__name__, _state.start, time.time(),
                     step_num=rec.step_num)

    nn_module.register_module_forward_pre_hook(pre)
    nn_module.register_module_forward_hook(post)
    original_backward = torch.autograd.backward

    def backward(*args, **kwargs):
        start = time.time()
        try:
            return original_backward(*args, **kwargs)
        finally:
            rec.span("Backward", "backward", start, time.time(), step_num=rec.step_num)

    torch.autograd.backward = backward
    _hook_dataloader(rec)


COLLECTIVES = ("all_reduce", "broadcast", "all_gather", "all_gather_into_tensor", "reduce",
               "reduce_scatter", "reduce_scatter_tensor", "all_to_all", "all_to_all_single",
               "gather", "scatter", "barrier", "send", "recv")


def _nbytes(value) -> int:
    """A tensor's, an array's or a list of them's bytes."""
    if hasattr(value, "nbytes") and not hasattr(value, "numel"):  # numpy
        return int(value.nbytes)
    if hasattr(value, "element_size") and hasattr(value, "numel"):
        return int(value.element_size() * value.numel())
    if isinstance(value, (list, tuple)):
        return sum(_nbytes(v) for v in value)
    return 0


def _hook_collectives(rec: Recorder) -> None:
    """Synchronous torch.distributed collectives as ``Collective`` spans: the time the caller
    waited (what a step loses to communication), the bytes, the backend. Shoal's backend
    records its own (see the module's docstring)."""
    import torch.distributed as dist

    if not dist.is_available():
        return
    backends: dict[int, str] = {}

    def backend_of(group) -> str:
        # get_backend costs tens of microseconds: once per group
        key = id(group)
        if key not in backends:
            try:
                backends[key] = str(dist.get_backend(group))
            except Exception:  # not initialised, or not a member: ask again next time
                return ""
        return backends[key]

    for name in COLLECTIVES:
        original = getattr(dist, name, None)
        if original is None or getattr(original, "_shoal_profiled", False):
            continue

        def wrapper(*args, _original=original, _name=name, **kwargs):
            start = time.time()
            result = _original(*args, **kwargs)
            if not kwargs.get("async_op"):
                backend = backend_of(kwargs.get("group"))
                if backend.lower() not in SHOAL_BACKENDS:
                    end = time.time()
                    rec.span("Collective", _name, start, end, step_num=rec.step_num,
                             bytes=_nbytes(args[0] if args else kwargs.get("tensor")),
                             backend=backend, exposed_s=end - start)
            return result

        wrapper._shoal_profiled = True
        wrapper.__wrapped__ = original
        wrapper.__name__ = name
        setattr(dist, name, wrapper)


CORE_COLLECTIVES = ("allreduce", "broadcast", "allgather", "reduce", "reduce_scatter", "alltoall",
                    "gather", "scatter", "barrier", "send", "recv")


def hook_core(rec: Recorder | None = None) -> None:
    """Shoal's core API (``shoal.dataparallel.core``, under the TensorFlow and module APIs):
    each call as a ``Collective`` span with its bytes and whether it crossed hosts."""
    rec = rec or recorder()
    core = sys.modules.get("shoal.dataparallel.core")
    if rec is None or core is None or getattr(core, "_shoal_profiled", False):
        return
    core._shoal_profiled = True
    hosts_of: dict[int, int] = {}

    def hosts(group) -> int:
        key = id(group)
        if key not in hosts_of:
            try:
                topology = core._target(group).topology()
                hosts_of[key] = int(topology["num_hosts"] if isinstance(topology, dict)
                                    else topology.num_hosts)
            except Exception:  # no communicator yet: the call itself says why
                return 0
        return hosts_of[key]

    for name in CORE_COLLECTIVES:
        original = getattr(core, name, None)
        if original is None:
            continue

        def wrapper(*args, _original=original, _name=name, **kwargs):
            start = time.time()
            result = _original(*args, **kwargs)
            end = time.time()
            rec.span("Collective", _name, start, end, step_num=rec.step_num,
                     bytes=_nbytes(args[0] if args else None), backend="shoal-core",
                     across_hosts=hosts(kwargs.get("group")) > 1, exposed_s=end - start)
            return result

        wrapper.__wrapped__ = original
        wrapper.__name__ = name
        setattr(core, name, wrapper)


def _hook_dataloader(rec: Recorder) -> None:
    from torch.utils.data import dataloader

    base = dataloader._BaseDataLoaderIter
    original_next, original_init = base.__next__, base.__init__

    def __init__(self, loader, *args, **kwargs):
        original_init(self, loader, *args, **kwargs)
        now = time.time()
        rec.span("DataLoaderIterInitialize", "DataLoaderIterInitialize", now, now,
                 num_workers=getattr(loader, "num_workers", 0),
                 pin_memory=bool(getattr(loader, "pin_memory", False)))

    def __next__(self):
        start = time.time()
        try:
            return original_next(self)
        finally:
            rec.span("DataLoaderIter", "DataLoaderIter", start, time.time(),
                     pid=os.getpid(), workers=getattr(self, "_num_workers", 0))

    base.__init__, base.__next__ = __init__, __next__


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs ``callback`` right after module ``target`` is first imported."""

    def __init__(self, target: str, callback):
        self.target, self.callback = target, callback

    def find_spec(self, name, path, target=None):
        if name != self.target:
            return None
        sys.meta_path.remove(self)
        import importlib.util

        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        original = spec.loader.exec_module
        callback = self.callback

        def exec_module(module):
            original(module)
            callback()

        spec.loader.exec_module = exec_module
        return spec


def _after_optimizer_import() -> None:
    # torch.optim.optimizer is imported while torch itself is still importing: install
    # once the outermost import of torch has finished.
    if "torch" in sys.modules and hasattr(sys.modules["torch"], "optim"):
        _safe_install()
    else:
        sys.meta_path.insert(0, _TorchDone())


class _TorchDone(importlib.abc.MetaPathFinder):
    """Installs at the first import of anything after torch finished importing."""

    def find_spec(self, name, path, target=None):
        torch = sys.modules.get("torch")
        if torch is not None and hasattr(torch, "optim") and hasattr(torch, "autograd"):
            sys.meta_path.remove(self)
            _safe_install()
        return None


def _safe_install() -> None:
    try:
        install_torch()
    except Exception as error:  # profiling must never stop a job
        sys.stderr.write(f"shoal profiler: torch events off ({error})\n")


def _safe_hook_core() -> None:
    try:
        hook_core()
    except Exception as error:  # profiling must never stop a job
        sys.stderr.write(f"shoal profiler: core events off ({error})\n")


def install_keras() -> None:
    """Keras: every ``Model.fit`` gets a callback that records its training batches as steps
    (and ``evaluate``'s batches as ``Step:ModeKeys.EVAL``). A compiled train function runs
    the Python of an optimizer only while tracing, so steps come from Keras' own loop."""
    import keras

    rec = recorder()
    if rec is None or getattr(keras.Model.fit, "_shoal_profiled", False):
        return
    rec.start_draining()

    class StepRecorder(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.began, self.eval_num = 0.0, 0

        def on_train_batch_begin(self, batch, logs=None):
            self.began = time.time()

        def on_train_batch_end(self, batch, logs=None):
            rec.marked_step(self.began, time.time())

        def on_test_batch_begin(self, batch, logs=None):
            self.began = time.time()

        def on_test_batch_end(self, batch, logs=None):
            rec.span("Step:ModeKeys.EVAL", "Step", self.began, time.time(), step_num=self.eval_num)
            self.eval_num += 1

    original = keras.Model.fit

    def fit(self, *args, **kwargs):
        callbacks = list(kwargs.pop("callbacks", None) or [])
        if not any(isinstance(c, StepRecorder) for c in callbacks):
            callbacks.append(StepRecorder())
        return original(self, *args, callbacks=callbacks, **kwargs)

    fit._shoal_profiled = True
    fit.__wrapped__ = original
    keras.Model.fit = fit


def _safe_install_keras() -> None:
    try:
        install_keras()
    except Exception as error:  # profiling must never stop a job
        sys.stderr.write(f"shoal profiler: keras steps off ({error})\n")


def install_when_imported() -> None:
    """Hooks torch once ``torch.optim`` is imported, Keras once it is, and Shoal's core API
    once it is."""
    if any(isinstance(f, _AfterImport) for f in sys.meta_path):
        return
    if "torch.optim.optimizer" in sys.modules:
        _safe_install()
    else:
        sys.meta_path.insert(0, _AfterImport("torch.optim.optimizer", _after_optimizer_import))
    if "keras" in sys.modules:
        _safe_install_keras()
    else:
        sys.meta_path.insert(0, _AfterImport("keras", _safe_install_keras))
    if "shoal.dataparallel.core" in sys.modules:
        _safe_hook_core()
    else:
        sys.meta_path.insert(0, _AfterImport("shoal.dataparallel.core", _safe_hook_core))
