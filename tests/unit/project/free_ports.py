"""TCP ports for tests that must name a port before binding it, or bind the same port twice.

A port from the ephemeral range (what binding port 0 gives) can be taken by any outgoing
connection on the machine the moment the test lets go of it, and even by a client's own retries
to it (a TCP self-connect to 127.0.0.1:port). Ports below the range are handed out by nobody:
only a program that names one explicitly can collide, and then the caller just tries another.
"""
from __future__ import annotations

import random
from collections.abc import Iterator

LOWEST = 10000  # well above the well-known and registered ports a host service might be using


def ports_below_the_ephemeral_range(tries: int = 50) -> Iterator[int]:
    """Random candidate ports in [LOWEST, the kernel's first ephemeral port)."""
    with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
        lowest_ephemeral = int(f.read().split()[0])
    yield from random.sample(range(LOWEST, max(lowest_ephemeral, LOWEST + tries)), tries)
