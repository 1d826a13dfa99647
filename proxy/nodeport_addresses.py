"""Which of the node's own addresses NodePorts answer on (`--nodeport-addresses`): pure.

kube-proxy's flag takes CIDRs: a NodePort answers on every local address inside one of
them (empty: on every local address). The CIDRs of both families share the flag; each
family's proxy takes its own (`of_family`), and a family with none answers on every local
address of that family, as kube-proxy's proxier per family does. The addresses come from the `LocalAddresses` seam
(local_addresses.py) at every full sync, so an address added later is picked up within
one sync period.
"""
from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Sequence

from netagent.errors import NetagentError
from netagent.kernel.families import IpFamily


class NodePortAddressError(NetagentError, ValueError):
    pass


def parse_nodeport_cidrs(values: Iterable[str]) -> tuple[str, ...]:
    """`--nodeport-addresses` values (each may hold a comma-separated list) as CIDRs of either family."""
    cidrs = []
    for value in values:
        for part in filter(None, (p.strip() for p in value.split(","))):
            try:
                network = ipaddress.ip_network(part, strict=False)
            except ValueError:
                raise NodePortAddressError(f"--nodeport-addresses: {part!r} is not a CIDR") from None
            cidrs.append(str(network))
    return tuple(dict.fromkeys(cidrs))


def nodeport_addresses(local: Sequence[str], cidrs: Sequence[str]) -> tuple[str, ...]:
    """The local addresses inside `cidrs` (all of `local` when no CIDR is given)."""
    if not cidrs:
        return tuple(local)
    networks = [ipaddress.ip_network(c) for c in cidrs]
    return tuple(a for a in local if any(ipaddress.ip_address(a) in n for n in networks))


def of_family(cidrs: Sequence[str], family: IpFamily) -> tuple[str, ...]:
    """The CIDRs of `family` among `cidrs`."""
    return tuple(c for c in cidrs if IpFamily.of(c) is family)
