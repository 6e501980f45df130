"""A port for a job's rendezvous (MASTER_PORT, the status port) that nothing else is
about to take.

A port the kernel hands out for ``bind(0)`` comes from the ephemeral range, the range every
process's outgoing connections and other ``bind(0)`` calls draw from too: on a busy machine
another process can take it between its choice and rank 0's bind (a stress run of the
tests failed with ``bind *:33124: Address already in use``). So the port is drawn at random
below that range, and checked free."""

from __future__ import annotations

import random
import socket

LOWEST = 10000


def _ephemeral_low() -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port() -> int:
    """A port below the ephemeral range that nothing listens on now."""
    high = _ephemeral_low() - 1
    for _ in range(200):
        port = random.randint(LOWEST, high)
        try:
            with socket.socket() as probe:
                probe.bind(("", port))
            return port
        except OSError:
            continue  # taken: try another
    raise RuntimeError(f"no free port in {LOWEST}-{high}")
