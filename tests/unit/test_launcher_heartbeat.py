"""The launchers' heartbeat: verdicts (pure), and agents on loopback that hear each other,
notice a peer that went silent or whose launcher is gone, and excuse their own stalls."""

import errno
import json
import re
import socket
import time

import pytest
from shoal.errors import ConfigError
from shoal.launcher import heartbeat
from shoal.launcher.heartbeat import Heartbeat, Peer, Settings, host_ranks, verdict
from shoal.launcher.ports import free_port

FAST = Settings(interval=0.1, timeout=1.0)  # short, with room for a loaded machine


def test_settings_from_the_environment():
    assert Settings.from_environ({}) == Settings(interval=1.0, timeout=15.0, port=7595)
    s = Settings.from_environ({"SHOAL_HOST_TIMEOUT": "30", "SHOAL_HEARTBEAT_PORT": "9000"})
    assert (s.timeout, s.port, s.enabled) == (30.0, 9000, True)
    assert not Settings.from_environ({"SHOAL_HOST_TIMEOUT": "0"}).enabled


@pytest.mark.parametrize("environ, message", [
    ({"SHOAL_HOST_TIMEOUT": "3"}, "at least 5 times SHOAL_HEARTBEAT_INTERVAL=1"),
    ({"SHOAL_HOST_TIMEOUT": "soon"}, "SHOAL_HOST_TIMEOUT='soon' is not a number"),
    ({"SHOAL_HEARTBEAT_INTERVAL": "0"}, "heartbeat settings"),
])
def test_settings_refused(environ, message):
    with pytest.raises(ConfigError, match=message):
        Settings.from_environ(environ)


def test_host_ranks():
    assert host_ranks(["algo-1", "algo-2"], 2) == {"algo-1": "0-1", "algo-2": "2-3"}
    assert host_ranks(["algo-1", "algo-2"], 1) == {"algo-1": "0", "algo-2": "1"}


def peer(**fields) -> Peer:
    return Peer("algo-2", ("127.0.0.1", 1), **{"expected": True, "heard": 100.0, **fields})


def test_verdicts():
    s = Settings()
    assert verdict(peer(), 114.9, s) is None
    assert verdict(peer(), 115.25, s) == "no heartbeat for 15.2 s"
    assert verdict(peer(expected=False), 200.0, s) is None  # never heard: not yet counted
    assert verdict(peer(done=True), 200.0, s) is None  # its part of the job ended
    unreachable = peer(error_errno=errno.EHOSTUNREACH, error="unreachable (No route to host)",
                       error_since=101.0)
    assert verdict(unreachable, 110.0, s) is None  # the network may come back
    assert verdict(unreachable, 116.0, s) == \
        "unreachable: no heartbeat for 16.0 s; the network answered unreachable (No route to host)"
    refused = peer(error_errno=errno.ECONNREFUSED, error="connection refused",
                   error_since=101.0, heard_at=time.time())
    assert verdict(refused, 102.0, s) is None
    assert verdict(refused, 103.5, s).startswith("connection refused: its launcher stopped")
    assert verdict(peer(error_errno=errno.ECONNREFUSED, error="connection refused",
                        error_since=101.0), 104.0, s) is None  # never heard: not up yet


def agents(hosts, settings=FAST, job="job-1", only=None):
    """Agents of ``hosts`` (or of ``only`` of them) on loopback ports of their own."""
    table = {h: ["127.0.0.1", free_port()] for h in hosts}
    environ = {heartbeat.ADDRESSES_ENV: json.dumps(table), "TRAINING_JOB_NAME": job}
    made = {}
    for h in only or hosts:
        lost = []
        made[h] = Heartbeat(h, hosts, settings, environ=environ, ranks_per_host=2,
                            on_lost=lambda host, text, lost=lost: lost.append(text))
        made[h].found = lost
    return made, table


def test_live_hosts_are_never_lost_and_done_ones_are_not_watched():
    made, _ = agents(["algo-1", "algo-2", "algo-3"])
    for a in made.values():
        a.start()
    time.sleep(3.0)  # three time-outs
    assert [a.lost for a in made.values()] == [None, None, None]
    assert all(p.expected and p.seq > 10 for a in made.values() for p in a.peers.values())
    made["algo-3"].stop()  # its part ended: says so
    time.sleep(2.0)
    assert made["algo-1"].peers["algo-3"].done and made["algo-1"].lost is None
    for a in made.values():
        a.stop()


def test_a_silent_host_is_lost_after_the_timeout():
    made, table = agents(["algo-1", "algo-2"], only=["algo-1"])
    # algo-2's port is taken by a socket that receives and never answers: a frozen host
    frozen = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    frozen.bind(tuple(table["algo-2"]))
    master = made["algo-1"].start()
    start = time.monotonic()
    while master.lost is None and time.monotonic() - start < 5:
        time.sleep(0.02)
    assert 1.0 <= time.monotonic() - start < 4  # (a loaded machine may judge late)
    assert master.found == [master.lost]
    assert re.match(r"HostLostError: host algo-2 \(ranks 2-3\) stopped answering: no heartbeat "
                    r"for \d\.\d s; no heartbeat ever received; detected by algo-1 at "
                    r"\d\d:\d\d:\d\dZ\.$", master.lost), master.lost
    master.stop()
    frozen.close()


def test_a_host_whose_launcher_is_gone_is_refused(monkeypatch):
    monkeypatch.setattr(heartbeat, "REFUSED_FOR", 0.2)
    made, _ = agents(["algo-1", "algo-2"], settings=Settings(interval=0.05, timeout=30))
    master, worker = made["algo-1"].start(), made["algo-2"].start()
    time.sleep(0.3)
    worker._stop.set()  # dies without a word: its socket closes, nothing listens
    worker._thread.join()
    worker._sock.close()
    start = time.monotonic()
    while master.lost is None and time.monotonic() - start < 5:
        time.sleep(0.02)
    assert time.monotonic() - start < 5  # long before the 30 s of silence
    assert "host algo-2 (ranks 2-3) stopped answering: connection refused" in master.lost
    assert "last heartbeat at " in master.lost
    master.stop()


def test_a_worker_counts_silence_only_once_it_heard_the_master():
    made, _ = agents(["algo-1", "algo-2", "algo-3"])
    worker = made["algo-2"].start()  # the master and algo-3 not started yet
    time.sleep(2.0)
    assert worker.lost is None
    made["algo-1"].start()
    time.sleep(0.5)
    assert worker.peers["algo-3"].expected  # every agent runs once the master's does
    time.sleep(2.0)
    assert "host algo-3" in worker.lost
    worker.stop()
    made["algo-1"].stop()


def test_another_jobs_heartbeats_are_ignored():
    made, table = agents(["algo-1", "algo-2"], only=["algo-1"])
    master = made["algo-1"].start()
    other = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    other.bind(tuple(table["algo-2"]))
    for seq in range(40):
        beat = {"job": "another-job", "host": "algo-2", "seq": seq}
        other.sendto(json.dumps(beat).encode(), tuple(table["algo-1"]))
        time.sleep(0.05)
    assert "host algo-2" in (master.lost or "")
    master.stop()
    other.close()


def test_a_late_watcher_blames_itself():
    made, _ = agents(["algo-1", "algo-2"], settings=Settings())
    master = made["algo-1"]
    before = master.peers["algo-2"].heard
    master._excuse_own_stall(1.0)  # within the margin
    assert master.peers["algo-2"].heard == before
    master._excuse_own_stall(20.0)  # stopped for 20 s: the peers get those 20 s back
    assert master.peers["algo-2"].heard == before + 20.0 and master.max_stall == 20.0
    assert verdict(master.peers["algo-2"], time.monotonic() + 20.0, master.settings) is None
    master.stop()


def test_settle_waits_for_the_verdict_on_a_host_that_went_away(monkeypatch):
    monkeypatch.setattr(heartbeat, "REFUSED_FOR", 0.2)
    made, _ = agents(["algo-1", "algo-2", "algo-3"], settings=Settings(interval=0.05, timeout=30))
    for a in made.values():
        a.start()
    time.sleep(0.3)
    start = time.monotonic()
    assert made["algo-1"].settle() is None  # everyone answers again: a job's own failure
    assert time.monotonic() - start < 2
    gone = made["algo-3"]
    gone._stop.set()  # its launcher killed: no word, its port closed
    gone._thread.join()
    gone._sock.close()
    assert "host algo-3 (ranks 4-5) stopped answering: connection refused" in made["algo-1"].settle()
    for h in ("algo-1", "algo-2"):
        made[h].stop()
