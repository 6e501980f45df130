"""The launchers' heartbeat: a host that stops answering fails the job on every other host.

The launcher (``train``) of every host of a multi-host MPI or data-parallel job sends one
small datagram to every other host's launcher each ``SHOAL_HEARTBEAT_INTERVAL`` seconds
(default 1) on UDP port ``SHOAL_HEARTBEAT_PORT`` (default 7595), and watches theirs. A host
is declared lost, and the job fails on every host that still runs, when

* nothing came from it for ``SHOAL_HOST_TIMEOUT`` seconds (default 15; 0 turns the
  heartbeat off): it crashed, was cut off the network or is frozen; whether the kernel said
  it was unreachable (no route, no ARP answer) is added as evidence;
* or its kernel refused the heartbeats (ICMP port unreachable) for ``REFUSED_FOR`` seconds
  after it had answered: the machine is up and its launcher is gone.

Why this shape:

* the launchers, not the ranks: a launcher does no compute, so a rank that computes for
  minutes between collectives, holds the GIL in a C call or shares a saturated CPU never
  delays a heartbeat; ranks are watched by their collectives' own time-out;
* a socket of its own, not the collectives' connections: a heartbeat never waits behind a
  bucket on a slow link, and a frozen host, whose kernel still acknowledges TCP data until
  its buffers fill, is silent here all the same;
* datagrams, one connected sending socket per peer: no connection state to go stale, and
  the kernel reports an ICMP answer on that socket, so the verdict says what was seen. On
  SageMaker every port is open between a job's instances; on other clusters the port must
  be open between the hosts (a blocked port never fails a job: see below).

Silence is counted from a peer's first heartbeat, except on the master, which starts its
watch once every worker reported ready (their agents run before they report), and on
workers once they heard the master (every agent runs by then). A host whose watcher itself
woke late by more than ``STALL`` seconds (stopped, starved) moves every deadline by that
lateness instead of accusing its peers. A launcher whose part of the job ended sends
``done`` and is no longer watched. Nothing a peer sends is executed or stored.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import select
import socket
import threading
import time
from collections.abc import Callable, Mapping, Sequence

import attrs
from shoal.errors import ConfigError, HostLostError

log = logging.getLogger(__name__)

HEARTBEAT_PORT = 7595
ADDRESSES_ENV = "SHOAL_HEARTBEAT_ADDRESSES"  # simulated hosts: {"algo-1": ["127.0.0.1", port]}
REFUSED_FOR = 1.5  # seconds of refused heartbeats that prove a peer's launcher gone
STALL = 2.0  # the watcher's own lateness (seconds) beyond which it blames itself
DATAGRAM = 512  # bytes: the largest heartbeat read
_UNREACHABLE = (errno.EHOSTUNREACH, errno.ENETUNREACH, errno.EHOSTDOWN, errno.ENETDOWN)


def _number(environ: Mapping[str, str], name: str, default: float) -> float:
    raw = environ.get(name, "")
    try:
        return float(raw) if raw.strip() else default
    except ValueError:
        raise ConfigError(f"{name}={raw!r} is not a number of seconds") from None


def _check_timeout(settings: Settings, attribute, value: float) -> None:
    if value and value < 5 * settings.interval:
        raise ConfigError(f"SHOAL_HOST_TIMEOUT={value:g} must be 0 (off) or at least 5 times "
                          f"SHOAL_HEARTBEAT_INTERVAL={settings.interval:g}")


@attrs.frozen
class Settings:
    """The heartbeat's knobs, parsed from the launcher's environment."""

    interval: float = attrs.field(default=1.0, validator=attrs.validators.gt(0))
    timeout: float = attrs.field(default=15.0, validator=[attrs.validators.ge(0), _check_timeout])
    port: int = attrs.field(default=HEARTBEAT_PORT, validator=attrs.validators.ge(0))

    @property
    def enabled(self) -> bool:
        return self.timeout > 0

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> Settings:
        try:
            return cls(interval=_number(environ, "SHOAL_HEARTBEAT_INTERVAL", 1.0),
                       timeout=_number(environ, "SHOAL_HOST_TIMEOUT", 15.0),
                       port=int(_number(environ, "SHOAL_HEARTBEAT_PORT", HEARTBEAT_PORT)))
        except ValueError as e:  # attrs' own validators
            raise ConfigError(f"heartbeat settings: {e}") from None


@attrs.define
class Peer:
    """What one watcher knows of one other host."""

    host: str
    address: tuple[str, int] | None  # None until its name resolves
    ranks: str = ""  # "2-3": the job's ranks on it, for the verdict
    heard: float = 0.0  # monotonic: its last heartbeat, or when silence began to count
    heard_at: float | None = None  # wall clock of its last heartbeat
    expected: bool = False  # silence counts
    seq: int = -1
    done: bool = False
    error: str | None = None  # what the kernel answered since its last heartbeat
    error_errno: int = 0
    error_since: float | None = None
    sock: socket.socket | None = None

    def hear(self, now: float, seq: int, done: bool) -> None:
        self.heard, self.heard_at, self.expected = now, time.time(), True
        self.seq, self.done = max(self.seq, seq), self.done or done
        self.error, self.error_errno, self.error_since = None, 0, None

    def answered(self, err: int, now: float) -> None:
        """The kernel's answer ``err`` (an errno) to a heartbeat sent to this peer."""
        if self.error_since is None or err != self.error_errno:
            self.error_since = now
        self.error_errno, self.error = err, _describe(err)


def _describe(err: int) -> str:
    if err == errno.ECONNREFUSED:
        return "connection refused"
    reason = os.strerror(err)
    return f"unreachable ({reason})" if err in _UNREACHABLE else reason


def verdict(peer: Peer, now: float, settings: Settings) -> str | None:
    """What makes ``peer`` lost at ``now``, or None while it is not (pure)."""
    if peer.done or not peer.expected:
        return None
    refused = peer.error_errno == errno.ECONNREFUSED and peer.heard_at is not None
    if refused and now - peer.error_since >= REFUSED_FOR:
        return (f"connection refused: its launcher stopped listening (heartbeats refused for "
                f"{now - peer.error_since:.1f} s)")
    silent = now - peer.heard
    if silent < settings.timeout:
        return None
    seen = f"no heartbeat for {silent:.1f} s"
    if peer.error_errno in _UNREACHABLE:
        return f"unreachable: {seen}; the network answered {peer.error}"
    return seen + (f"; the network answered {peer.error}" if peer.error else "")


def _utc(stamp: float | None) -> str:
    if stamp is None:
        return "never"
    return time.strftime("%H:%M:%SZ", time.gmtime(stamp))


def reason(me: str, peer: Peer, cause: str) -> str:
    """The FailureReason's first line for ``peer`` lost as ``cause`` says (one line)."""
    ranks = f" (ranks {peer.ranks})" if peer.ranks else ""
    heard = (f"last heartbeat at {_utc(peer.heard_at)} (seq {peer.seq})" if peer.heard_at
             else "no heartbeat ever received")
    return (f"{HostLostError.__name__}: host {peer.host}{ranks} stopped answering: {cause}; "
            f"{heard}; detected by {me} at {_utc(time.time())}.")


def host_ranks(hosts: Sequence[str], ranks_per_host: int) -> dict[str, str]:
    """``{"algo-2": "2-3"}``: the ranks each host runs, filled host by host (pure)."""
    out = {}
    for i, host in enumerate(hosts):
        first, last = i * ranks_per_host, (i + 1) * ranks_per_host - 1
        out[host] = str(first) if first == last else f"{first}-{last}"
    return out


def addresses(hosts: Sequence[str], environ: Mapping[str, str],
              settings: Settings) -> dict[str, tuple[str, int] | None]:
    """Where each host's launcher listens: the simulated hosts' table, else the host's name
    resolved (None while it does not resolve) and the heartbeat port."""
    table = environ.get(ADDRESSES_ENV)
    if table:
        return {h: (str(a), int(p)) for h, (a, p) in json.loads(table).items() if h in hosts}
    return {h: _resolve(h, settings.port) for h in hosts}


def _resolve(host: str, port: int) -> tuple[str, int] | None:
    try:
        return socket.gethostbyname(host), port
    except OSError:
        return None


Lost = Callable[[str, str], None]  # (host, the FailureReason's first line)


class Heartbeat:
    """One launcher's agent: sends its heartbeats and watches its peers' (a daemon thread)."""

    def __init__(self, me: str, hosts: Sequence[str], settings: Settings, *,
                 environ: Mapping[str, str], ranks_per_host: int = 1,
                 on_lost: Lost | None = None) -> None:
        self.me, self.settings, self.on_lost = me, settings, on_lost
        self.job = environ.get("TRAINING_JOB_NAME", "")
        self.master = sorted(hosts)[0]
        where = addresses(hosts, environ, settings)
        ranks = host_ranks(sorted(hosts), ranks_per_host)
        now = time.monotonic()
        self.peers = {h: Peer(h, where.get(h), ranks.get(h, ""), heard=now,
                              expected=me == self.master)
                      for h in hosts if h != me}  # fmt: skip
        # every interface (a host's name may resolve to another of its addresses), unless
        # simulated hosts share one machine
        own = where.get(me) if environ.get(ADDRESSES_ENV) else None
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self._sock.bind(own or ("", settings.port))
        self._stop = threading.Event()
        self._seq = 0
        self.lost: str | None = None  # the first verdict, as reason() words it
        self.max_stall = 0.0
        self._thread = threading.Thread(target=self._run, name="shoal-heartbeat", daemon=True)

    def start(self) -> Heartbeat:
        log.info("heartbeat: watching %s every %gs (host lost after %gs of silence)",
                 ", ".join(self.peers), self.settings.interval, self.settings.timeout)
        self._thread.start()
        return self

    def stop(self) -> None:
        """This host's part of the job ended: tell the peers (so that they stop watching it)
        and stop."""
        if self._stop.is_set():
            return
        self._stop.set()
        if self._thread.ident is not None:
            self._thread.join(timeout=5)
        for _ in range(3):  # datagrams may be lost: a peer needs one
            self._send_all(done=True)
        for peer in self.peers.values():
            if peer.sock:
                peer.sock.close()
        self._sock.close()

    # -- the agent's loop ----------------------------------------------------------------
    def _run(self) -> None:
        next_send = tick = time.monotonic()
        step = self.settings.interval / 4  # the longest wait between two turns
        while not self._stop.is_set():
            now = time.monotonic()
            self._excuse_own_stall(now - tick - step)  # however long this loop was held up
            tick = now
            if now >= next_send:
                self._send_all(done=False)
                next_send = now + self.settings.interval
            wait = max(0.0, min(next_send, now + step) - now)
            ready, _, _ = select.select([self._sock], [], [], wait)
            if ready:  # what came while this host was held up counts as heard now
                self._receive(time.monotonic())
            self._judge(time.monotonic())

    def _excuse_own_stall(self, late: float) -> None:
        """A turn ``late`` seconds after it was due: if that is long, this host was stopped
        or starved, not its peers: their deadlines move by as much."""
        if late <= STALL:
            return
        self.max_stall = max(self.max_stall, late)
        log.warning("heartbeat: this launcher woke %.1fs late; not counted against the peers",
                    late)
        for peer in self.peers.values():
            peer.heard += late
            if peer.error_since is not None:
                peer.error_since += late

    def _receive(self, now: float) -> None:
        while True:
            try:
                data = self._sock.recv(DATAGRAM, socket.MSG_DONTWAIT)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                return
            self._take(data, now)

    def _take(self, data: bytes, now: float) -> None:
        try:
            beat = json.loads(data.decode("utf-8"))
            host, seq, done = str(beat["host"]), int(beat["seq"]), bool(beat.get("done"))
            job = str(beat.get("job", ""))
        except (ValueError, KeyError, TypeError, AttributeError):
            return
        peer = self.peers.get(host)
        if peer is None or job != self.job:
            return  # another job's launcher on this port
        if host == self.master and not peer.expected:
            self._expect_everyone(now)
        peer.hear(now, seq, done)

    def _expect_everyone(self, now: float) -> None:
        """The master's first heartbeat: every host's agent runs by now."""
        for peer in self.peers.values():
            if not peer.expected:
                peer.expected, peer.heard = True, now

    def _send_all(self, done: bool) -> None:
        self._seq += 1
        beat = json.dumps({"job": self.job, "host": self.me, "seq": self._seq, "done": done})
        for peer in self.peers.values():
            self._send(peer, beat.encode())

    def _send(self, peer: Peer, data: bytes) -> None:
        now = time.monotonic()
        try:
            if peer.sock is None:
                peer.address = peer.address or _resolve(peer.host, self.settings.port)
                if peer.address is None:
                    return
                peer.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
                peer.sock.connect(peer.address)
            pending = peer.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
            if pending:
                peer.answered(pending, now)
            peer.sock.send(data, socket.MSG_DONTWAIT)
        except BlockingIOError:
            pass  # a full send buffer: this beat is skipped
        except OSError as e:
            if e.errno:
                peer.answered(e.errno, now)

    def _judge(self, now: float) -> None:
        if self.lost is not None:
            return
        for peer in self.peers.values():
            pending = peer.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) if peer.sock else 0
            if pending:  # the kernel's answer to the last heartbeat, as soon as it came
                peer.answered(pending, now)
            cause = verdict(peer, now, self.settings)
            if cause is None:
                continue
            self.lost = reason(self.me, peer, cause)
            log.error("%s", self.lost)
            callback = self.on_lost  # the main thread may disarm it meanwhile
            if callback is not None:
                callback(peer.host, self.lost)
            return


    def settle(self) -> str | None:
        """For a job that just failed: the verdict on a host that went away, if one did. mpirun
        ends a job whose host was killed within a second, before the verdict, which is then
        its root cause. Waits until every peer answered again (alive: None) or a verdict came,
        at most until a killed launcher's refusals would have been counted."""
        since = time.monotonic()
        deadline = since + REFUSED_FOR + 3 * self.settings.interval
        while self.lost is None and time.monotonic() < deadline:
            if all(p.done or not p.expected or p.heard >= since for p in self.peers.values()):
                return None
            time.sleep(0.05)
        return self.lost


def start(me: str, hosts: Sequence[str], settings: Settings, environ: Mapping[str, str], *,
          ranks_per_host: int, on_lost: Lost) -> Heartbeat | None:
    """This host's agent, started; None when off (``SHOAL_HOST_TIMEOUT=0``, one host) or when
    its port cannot be bound (then the job runs without it, as it would with it off)."""
    if not settings.enabled or len(hosts) < 2:
        return None
    try:
        agent = Heartbeat(me, hosts, settings, environ=environ, ranks_per_host=ranks_per_host,
                          on_lost=on_lost)
    except OSError as e:
        log.warning("heartbeat: cannot listen on port %d (%s); lost hosts are noticed only by "
                    "the collectives' time-out", settings.port, e)
        return None
    return agent.start()
