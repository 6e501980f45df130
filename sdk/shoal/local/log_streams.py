"""Each simulated host's output as a log stream, the way CloudWatch Logs keeps a SageMaker job's:
group ``/aws/sagemaker/TrainingJobs``, stream ``<job>/algo-N-<epoch seconds of its first
line>``, every line an event with a millisecond timestamp.

The supervisor appends ``<ms>\\t<line>`` to ``<job>/streams/<host>.log`` as the host prints
(``StreamWriter``); readers (``shoal serve``'s Logs API) take the events from there
(``read_events``), so a job that outlives the reader, or a reader that restarts, loses nothing.
Only the hosts' own output goes there, as on SageMaker; the supervisor's ``[local]`` lines stay
in the job's ``logs.txt``.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import attrs

LOG_GROUP = "/aws/sagemaker/TrainingJobs"
STREAMS_DIR = "streams"


@attrs.frozen
class Event:
    index: int        # its place in the stream, from 0
    timestamp: int    # ms since the epoch
    message: str


def stream_file(job_dir: Path, host: str) -> Path:
    return Path(job_dir) / STREAMS_DIR / f"{host}.log"


def event_text(host: str, line: str) -> str:
    """A host line as its stream's event reads it."""
    text = line.replace("\r", "").replace("\t", "    ")
    return text.removeprefix(f"[{host}] ")  # the stream is the host's: no tag needed


class StreamWriter:
    """Appends host lines to their stream files (thread-safe: one relay thread per host)."""

    def __init__(self, job_dir: Path):
        self.job_dir = Path(job_dir)
        self.lock = threading.Lock()
        self.files: dict[str, object] = {}

    def write(self, host: str, line: str, at: float | None = None) -> None:
        ms = int((time.time() if at is None else at) * 1000)
        text = event_text(host, line)
        with self.lock:
            handle = self.files.get(host)
            if handle is None:
                path = stream_file(self.job_dir, host)
                path.parent.mkdir(parents=True, exist_ok=True)
                handle = self.files[host] = open(path, "a", encoding="utf-8", buffering=1)
            handle.write(f"{ms}\t{text}\n")

    def close(self) -> None:
        with self.lock:
            for handle in self.files.values():
                handle.close()
            self.files.clear()


def parse(raw: str, start_index: int = 0) -> list[Event]:
    """Complete lines of a stream file (a last line without its newline is still being written)."""
    events = []
    for n, line in enumerate(raw.split("\n")[:-1]):
        stamp, _, message = line.partition("\t")
        try:
            events.append(Event(start_index + n, int(stamp), message))
        except ValueError:
            events.append(Event(start_index + n, 0, line))  # never expected: kept, not dropped
    return events


class StreamCache:
    """A stream file's events, read incrementally (files only grow)."""

    def __init__(self):
        self.lock = threading.Lock()
        self.cache: dict[Path, tuple[int, list[Event]]] = {}

    def events(self, path: Path) -> list[Event]:
        with self.lock:
            offset, events = self.cache.get(path, (0, []))
            try:
                with open(path, "rb") as handle:
                    handle.seek(offset)
                    chunk = handle.read()
            except FileNotFoundError:
                return []
            complete = chunk[: chunk.rfind(b"\n") + 1]
            if complete:
                events = events + parse(complete.decode("utf-8", "replace"), len(events))
                self.cache[path] = (offset + len(complete), events)
            return events
