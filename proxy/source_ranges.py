"""`loadBalancerSourceRanges` as the backends need them: the IPv4 networks allowed, or None.

Shared by the IPVS backend (an ipset of allowed sources) and the eBPF backend (an LPM trie):
both must read the ranges the same way, as Kubernetes does.
"""
from __future__ import annotations

import ipaddress
from collections.abc import Iterable


def ipv4_source_ranges(ranges: Iterable[str]) -> tuple[str, ...] | None:
    """The IPv4 source ranges to allow, or None when every source is allowed (no ranges, or a
    /0 among them: ipset cannot hold /0 and needs not). IPv6 and unparsable ranges say nothing
    about IPv4 clients and are left out; with only those, no IPv4 client is allowed (an empty
    tuple), as in Kubernetes."""
    ranges = tuple(ranges)
    if not ranges:
        return None
    allowed = []
    for text in ranges:
        try:
            network = ipaddress.ip_network(text.strip(), strict=False)
        except ValueError:
            continue
        if network.version != 4:
            continue
        if network.prefixlen == 0:
            return None
        allowed.append(str(network))
    return tuple(dict.fromkeys(allowed))
