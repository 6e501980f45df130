"""Hosts of a local job in network namespaces of their own (``SHOAL_LOCAL_NETWORK=namespaces``):
each host gets a namespace with an ``eth0`` on a bridge shared by the job's hosts, an address
from a range used only inside these namespaces, ``algo-N`` in its hosts file, and optionally
an emulated link (``SHOAL_LOCAL_LINK``).

    links       the link specification and the qdiscs that emulate it
    namespaces  the plan (pure: names, addresses, hosts file, commands) and applying it
    preflight   what the machine must offer, with an error that names what is missing
"""
