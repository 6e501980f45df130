"""Hosts of a local job in network namespaces of their own (``SHOAL_LOCAL_NETWORK=namespaces``):
each host gets a namespace with an ``eth0`` on a bridge shared by the job's hosts, an address
from a range used only inside these namespaces, ``algo-N`` in its hosts file, and optionally
an emulated link (``SHOAL_LOCAL_LINK``).

    links       the link specification and the qdiscs that emulate it
    namespaces  the plan (pure: names, addresses, hosts file, commands) and applying it
    preflight   what the machine must offer, with an error that names what is missing
    hosts       running a job's hosts in them (or inside an image there)

``NETWORK_MODES`` is the one table the config file, the CLI, the backend and the
supervisor check ``SHOAL_LOCAL_NETWORK`` / ``local_network`` against.
"""

from __future__ import annotations

from shoal.errors import InputError

NETWORK_MODES = ("loopback", "namespaces")


def network_mode(environ) -> str:
    """``SHOAL_LOCAL_NETWORK``: ``loopback`` (simulated hosts, the default) or ``namespaces``."""
    mode = environ.get("SHOAL_LOCAL_NETWORK") or "loopback"
    if mode not in NETWORK_MODES:
        raise InputError(f"'SHOAL_LOCAL_NETWORK' must be one of {', '.join(NETWORK_MODES)} "
                         f"(got {mode!r})")
    return mode
