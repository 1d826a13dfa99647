"""Routes and neighbour entries as plain values: the one vocabulary of both route writers, the
CNI plugin (`cni/kernel.py`: a pod's routes, the node's routes to a routed pod) and node
routing (`noderoutes/routing/`: the routes and neighbours to every peer).

Frozen values, so what a plan wants and what a kernel dump returns compare with `==`. The
same words everywhere: a neighbour's IP is its `address`, its link-layer address its `mac`.
A CNI request names the device once for all its routes (`PodSetup.ifname`,
`NodeRoutes.host_name`, the interface read back), so its entries leave `ifname` empty; node
routing writes on several devices and names each entry's.
"""
from __future__ import annotations

from dataclasses import dataclass
from ipaddress import IPv4Address, IPv4Network, IPv6Address, IPv6Network

Address = IPv4Address | IPv6Address
Network = IPv4Network | IPv6Network


@dataclass(frozen=True)
class Route:
    """`dst [via gateway] [dev ifname] [onlink]` in the main table; link scope without a gateway."""
    dst: Network
    gateway: Address | None = None
    ifname: str = ""      # empty: the device of the request the route belongs to
    onlink: bool = False  # the gateway is on the link whatever the device's prefixes say
    encap_dst: Address | None = None  # `encap ip6 dst`: a tunnel route's outer destination (node routing's na-ipip6)


@dataclass(frozen=True)
class Neighbour:
    """A permanent neighbour entry `address lladdr mac [dev ifname]`."""
    address: Address
    mac: str
    ifname: str = ""  # empty: as for Route
