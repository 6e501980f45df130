"""Rendezvous ports: below the ephemeral range, and free when handed out."""

import socket

import pytest
from shoal.launcher import ports


def test_a_port_lies_below_the_ephemeral_range_and_can_be_bound():
    low = ports._ephemeral_low()
    for _ in range(50):
        port = ports.free_port()
        assert ports.LOWEST <= port < low
        with socket.socket() as s:
            s.bind(("", port))


def test_a_port_something_listens_on_is_passed_over(monkeypatch):
    with socket.socket() as taken:
        taken.bind(("", 0))
        taken.listen()
        busy = taken.getsockname()[1]
        free = ports.free_port()
        draws = iter([busy, busy, free])
        monkeypatch.setattr(ports.random, "randint", lambda lo, hi: next(draws))
        assert ports.free_port() == free


def test_no_free_port_is_an_error_naming_the_range(monkeypatch):
    monkeypatch.setattr(ports, "_ephemeral_low", lambda: 20000)

    def refuse(self, address):
        raise OSError("taken")

    monkeypatch.setattr(socket.socket, "bind", refuse)
    with pytest.raises(RuntimeError, match="no free port in 10000-19999"):
        ports.free_port()


def test_the_range_is_read_from_the_kernel_or_defaults(monkeypatch):
    with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
        assert ports._ephemeral_low() == int(f.read().split()[0])
    monkeypatch.setattr("builtins.open", lambda *a, **k: (_ for _ in ()).throw(OSError()))
    assert ports._ephemeral_low() == 32768
