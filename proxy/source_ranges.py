"""`loadBalancerSourceRanges` as the backends need them: one family's networks allowed, or None.

Shared by the IPVS backend (an ipset of allowed sources), the nftables backend (an interval set)
and the eBPF backend (an LPM trie):
both must read the ranges the same way, as Kubernetes does.
"""
from __future__ import annotations

import ipaddress
from collections.abc import Iterable

from netagent.kernel.families import IpFamily


def source_ranges(ranges: Iterable[str], family: IpFamily) -> tuple[str, ...] | None:
    """The source ranges of `family` to allow, or None when every source is allowed (no ranges,
    or a /0 of the family among them: ipset cannot hold /0 and needs not). Ranges of the other
    family and unparsable ones say nothing about this family's clients and are left out; with
    only those, no client of this family is allowed (an empty tuple), as in Kubernetes."""
    ranges = tuple(ranges)
    if not ranges:
        return None
    allowed = []
    for text in ranges:
        try:
            network = ipaddress.ip_network(text.strip(), strict=False)
        except ValueError:
            continue
        if network.version != family.value:
            continue
        if network.prefixlen == 0:
            return None
        allowed.append(str(network))
    return tuple(dict.fromkeys(allowed))
