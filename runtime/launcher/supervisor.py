"""Running the job's top process (mpirun, torchrun or the script) and everything below it.

:class:`Supervisor` starts the command in its own session, streams its output with every
Open MPI tag ``[1,R]<stdout>:`` rewritten to name the rank's host
(``[1,mpirank:R,algo-2]<stdout>:``), rebuilds each rank's lines from the chunks that
Open MPI tags (:class:`RankLines`), keeps the last lines of each rank, and notices the
first rank failure (``shoal-rank``'s ``SHOAL_RANK_FAILED`` line, else mpirun's own
abort messages). :meth:`Supervisor.stop` forwards SIGTERM and escalates to SIGKILL after
a grace period; when the top process is gone, any process left below the launcher is
ended too (the launcher is a child subreaper, so orphans stay in its psutil tree).
"""

from __future__ import annotations

import codecs
import collections
import json
import logging
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import NamedTuple, Optional

import attrs
import psutil
from shoal.launcher.rank import FAILURE_MARKER
from shoal.launcher.tracebacks import relays_a_failure

log = logging.getLogger(__name__)

TAIL_LINES = 30
# Open MPI's --tag-output tag; split() yields text, job, rank, stream, text, ...
_TAG = re.compile(r"\[(\d+),(\d+)\]<(stdout|stderr)>:")
_ABORT = re.compile(r"MPI_ABORT was invoked on rank (\d+)")
_SIGNALLED = re.compile(
    r"process rank (\d+) with PID \d+ on node (\S+) exited on signal (\d+)(?: \((\w+)\))?"
)
_PROC_NAME = re.compile(r"Process name:\s+\[\[\d+,\d+\],(\d+)\]")
_EXIT_CODE = re.compile(r"Exit code:\s+(\d+)")
_PR_SET_CHILD_SUBREAPER = 36
# mpirun could not start its daemons: nothing of the job ran.
_DAEMON_FAILURE = re.compile(
    r"ORTE was unable to reliably start one or more daemons|orte_init failed|"
    r"ORTE does not know how to route a message"
)


CAUSE_WINDOW = 5.0  # seconds in which a signalled rank displaces an earlier exit as the cause


@attrs.frozen
class RankFailure:
    """The first rank that failed: who, where, and how it ended."""

    rank: int | None
    host: str | None = None
    exit_code: int | None = None
    signal: str | None = None


@attrs.frozen
class Outcome:
    returncode: int
    command: tuple[str, ...] = attrs.field(converter=tuple)
    failure: RankFailure | None = None
    rank_tails: dict = attrs.field(factory=dict)
    tail: tuple[str, ...] = attrs.field(default=(), converter=tuple)
    stopped_by: str | None = None
    daemons_failed: bool = False
    # A process the job depends on (a parameter server) that ended while it ran.
    watched_exit: str | None = None
    # Another host of the job stopped answering (:mod:`shoal.launcher.heartbeat`): why.
    host_lost: str | None = None

    @property
    def never_started(self) -> bool:
        """mpirun failed to start its daemons and no rank printed anything."""
        return self.daemons_failed and not self.rank_tails

    @property
    def ok(self) -> bool:
        return self.returncode == 0


def become_subreaper() -> bool:
    """Make orphaned descendants re-parent to this process (Linux)."""
    try:
        import ctypes

        return ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 1) == 0
    except (OSError, AttributeError):
        return False


def end_processes(procs: Sequence[psutil.Process], grace: float) -> None:
    """SIGTERM, wait up to ``grace`` seconds, SIGKILL the rest."""
    for p in procs:
        try:
            p.terminate()
        except psutil.Error:
            pass
    _, alive = psutil.wait_procs(procs, timeout=grace)
    for p in alive:
        try:
            p.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(alive, timeout=5)


def end_descendants(grace: float = 5.0, keep: Sequence[int] = ()) -> None:
    """End every process below this one except ``keep`` and their descendants."""
    me = psutil.Process()
    kept = set(keep)
    for pid in list(kept):
        try:
            kept.update(c.pid for c in psutil.Process(pid).children(recursive=True))
        except psutil.Error:
            pass
    procs = [p for p in me.children(recursive=True) if p.pid not in kept]
    if procs:
        end_processes(procs, grace)


class Tag(NamedTuple):
    """Whose output a line is: Open MPI's ``[job,rank]<stream>:``."""

    job: str
    rank: int
    stream: str


# A line and its tag (None: untagged output, such as mpirun's own messages).
Line = tuple[Optional[Tag], str]


def _pieces(physical: str) -> list[Line]:
    """The tagged pieces of one physical line; text before the first tag is untagged,
    since a physical line begins at a line start."""
    parts = _TAG.split(physical)
    tagged = [(Tag(parts[i], int(parts[i + 1]), parts[i + 2]), parts[i + 3])
              for i in range(1, len(parts), 4)]  # fmt: skip
    return ([(None, parts[0])] if parts[0] or not tagged else []) + tagged


class RankLines:
    """Rebuilds each rank's lines from one pipe of the top process's output.

    Open MPI tags each chunk a rank writes, not each line, and chunks of different ranks
    interleave: Python writes a traceback's last line in four writes (``RuntimeError``,
    ``: ``, the message, the newline), so another rank's line can land inside it. So the
    text of each tag is kept apart until a newline ends it; untagged text is one source.
    """

    def __init__(self) -> None:
        # Chunks can end inside a UTF-8 character.
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")
        self._rest = ""  # the pipe's unfinished physical line
        self._partial: dict[Tag | None, str] = {}

    def feed(self, data: bytes) -> list[Line]:
        """The lines that ``data`` ends, in the order of their newlines."""
        *whole, self._rest = (self._rest + self._decoder.decode(data)).split("\n")
        # A physical line's newline ends the line of its last piece's tag.
        return [self._complete(*self._keep_all_but_last(physical)) for physical in whole]

    def close(self) -> list[Line]:
        """At EOF: every line still waiting for its newline."""
        self._keep(*self._keep_all_but_last(self._rest + self._decoder.decode(b"", True)))
        self._rest = ""
        return [self._complete(tag, "") for tag in list(self._partial)]

    def _keep_all_but_last(self, physical: str) -> Line:
        *pieces, last = _pieces(physical)
        for tag, piece in pieces:
            self._keep(tag, piece)
        return last

    def _keep(self, tag: Tag | None, piece: str) -> None:
        if piece:
            self._partial[tag] = self._partial.get(tag, "") + piece

    def _complete(self, tag: Tag | None, piece: str) -> Line:
        line = self._partial.pop(tag, "") + piece
        return tag, line[:-1] if line.endswith("\r") else line


class _Stream(threading.Thread):
    def __init__(self, supervisor: Supervisor, pipe, out) -> None:
        super().__init__(daemon=True)
        self.supervisor, self.pipe, self.out = supervisor, pipe, out

    def run(self) -> None:
        # Chunks as they come: RankLines, not the pipe, decides where lines end.
        lines = RankLines()
        for data in iter(lambda: self.pipe.read1(65536), b""):
            self._print(lines.feed(data))
        self._print(lines.close())

    def _print(self, lines: list[Line]) -> None:
        for tag, text in lines:
            self.out.write(self.supervisor.handle_line(text, tag) + "\n")
        self.out.flush()


class Supervisor:
    """One supervised top process; see the module docstring."""

    def __init__(
        self,
        argv: Sequence[str],
        env: Mapping[str, str],
        cwd: str,
        *,
        hosts: Sequence[str] = (),
        ranks_per_host: int = 1,
        grace: float = 10.0,
        failure_timeout: float = 15.0,
        keep: Sequence[int] = (),
        watch: Mapping[str, subprocess.Popen] | None = None,
        host_lost: Callable[[], str | None] | None = None,
    ) -> None:
        self.argv = list(argv)
        # Processes the job needs running until it ends: if one ends first, the job stops.
        self.watch = dict(watch or {})
        self._watched_exit: str | None = None
        # Why another host of the job is lost, once it is (polled): the job stops at once.
        self.host_lost = host_lost
        self._host_lost: str | None = None
        self.env, self.cwd = dict(env), cwd
        self.hosts, self.ranks_per_host = list(hosts), max(1, ranks_per_host)
        self.grace, self.failure_timeout, self.keep = grace, failure_timeout, tuple(keep)
        self._lock = threading.Lock()
        self._tails: dict[int, collections.deque] = {}
        self._tail: collections.deque = collections.deque(maxlen=TAIL_LINES)
        self._failure: RankFailure | None = None
        self._failure_at: float | None = None
        self._failure_relays = False  # the recorded failure raised another rank's failure
        self._pending_proc: int | None = None
        self._daemons_failed = False
        self._stop_signal: int | None = None
        self._stop_at: float | None = None
        self._kill_after = grace  # seconds from the stop to SIGKILL
        self.proc: subprocess.Popen | None = None

    def host_of(self, rank: int) -> str | None:
        index = rank // self.ranks_per_host
        return self.hosts[index] if 0 <= index < len(self.hosts) else None

    def handle_line(self, text: str, tag: Tag | None = None) -> str:
        """Record one rebuilt line (a rank's when tagged); return it as printed."""
        rank = tag.rank if tag else None
        with self._lock:
            if rank is not None:
                self._tails.setdefault(rank, collections.deque(maxlen=TAIL_LINES)).append(text)
            self._tail.append(text)
            self._scan(text, rank)
        if tag is None:
            return text
        host = self.host_of(rank) or "?"
        return f"[{tag.job},mpirank:{rank},{host}]<{tag.stream}>:{text}"

    def _record(self, failure: RankFailure) -> None:
        now = time.monotonic()
        relays = failure.rank is not None and relays_a_failure(self._tails.get(failure.rank, ()))
        if self._failure is None:
            self._failure, self._failure_at, self._failure_relays = failure, now, relays
        elif (self._failure_at is not None and now - self._failure_at <= CAUSE_WINDOW
              and self._displaces(failure, relays)):
            self._failure, self._failure_relays = failure, relays

    def _displaces(self, failure: RankFailure, relays: bool) -> bool:
        """Whether a failure seen just after the recorded one is the cause instead. A rank
        killed by a signal is the cause; a rank that exited with an error just before it is
        its peer noticing the loss (PeerLostError), reported over a shorter path (a local
        rank's line arrives before a remote host's). Likewise a rank that raised its own
        error is the cause of a rank that only relayed it (PeerLostError, SMPPeerError)."""
        if failure.signal and not self._failure.signal:
            return True
        return self._failure_relays and not relays and not self._failure.signal

    def _scan(self, text: str, rank: int | None) -> None:
        if rank is None and _DAEMON_FAILURE.search(text):
            self._daemons_failed = True
        stripped = text.strip()
        if stripped.startswith(FAILURE_MARKER):
            try:
                rec = json.loads(stripped[len(FAILURE_MARKER):])
                self._record(RankFailure(rec.get("rank"), rec.get("host"),
                                         rec.get("exit_code"), rec.get("signal")))  # fmt: skip
            except ValueError:
                pass
            return
        if m := _ABORT.search(text):
            r = int(m.group(1))
            self._record(RankFailure(r, self.host_of(r), None, None))
        elif m := _SIGNALLED.search(text):
            r, sig = int(m.group(1)), int(m.group(3))
            name = signal.Signals(sig).name if sig in signal.valid_signals() else str(sig)
            self._record(RankFailure(r, m.group(2), 128 + sig, name))
        elif m := _PROC_NAME.search(text):
            self._pending_proc = int(m.group(1))
        elif (m := _EXIT_CODE.search(text)) and self._pending_proc is not None:
            r = self._pending_proc
            self._record(RankFailure(r, self.host_of(r), int(m.group(1)), None))

    def start(self) -> None:
        log.info("running: %s", " ".join(self._printable()))
        self.proc = subprocess.Popen(
            self.argv, env=self.env, cwd=self.cwd, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, start_new_session=True,
        )  # fmt: skip
        self._streams = [_Stream(self, self.proc.stdout, sys.stdout),
                         _Stream(self, self.proc.stderr, sys.stderr)]  # fmt: skip
        for s in self._streams:
            s.start()

    def _printable(self) -> list[str]:
        from shoal.launcher.redaction import redact_argv

        return redact_argv(self.argv)

    def stop(self, signum: int = signal.SIGTERM) -> None:
        """Forward ``signum`` to the top process; SIGKILL everything after the grace."""
        if self._stop_signal is None:
            self._stop_signal, self._stop_at = signum, time.monotonic()
        if self.proc and self.proc.poll() is None:
            try:
                self.proc.send_signal(signum)
            except ProcessLookupError:
                pass

    def _kill_tree(self) -> None:
        try:
            procs = [psutil.Process(self.proc.pid)]
            procs += procs[0].children(recursive=True)
        except psutil.Error:
            procs = []
        for p in procs:
            try:
                p.kill()
            except psutil.Error:
                pass

    def _check_watched(self) -> None:
        if self._watched_exit is not None:
            return
        for name, proc in self.watch.items():
            code = proc.poll()
            if code is not None:
                self._watched_exit = f"The {name} (pid {proc.pid}) exited with code {code}."
                log.error("%s Stopping the job.", self._watched_exit)
                self.stop(signal.SIGTERM)
                return

    def _check_hosts(self) -> None:
        if self._host_lost is not None or self.host_lost is None:
            return
        self._host_lost = self.host_lost()
        if self._host_lost is not None:
            log.error("another host is lost; stopping the job")
            # mpirun may wait on the lost host's daemon: the failure's grace, not the stop's
            self._kill_after = min(self.grace, self.failure_timeout)
            self.stop(signal.SIGTERM)

    def _watchdog(self) -> None:
        self._check_watched()
        self._check_hosts()
        now = time.monotonic()
        if self._stop_at is not None and now - self._stop_at > self._kill_after:
            self._kill_tree()
        elif self._failure_at is not None and now - self._failure_at > self.failure_timeout:
            log.warning("a rank failed and the job did not end; stopping it")
            self._failure_at = None
            self.stop(signal.SIGTERM)

    def wait(self) -> Outcome:
        assert self.proc is not None, "start() first"
        while True:
            try:
                code = self.proc.wait(timeout=0.2)
                break
            except subprocess.TimeoutExpired:
                self._watchdog()
        end_descendants(grace=min(self.grace, 5.0), keep=self.keep)
        for s in self._streams:
            s.join(timeout=60)  # the rest of the output, up to EOF
        return self.outcome(code)

    def outcome(self, code: int) -> Outcome:
        """What the output recorded so far says, for the top process's exit ``code``."""
        with self._lock:
            tails = {r: tuple(t) for r, t in self._tails.items()}
            stopped = signal.Signals(self._stop_signal).name if self._stop_signal else None
            return Outcome(code, self.argv, self._failure, tails, tuple(self._tail), stopped,
                           self._daemons_failed, self._watched_exit, self._host_lost)

    def run(self) -> Outcome:
        self.start()
        return self.wait()


def install_stop_handlers(supervisor: Supervisor) -> None:
    """Route SIGTERM/SIGINT/SIGHUP of the launcher to ``supervisor.stop``."""

    def handler(signum, frame):
        log.warning("received %s; stopping the job", signal.Signals(signum).name)
        supervisor.stop(signal.SIGTERM)

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, handler)


def exit_status(outcome: Outcome) -> int:
    """The launcher's exit code for an outcome (never 0 for a failed job)."""
    code = outcome.returncode
    if code == 0:
        return 0
    return 128 - code if code < 0 else min(code, 255) or 1
