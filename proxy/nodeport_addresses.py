"""The node's own IPv4 addresses, and which of them NodePorts answer on (`--nodeport-addresses`).

kube-proxy's flag takes CIDRs: a NodePort answers on every local address inside one of
them (empty: on every local address). The addresses are read from the kernel of the
namespace the agent runs in, at every full sync, so an address added later is picked up
within one sync period. Loopback and the IPVS backend's own service-address device are not
node addresses.
"""
from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Sequence

from netagent.kernel import owned
from netagent.errors import NetagentError

NOT_NODE_ADDRESS_LINKS = frozenset({"lo", owned.IPVS_DEVICE})


class NodePortAddressError(NetagentError, ValueError):
    pass


def parse_nodeport_cidrs(values: Iterable[str]) -> tuple[str, ...]:
    """`--nodeport-addresses` values (each may hold a comma-separated list) as IPv4 CIDRs."""
    cidrs = []
    for value in values:
        for part in filter(None, (p.strip() for p in value.split(","))):
            try:
                network = ipaddress.ip_network(part, strict=False)
            except ValueError:
                raise NodePortAddressError(f"--nodeport-addresses: {part!r} is not a CIDR") from None
            if network.version != 4:
                raise NodePortAddressError(f"--nodeport-addresses: {part!r} is IPv6; only IPv4 is proxied")
            cidrs.append(str(network))
    return tuple(dict.fromkeys(cidrs))


def local_ipv4_addresses() -> tuple[str, ...]:
    """Every IPv4 address on this namespace's links except loopback and the proxy's own device."""
    from pyroute2 import IPRoute
    with IPRoute() as ipr:
        names = {link["index"]: link.get_attr("IFLA_IFNAME") for link in ipr.get_links()}
        found = [address.get_attr("IFA_ADDRESS") for address in ipr.get_addr(family=2)
                 if names.get(address["index"]) not in NOT_NODE_ADDRESS_LINKS]
    return tuple(sorted(set(found), key=lambda a: int(ipaddress.IPv4Address(a))))


def nodeport_addresses(local: Sequence[str], cidrs: Sequence[str]) -> tuple[str, ...]:
    """The local addresses inside `cidrs` (all of `local` when no CIDR is given)."""
    if not cidrs:
        return tuple(local)
    networks = [ipaddress.ip_network(c) for c in cidrs]
    return tuple(a for a in local if any(ipaddress.ip_address(a) in n for n in networks))
