"""Run PyTorch's own process-group test suite (``DistributedTest._DistTestBase`` from
``torch.testing._internal.distributed.distributed_test``) on a backend, the way PyTorch's
``test/distributed/test_distributed_spawn.py`` runs it for gloo: environment ``BACKEND``,
``WORLD_SIZE``, ``TEMP_DIR`` (with ``barrier/``) and ``INIT_METHOD``, and one spawned process per
rank through ``TestDistBackend`` / ``MultiProcessTestCase``.

Three roles share this file:

* the orchestrator (``run_suite.py --backend shoal --world-size 2 ...``) imports no torch. It
  starts a worker in its own session, streams its per-test results, kills the worker's process
  group when a test outlives ``--timeout`` plus a grace period (a hang in the harness itself),
  restarts it on the remaining tests, then prints a summary and writes ``--json`` / ``--junit``;
* the worker (``--worker``, environment ``SHOAL_TORCH_SUITE_HARNESS=1``) is the unittest parent
  of ``test_distributed_spawn.py``: it runs one test at a time and appends a JSON line per test;
* the ranks: ``MultiProcessTestCase`` spawns them with the ``spawn`` start method, which runs this
  module again as ``__mp_main__``. The module-level harness below therefore runs in every rank
  before the test: it imports ``shoal.dataparallel.torch`` (which registers ``shoal`` and
  ``smddp``) before ``init_process_group``, and configures torch's test tables the same way in
  the parent and the ranks.

``compare`` (``run_suite.py compare RESULT.json ...``) writes the table of tests that pass on the
baseline backend (gloo) but not on another one, per world size.

Backend special cases in torch's suite, and how a plugin backend is treated here:

* ``DistTestCases.backend_feature`` (``"ddp"``, ``"subgroup"``, ``"plugin"``, ``"gpu"``) gates
  tests with ``BACKEND in/not in ...`` at class-definition time. A CPU backend registered through
  ``Backend.register_backend`` is added to ``PLUGIN_FEATURES`` before the suite is imported, so
  those tests run on it as they do on gloo. ``"gpu"`` is included because torch also uses it as
  the availability gate of CPU tests (``test_all_gather_object_*``: only nccl sets a device);
  every other test behind it also needs CUDA devices (``skip_if_lt_x_gpu``). ``"cuda"`` (CUDA
  tensors in DDP communication hooks) is not added: the backend registers the CPU device only.
* ``DistTestCases.skip_collective`` lists backends that lack a collective; a plugin is in none.
* Literal comparisons (``BACKEND != "gloo"``, ``require_backend_is_available({"gloo"})``) cannot be
  configured: such tests skip on any other backend, and the skip reason says so. ``--gates-as
  gloo`` evaluates the suite's class-definition gates as if ``BACKEND`` were gloo while every
  process group is still created on ``--backend`` (a diagnostic: it runs gloo's test list on the
  backend; tests of gloo-only torch APIs such as ``monitored_barrier`` then fail by design).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent

# Torch's own process-group backends: the suite knows them by name.
NATIVE_BACKENDS = ("gloo", "nccl", "ucc", "mpi", "xccl", "hccl")
# Backends whose import registers them with torch.distributed.
PLUGIN_IMPORTS = {"shoal": "shoal.dataparallel.torch", "smddp": "shoal.dataparallel.torch"}
# backend_feature sets a CPU plugin backend joins (see the module docstring).
PLUGIN_FEATURES = ("ddp", "subgroup", "plugin", "gpu")

HARNESS_ENV = "SHOAL_TORCH_SUITE_HARNESS"
EVENTS_ENV = "SHOAL_TORCH_SUITE_EVENTS"
GATES_ENV = "SHOAL_TORCH_SUITE_GATES_AS"
TIMEOUT_ENV = "SHOAL_TORCH_SUITE_TIMEOUT"
EXTENSION_ENV = "SHOAL_TORCH_SUITE_EXTENSION"
CORE_ENV = "SHOAL_TORCH_SUITE_CORE"

GENERIC_SKIP = "Test skipped at subprocess level"
STATUSES = ("pass", "fail", "error", "timeout", "skip")


# --------------------------------------------------------------------------------------------
# Harness: runs in the worker and, through the spawn start method, in every rank.
# --------------------------------------------------------------------------------------------

_CURRENT_TEST = None


def _event(kind: str, test: str | None, text: str) -> None:
    """Append one event (a rank's skip reason, a timed-out rank's traceback) to the run's
    events file: the worker attaches them to the test's result."""
    path = os.environ.get(EVENTS_ENV)
    if not path:
        return
    line = json.dumps({"kind": kind, "test": test, "pid": os.getpid(), "text": text})
    with open(path, "a") as handle:
        handle.write(line + "\n")


def _pin_shoal_extension(path: str) -> None:
    """Load the c10d extension the orchestrator built at the start of the run, instead of
    letting each rank rebuild it from the sources it finds: every test of a run then exercises
    the same build even while the sources are being edited."""
    import importlib.util

    from shoal.dataparallel.torch import build

    spec = importlib.util.spec_from_file_location(build.EXTENSION_NAME, path)
    extension = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(extension)
    build._loaded = extension


def _install_harness():
    """Register the backend, configure torch's test tables, import the suite and define the
    test class as test_distributed_spawn.py does. Returns the class."""
    import logging

    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    backend = os.environ["BACKEND"]
    module = PLUGIN_IMPORTS.get(backend)
    if module is not None:
        if os.environ.get(CORE_ENV):
            # The pinned copy of the collective core, loaded before anything that needs it:
            # the extension's dependency on the core's soname then resolves to this copy.
            import ctypes

            ctypes.CDLL(os.environ[CORE_ENV], mode=ctypes.RTLD_GLOBAL)
        __import__(module)
        if module == "shoal.dataparallel.torch" and os.environ.get(EXTENSION_ENV):
            _pin_shoal_extension(os.environ[EXTENSION_ENV])

    from torch.testing._internal import common_distributed
    from torch.testing._internal.common_distributed import DistTestCases

    if backend not in NATIVE_BACKENDS:
        for feature in PLUGIN_FEATURES:
            DistTestCases.backend_feature.setdefault(feature, set()).add(backend)

    timeout = os.environ.get(TIMEOUT_ENV)
    if timeout:
        # One limit for every test (torch's own overrides allow up to 500 s).
        common_distributed.TIMEOUT_DEFAULT = int(timeout)
        common_distributed.TIMEOUT_OVERRIDE.clear()

    class _Events(logging.Handler):
        def emit(self, record):
            message = str(record.msg)
            if message.startswith("Process %s skipping test"):
                _event("skip", str(record.args[1]), str(record.args[2]))
            elif message.startswith("Process %s timed out with traceback"):
                _event("traceback", _CURRENT_TEST, f"rank {record.args[0]}:\n{record.args[1]}")
            elif message.startswith("Could not retrieve traceback"):
                _event("traceback", _CURRENT_TEST, record.getMessage())

    common_distributed.logger.addHandler(_Events(level=logging.INFO))

    gates = os.environ.get(GATES_ENV)
    if gates:
        os.environ["BACKEND"] = gates
    try:
        from torch.testing._internal.distributed import distributed_test
    finally:
        os.environ["BACKEND"] = backend
    distributed_test.BACKEND = backend
    from torch.testing._internal.distributed.distributed_test import (
        DistributedTest,
        TestDistBackend,
    )

    # As in torch's test/distributed/test_distributed_spawn.py.
    class TestDistBackendWithSpawn(TestDistBackend, DistributedTest._DistTestBase):
        def setUp(self):
            super().setUp()
            self._spawn_processes()
            torch.backends.cudnn.flags(enabled=True, allow_tf32=False).__enter__()

    no_init = "NoInitFile" if os.environ.get("INIT_METHOD", "env://") == "env://" else ""
    name = f"TestDistBackendWithSpawn{backend.upper()}{no_init}"
    TestDistBackendWithSpawn.__name__ = name
    TestDistBackendWithSpawn.__qualname__ = name
    globals()[name] = TestDistBackendWithSpawn
    return TestDistBackendWithSpawn


TEST_CLASS = _install_harness() if os.environ.get(HARNESS_ENV) == "1" else None


# --------------------------------------------------------------------------------------------
# Worker: the unittest parent process.
# --------------------------------------------------------------------------------------------

_EXCEPTION_LINE = re.compile(
    r"^([A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt|Timeout)\w*)(:|$)"
)
_FRAME = re.compile(r'^\s*File "([^"]+)", line (\d+), in (\S+)')


def _strip_cpp(text: str) -> str:
    """Drop the C++ stack that TORCH_SHOW_CPP_STACKTRACES appends to c10 errors."""
    out = []
    skipping = False
    for line in text.splitlines():
        if line.startswith("Exception raised from ") or line.startswith("frame #"):
            skipping = True
            continue
        if skipping and (line.startswith("frame #") or not line.strip()):
            continue
        skipping = False
        out.append(line)
    return "\n".join(out)


_NOT_MESSAGE = ("To execute this test", "This message can be suppressed", "The above exception")


def exception_summary(traceback_text: str) -> tuple[str, str]:
    """(exception, location) of the last exception in a Python traceback text: the exception
    line with up to three continuation lines, and the innermost frame in torch's suite with
    its source line."""
    lines = _strip_cpp(traceback_text).splitlines()
    start = None
    for i, line in enumerate(lines):
        if _EXCEPTION_LINE.match(line):
            start = i
    if start is None:
        return "", ""
    parts = [lines[start].strip()]
    for line in lines[start + 1 : start + 8]:
        if _FRAME.match(line) or line.startswith("Traceback") or line.startswith(_NOT_MESSAGE):
            break
        if line.strip() and len(parts) < 4:
            parts.append(line.strip())
    location = ""
    for i, line in enumerate(lines[:start]):
        match = _FRAME.match(line)
        if match and "distributed_test.py" in match.group(1):
            location = f"distributed_test.py:{match.group(2)} in {match.group(3)}"
            code = lines[i + 1].strip() if i + 1 < start else ""
            if code and not _FRAME.match(lines[i + 1]):
                location += f": {code}"
    message = " ".join(parts)
    return message[:400], location[:300]


_PROCESS_BLOCK = re.compile(r"Process (\d+) exited with error code \d+ and exception:\n")


def _rank_errors(text: str) -> list[tuple[int, str]]:
    """The per-rank tracebacks in the RuntimeError of MultiProcessTestCase._check_return_codes."""
    pieces = _PROCESS_BLOCK.split(text)
    return [(int(pieces[i]), pieces[i + 1]) for i in range(1, len(pieces) - 1, 2)]


_FATAL = re.compile(
    r"(terminate called.*|what\(\):.*|Fatal Python error:.*|Segmentation fault.*|"
    r"Aborted.*|\*\*\* Error in.*|RuntimeError:.*|[A-Za-z]+Error: .*)"
)


def classify(err_text: str, elapsed: float, timeout: int, log_slice: str) -> tuple[str, str, str]:
    """(status, one-line message, location) of a failed test from unittest's traceback text."""
    ranks = _rank_errors(err_text)
    if ranks:
        messages = []
        for rank, text in ranks:
            message, location = exception_summary(text)
            messages.append((rank, message, location))
        # Prefer a rank whose exception is not the fallout of another rank's failure.
        rank, message, location = messages[0]
        status = "fail" if message.startswith("AssertionError") else "error"
        if len(messages) > 1:
            message = f"{message} [ranks {','.join(str(r) for r, _, _ in messages)}]"
        else:
            message = f"{message} [rank {rank}]"
        return status, message, location
    if "terminated or timed out after" in err_text and elapsed >= timeout * 0.95:
        return "timeout", f"timeout: no result within {timeout} s", ""
    message, location = exception_summary(err_text)
    if message.startswith("AssertionError") and "Expected exit code" in message:
        # A rank died without a Python exception (signal, abort): say what the log says.
        fatal = [m.group(1) for m in _FATAL.finditer(log_slice)]
        exit_code = re.search(r"but got (-?\d+)", message)
        code = exit_code.group(1) if exit_code else "?"
        detail = f": {fatal[-1].strip()}" if fatal else ""
        return "error", f"rank 0 exited with code {code}{detail}"[:400], location
    if "terminated or timed out after" in message:
        return "timeout", f"timeout: no result within {timeout} s", ""
    status = "fail" if message.startswith("AssertionError") else "error"
    return status, message, location


def _timeout_location(tracebacks: list[str]) -> str:
    """The innermost line of torch's suite in a timed-out rank's faulthandler dump."""
    where = []
    for text in tracebacks:
        # faulthandler: 'File "...", line N in func' (most recent call first).
        for match in re.finditer(r'File "([^"]+)", line (\d+) in (\S+)', text):
            if "distributed_test.py" in match.group(1) or "distributed_c10d.py" in match.group(1):
                where.append(f"{Path(match.group(1)).name}:{match.group(2)} in {match.group(3)}")
                break
    return "; ".join(sorted(set(where)))


def _read_events(path: str, offset: int) -> tuple[list[dict], int]:
    try:
        with open(path) as handle:
            handle.seek(offset)
            data = handle.read()
            offset = handle.tell()
    except FileNotFoundError:
        return [], offset
    events = []
    for line in data.splitlines():
        try:
            events.append(json.loads(line))
        except ValueError:
            pass
    return events, offset


def run_worker(args) -> int:
    """Run the named tests one at a time; append a start line and a result line per test."""
    global _CURRENT_TEST
    import unittest

    cls = TEST_CLASS
    names = unittest.TestLoader().getTestCaseNames(cls)
    if args.list:
        for name in names:
            print(name)
        return 0
    wanted = [
        line.strip() for line in Path(args.tests_file).read_text().splitlines() if line.strip()
    ]
    timeout = int(os.environ[TIMEOUT_ENV])
    events_path = os.environ[EVENTS_ENV]
    events_offset = os.path.getsize(events_path) if os.path.exists(events_path) else 0
    log_path = args.log
    out = open(args.results, "a")

    def emit(record):
        out.write(json.dumps(record) + "\n")
        out.flush()

    for name in wanted:
        if name not in names:
            emit(
                {
                    "event": "result",
                    "test": name,
                    "status": "error",
                    "seconds": 0.0,
                    "message": "no such test in DistributedTest._DistTestBase",
                    "location": "",
                }
            )
            continue
        _CURRENT_TEST = name
        emit({"event": "start", "test": name})
        sys.stdout.flush()
        print(f"=== {name}", file=sys.stderr, flush=True)
        log_start = os.path.getsize(log_path) if log_path else 0
        result = unittest.TestResult()
        started = time.monotonic()
        cls(name).run(result)
        elapsed = time.monotonic() - started
        sys.stdout.flush()
        sys.stderr.flush()
        log_slice = ""
        if log_path:
            with open(log_path, errors="replace") as handle:
                handle.seek(log_start)
                log_slice = handle.read(2_000_000)
        events, events_offset = _read_events(events_path, events_offset)
        record = {
            "event": "result",
            "test": name,
            "seconds": round(elapsed, 2),
            "message": "",
            "location": "",
        }
        if result.skipped:
            reason = result.skipped[0][1]
            child = [e["text"] for e in events if e["kind"] == "skip" and e["test"] == name]
            if reason.startswith(GENERIC_SKIP) and child:
                reason = child[0]
            record.update(status="skip", message=reason)
        elif result.errors or result.failures:
            err_text = (result.errors + result.failures)[0][1]
            status, message, location = classify(err_text, elapsed, timeout, log_slice)
            if status == "timeout":
                tracebacks = [e["text"] for e in events if e["kind"] == "traceback"]
                location = _timeout_location(tracebacks)
                record["tracebacks"] = [t[-6000:] for t in tracebacks]
            record.update(
                status=status,
                message=message,
                location=location,
                detail=_strip_cpp(err_text)[-12000:],
                log_tail=log_slice[-4000:],
            )
        elif result.expectedFailures:
            record.update(status="pass", message="expected failure")
        elif result.unexpectedSuccesses:
            record.update(status="fail", message="unexpected success")
        else:
            record.update(status="pass")
        emit(record)
        _CURRENT_TEST = None
    out.close()
    return 0


# --------------------------------------------------------------------------------------------
# Orchestrator.
# --------------------------------------------------------------------------------------------


def _deps_path() -> str:
    """Test-only packages torch's suite imports (expecttest), installed by `make torch-suite`
    outside the project's venv packages (see the Makefile)."""
    return os.environ.get("TORCH_SUITE_DEPS", str(REPO / ".venv" / "torch-suite-deps"))


def _die(message: str) -> None:
    """A harness failure (not a test failure): exit status 2."""
    print(f"run_suite.py: {message}", file=sys.stderr, flush=True)
    raise SystemExit(2)


def _worker_env(args, temp_dir: Path, events: Path, run_id: str) -> dict:
    env = dict(os.environ)
    deps = _deps_path()
    env["PYTHONPATH"] = os.pathsep.join(p for p in (deps, env.get("PYTHONPATH", "")) if p)
    env[HARNESS_ENV] = "1"
    env[EVENTS_ENV] = str(events)
    env[TIMEOUT_ENV] = str(args.timeout)
    env["DISTRIBUTED_TESTS_DEFAULT_TIMEOUT"] = str(args.timeout)
    env["BACKEND"] = args.backend
    env["WORLD_SIZE"] = str(args.world_size)
    env["TEMP_DIR"] = str(temp_dir)
    if args.init_method == "file":
        env["INIT_METHOD"] = f"file://{temp_dir}/shared_init_file"
    else:
        env["INIT_METHOD"] = "env://"
    if args.gates_as:
        env[GATES_ENV] = args.gates_as
    else:
        env.pop(GATES_ENV, None)
    # Shoal's shared-memory segments carry the job id: name them after this run.
    env.setdefault("SHOAL_JOB_ID", f"torchsuite-{run_id}")
    return env


def _list_tests(args, env) -> list[str]:
    proc = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), "--worker", "--list"],
        env=env,
        capture_output=True,
        text=True,
        cwd=str(REPO),
    )
    if proc.returncode != 0:
        sys.stderr.write(proc.stdout + proc.stderr)
        _die(f"could not import torch's suite for backend {args.backend}")
    return [line.strip() for line in proc.stdout.splitlines() if line.startswith("test_")]


def _select(names: list[str], patterns: list[str]) -> list[str]:
    if not patterns:
        return names
    selected = []
    for name in names:
        for pattern in patterns:
            if any(ch in pattern for ch in "*?["):
                import fnmatch

                if fnmatch.fnmatch(name, pattern):
                    selected.append(name)
                    break
            elif pattern in name:
                selected.append(name)
                break
    return selected


def _prewarm(env, pin_dir: Path | None) -> str:
    """Build (or load) the backend's extension once, so no rank compiles inside a test. With
    ``pin_dir``, the extension and the collective core library are copied there and every rank
    of the run loads these copies (see _install_harness): the sources and the core may be
    rebuilt while a run of tens of minutes goes on, and one run must test one build."""
    module = PLUGIN_IMPORTS.get(env["BACKEND"])
    if module != "shoal.dataparallel.torch":
        return ""
    code = "from shoal.dataparallel.torch.build import load_extension; print(load_extension().__file__)"
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.stderr.write(proc.stdout + proc.stderr)
        _die("could not build or load the shoal torch extension")
    path = proc.stdout.strip().splitlines()[-1]
    if pin_dir is not None:
        pin_dir.mkdir(parents=True, exist_ok=True)
        core = _core_library()
        if core is not None:
            env[CORE_ENV] = str(shutil.copy2(core, pin_dir / core.name))
        env[EXTENSION_ENV] = str(shutil.copy2(path, pin_dir / Path(path).name))
    print(f"# extension: {path}{' (pinned for the run)' if pin_dir else ''}", flush=True)
    return path


def _core_library() -> Path | None:
    libraries = sorted((REPO / "runtime" / "dataparallel").glob("libshoal_core*.so"))
    return libraries[0] if libraries else None


def _core_digest() -> str:
    """A digest of the collective core library in the tree."""
    import hashlib

    library = _core_library()
    return hashlib.sha256(library.read_bytes()).hexdigest()[:16] if library else ""


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def run_tests(args) -> int:
    run_id = f"{args.backend}-ws{args.world_size}-{os.getpid()}"
    work = Path(tempfile.mkdtemp(prefix=f"torch-suite-{run_id}-"))
    temp_dir = work / "temp"
    (temp_dir / "barrier").mkdir(parents=True)
    (temp_dir / "test_dir").mkdir()
    events = work / "events.jsonl"
    results_path = work / "results.jsonl"
    log_path = Path(args.log) if args.log else work / "worker.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    if not (args.resume and log_path.exists()):
        log_path.write_text("")
    env = _worker_env(args, temp_dir, events, run_id)

    git_state = _git_state()
    extension = _prewarm(env, None if args.no_pin else work / "pinned")
    core_before = _core_digest()
    names = _list_tests(args, env)
    if args.tests_from:
        extra = [t.strip() for t in Path(args.tests_from).read_text().split() if t.strip()]
        names = [n for n in names if n in set(extra)]
    selected = _select(names, args.k)
    gates = f", gates as {args.gates_as}" if args.gates_as else ""
    print(
        f"# {len(selected)} of {len(names)} tests, backend {args.backend}, world size "
        f"{args.world_size}, init {args.init_method}, timeout {args.timeout} s{gates}",
        flush=True,
    )

    records: dict[str, dict] = {}
    remaining = list(selected)
    grace = args.grace
    started_at = time.time()
    # Each result also goes to a progress file beside --json, removed once the run is complete:
    # with --resume, an interrupted run of the same configuration goes on where it stopped.
    config = {
        "backend": args.backend,
        "world_size": args.world_size,
        "init_method": args.init_method,
        "timeout": args.timeout,
        "gates_as": args.gates_as,
    }
    progress = Path(args.json + ".progress") if args.json else None
    resumed_seconds = 0.0
    if progress is not None and args.resume and progress.exists():
        lines = progress.read_text().splitlines()
        if lines and json.loads(lines[0]) == config:
            for line in lines[1:]:
                try:
                    item = json.loads(line)
                except ValueError:
                    continue
                if item["test"] in remaining:
                    records[item["test"]] = item
                    remaining.remove(item["test"])
                    resumed_seconds += item["seconds"]
            print(f"# resumed: {len(records)} results from {progress}", flush=True)
    if progress is not None:
        progress.parent.mkdir(parents=True, exist_ok=True)
        with open(progress, "w") as handle:
            handle.write(json.dumps(config) + "\n")
            for item in records.values():
                handle.write(json.dumps(item) + "\n")

    def record_result(item: dict) -> None:
        records[item["test"]] = item
        if item["test"] in remaining:
            remaining.remove(item["test"])
        if progress is not None:
            with open(progress, "a") as handle:
                handle.write(json.dumps(item) + "\n")
        _print_record(item, len(records), len(selected))

    results_offset = 0
    while remaining:
        tests_file = work / "tests.txt"
        tests_file.write_text("\n".join(remaining) + "\n")
        with open(log_path, "ab") as log:
            proc = subprocess.Popen(
                [
                    sys.executable,
                    str(Path(__file__).resolve()),
                    "--worker",
                    "--tests-file",
                    str(tests_file),
                    "--results",
                    str(results_path),
                    "--log",
                    str(log_path),
                ],
                env=env,
                stdout=log,
                stderr=log,
                stdin=subprocess.DEVNULL,
                cwd=str(REPO),
                start_new_session=True,
            )
        current, current_since = None, time.monotonic()
        hard_killed = False
        while True:
            finished = proc.poll() is not None
            try:
                with open(results_path) as handle:
                    handle.seek(results_offset)
                    chunk = handle.read()
            except FileNotFoundError:
                chunk = ""
            complete = chunk[: chunk.rfind("\n") + 1]
            results_offset += len(complete.encode())
            for line in complete.splitlines():
                item = json.loads(line)
                if item["event"] == "start":
                    current, current_since = item["test"], time.monotonic()
                    continue
                item.pop("event")
                current = None
                record_result(item)
            if finished:
                break
            if current is not None and time.monotonic() - current_since > args.timeout + grace:
                _kill_group(proc)
                hard_killed = True
                break
            time.sleep(0.5)
        if current is not None and current in remaining:
            tail = _tail(log_path, 4000)
            if hard_killed:
                message = (
                    f"timeout: the harness did not return within {args.timeout} + "
                    f"{grace} s; worker killed"
                )
                status = "timeout"
            else:
                message = f"worker exited with code {proc.returncode} during the test"
                fatal = [m.group(1) for m in _FATAL.finditer(tail)]
                if fatal:
                    message += f": {fatal[-1].strip()}"
                status = "error"
            item = {
                "test": current,
                "status": status,
                "seconds": round(time.monotonic() - current_since, 2),
                "message": message[:400],
                "location": "",
                "log_tail": tail,
            }
            record_result(item)
        elif proc.returncode not in (0, None) and remaining:
            sys.stderr.write(_tail(log_path, 4000))
            _die(f"worker failed (exit {proc.returncode}) before starting a test")
    wall = time.time() - started_at + resumed_seconds

    ordered = [records[n] for n in selected if n in records]
    meta = {
        "backend": args.backend,
        "world_size": args.world_size,
        "init_method": args.init_method,
        "timeout": args.timeout,
        "gates_as": args.gates_as,
        "patterns": args.k,
        "wall_seconds": round(wall, 1),
        "resumed_seconds": round(resumed_seconds, 1),
        "started": time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(started_at)),
        "torch": _torch_version(env),
        "git": git_state,
        "extension": extension,
        "extension_pinned": bool(extension) and not args.no_pin,
        "core_digest": core_before,
    }
    if extension and _core_digest() != core_before:
        meta["core_digest_at_end"] = _core_digest()
        pinned = " (this run used its pinned copy)" if not args.no_pin else ""
        print(f"# note: the collective core library was rebuilt during the run{pinned}", flush=True)
    counts = Counter(r["status"] for r in ordered)
    meta["counts"] = {s: counts.get(s, 0) for s in STATUSES}
    _print_summary(ordered, meta)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps({"meta": meta, "tests": ordered}, indent=1) + "\n")
        if progress is not None:
            progress.unlink(missing_ok=True)
    if args.junit:
        _write_junit(Path(args.junit), ordered, meta)
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    _cleanup_shm(env.get("SHOAL_JOB_ID", ""))
    return (
        0 if counts.get("fail", 0) + counts.get("error", 0) + counts.get("timeout", 0) == 0 else 1
    )


def _cleanup_shm(job_id: str) -> None:
    """Remove shared-memory segments left by ranks this run killed (named after its job id)."""
    if not job_id.startswith("torchsuite-"):
        return
    shm = Path("/dev/shm")
    if shm.is_dir():
        for entry in shm.glob(f"shoal-{job_id}-*"):
            try:
                entry.unlink()
            except OSError:
                pass


def _tail(path: Path, size: int) -> str:
    with open(path, "rb") as handle:
        handle.seek(0, os.SEEK_END)
        handle.seek(max(0, handle.tell() - size))
        return handle.read().decode(errors="replace")


def _torch_version(env) -> str:
    proc = subprocess.run(
        [sys.executable, "-c", "import torch; print(torch.__version__)"],
        env=env,
        capture_output=True,
        text=True,
    )
    return proc.stdout.strip()


def _git_state() -> str:
    try:
        head = subprocess.run(
            ["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(REPO), "status", "--porcelain", "runtime"],
            capture_output=True,
            text=True,
        ).stdout.strip()
    except OSError:
        return ""
    return head + (" + uncommitted changes in runtime/" if dirty else "")


def _print_record(item: dict, done: int, total: int) -> None:
    status = item["status"].upper()
    line = f"[{done}/{total}] {status:7} {item['test']} ({item['seconds']:.1f} s)"
    if item["status"] != "pass" and item.get("message"):
        line += f": {item['message'][:240]}"
    print(line, flush=True)


def _print_summary(records: list[dict], meta: dict) -> None:
    print()
    print(
        f"# backend {meta['backend']}, world size {meta['world_size']}: "
        + ", ".join(f"{meta['counts'][s]} {s}" for s in STATUSES)
        + f" ({len(records)} tests, {meta['wall_seconds']:.0f} s)"
    )
    for record in records:
        if record["status"] in ("fail", "error", "timeout"):
            print(f"  {record['status']:7} {record['test']}: {record['message'][:300]}")


def _write_junit(path: Path, records: list[dict], meta: dict) -> None:
    from xml.etree import ElementTree as ET

    counts = meta["counts"]
    suite = ET.Element(
        "testsuite",
        {
            "name": f"torch-suite-{meta['backend']}-ws{meta['world_size']}",
            "tests": str(len(records)),
            "failures": str(counts["fail"]),
            "errors": str(counts["error"] + counts["timeout"]),
            "skipped": str(counts["skip"]),
            "time": str(meta["wall_seconds"]),
        },
    )
    classname = f"DistributedTest.{meta['backend']}.ws{meta['world_size']}"
    for record in records:
        case = ET.SubElement(
            suite,
            "testcase",
            {"classname": classname, "name": record["test"], "time": str(record["seconds"])},
        )
        if record["status"] == "skip":
            ET.SubElement(case, "skipped", {"message": record["message"]})
        elif record["status"] in ("fail", "error", "timeout"):
            tag = "failure" if record["status"] == "fail" else "error"
            node = ET.SubElement(
                case, tag, {"message": record["message"], "type": record["status"]}
            )
            node.text = record.get("detail") or record.get("log_tail", "")
    path.parent.mkdir(parents=True, exist_ok=True)
    ET.ElementTree(suite).write(path, encoding="utf-8", xml_declaration=True)


# --------------------------------------------------------------------------------------------
# Comparison.
# --------------------------------------------------------------------------------------------

_CAUSES = (
    (
        re.compile(r"does not support (send|recv|isend|irecv|recvAnysource|batch_isend_irecv)\b"),
        "point-to-point not implemented (send/recv)",
    ),
    (re.compile(r"unsupported dtype (\w+)"), r"unsupported dtype \1"),
    (re.compile(r"does not support (\w+)"), r"op not implemented: \1"),
    (re.compile(r"^timeout"), "timeout (hang)"),
)


def cause_of(record: dict) -> str:
    """A short, stable cause for grouping: known patterns first, else the message with numbers
    and rank lists normalised."""
    message = record.get("message", "")
    if record.get("status") == "skip":
        return f"skipped: {message}"
    for pattern, label in _CAUSES:
        match = pattern.search(message)
        if match:
            return match.expand(label)
    message = re.sub(r" \[ranks? [\d,]+\]$", "", message)
    message = re.sub(r"0x[0-9a-f]+", "0x?", message)
    message = re.sub(r"\d+(\.\d+)?", "N", message)
    return message[:200]


def compare(args) -> int:
    runs = []
    for path in args.results:
        data = json.loads(Path(path).read_text())
        if args.reclassify:
            for record in data["tests"]:
                if record["status"] in ("fail", "error") and record.get("detail"):
                    status, message, location = classify(
                        record["detail"],
                        record["seconds"],
                        data["meta"]["timeout"],
                        record.get("log_tail", ""),
                    )
                    record.update(status=status, message=message, location=location)
        runs.append(data)
    by_size = defaultdict(dict)
    for data in runs:
        meta = data["meta"]
        label = meta["backend"] + (
            f" (gates as {meta['gates_as']})" if meta.get("gates_as") else ""
        )
        by_size[meta["world_size"]][label] = {r["test"]: r for r in data["tests"]}
    lines = ["# torch DistributedTest: backends compared", ""]
    lines.append("| world size | backend | pass | fail | error | timeout | skip | wall (s) |")
    lines.append("|---|---|---|---|---|---|---|---|")
    for data in runs:
        meta = data["meta"]
        c = meta["counts"]
        lines.append(
            f"| {meta['world_size']} | {meta['backend']}"
            f"{' (gates as ' + meta['gates_as'] + ')' if meta.get('gates_as') else ''} | "
            f"{c['pass']} | {c['fail']} | {c['error']} | {c['timeout']} | {c['skip']} | "
            f"{meta['wall_seconds']:.0f} |"
        )
    lines.append("")
    baseline = args.baseline
    for size in sorted(by_size):
        backends = by_size[size]
        if baseline not in backends:
            continue
        base = backends[baseline]
        for other, tests in sorted(backends.items()):
            if other == baseline:
                continue
            regressions = [
                (name, tests[name])
                for name, record in base.items()
                if record["status"] == "pass" and name in tests and tests[name]["status"] != "pass"
            ]
            lines.append(
                f"## World size {size}: pass on {baseline}, not on {other} ({len(regressions)})"
            )
            lines.append("")
            if not regressions:
                lines.append("None.")
                lines.append("")
                continue
            lines.append("| test | status | cause | message |")
            lines.append("|---|---|---|---|")
            for name, record in sorted(regressions):
                message = record.get("message", "").replace("|", "\\|")
                if record.get("location"):
                    message += f" (at {record['location']})"
                lines.append(
                    f"| {name} | {record['status']} | {cause_of(record)} | {message[:300]} |"
                )
            lines.append("")
            groups = defaultdict(list)
            for name, record in regressions:
                groups[cause_of(record)].append(name)
            lines.append(f"### By cause ({other}, world size {size})")
            lines.append("")
            for cause, names in sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[0])):
                lines.append(f"- **{cause}** ({len(names)}): {', '.join(sorted(names))}")
            lines.append("")
    text = "\n".join(lines) + "\n"
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text)
    print(text)
    return 0


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "compare":
        parser = argparse.ArgumentParser(prog="run_suite.py compare")
        parser.add_argument("results", nargs="+", help="JSON files written by --json")
        parser.add_argument("--baseline", default="gloo")
        parser.add_argument("--out", help="write the markdown table here too")
        parser.add_argument(
            "--reclassify",
            action="store_true",
            help="derive each failure's message again from its stored traceback",
        )
        return compare(parser.parse_args(argv[1:]))

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", default=os.environ.get("BACKEND", "shoal"))
    parser.add_argument("--world-size", type=int, default=int(os.environ.get("WORLD_SIZE", "2")))
    parser.add_argument(
        "-k",
        action="append",
        default=[],
        help="run tests whose name contains PATTERN (or matches a glob); repeatable",
    )
    parser.add_argument("--tests-from", help="a file of test names to run (with -k: both)")
    parser.add_argument(
        "--timeout",
        type=int,
        default=300,
        help="seconds per test before torch's harness kills the ranks",
    )
    parser.add_argument(
        "--grace", type=int, default=90, help="extra seconds before the worker itself is killed"
    )
    parser.add_argument(
        "--init-method",
        choices=("file", "env"),
        default="file",
        help="INIT_METHOD the suite sees (file://TEMP_DIR/shared_init_file)",
    )
    parser.add_argument("--gates-as", help="evaluate the suite's backend gates as this backend")
    parser.add_argument(
        "--no-pin",
        action="store_true",
        help="let each rank load the shoal extension and core as they are when it starts "
        "(default: every rank loads copies of the builds made at the start of the run)",
    )
    parser.add_argument("--json", help="write every result here")
    parser.add_argument(
        "--resume",
        action="store_true",
        help="keep the results an interrupted run with the same --json and settings recorded",
    )
    parser.add_argument("--junit", help="write a JUnit XML report here")
    parser.add_argument("--log", help="the ranks' output (default: a temporary file)")
    parser.add_argument("--keep", action="store_true", help="keep the run's temporary directory")
    parser.add_argument("--list", action="store_true", help="list the suite's tests and exit")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--tests-file", help=argparse.SUPPRESS)
    parser.add_argument("--results", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        return run_worker(args)
    if args.list:
        work = Path(tempfile.mkdtemp(prefix="torch-suite-list-"))
        (work / "barrier").mkdir()
        env = _worker_env(args, work, work / "events.jsonl", "list")
        for name in _select(_list_tests(args, env), args.k):
            print(name)
        shutil.rmtree(work, ignore_errors=True)
        return 0
    return run_tests(args)


if __name__ == "__main__":
    sys.exit(main())
