"""The IPIP backend: one NBMA tunnel device, and per peer an onlink route via the peer.

The device (`na-ipip`, kind ipip) has a local address and no remote: the kernel takes the
outer destination from each route's gateway, so one device serves every peer and a peer
costs a single route, `<peer CIDR> via <peer public IP> dev na-ipip onlink`. A dedicated
device rather than the fallback `tunl0`, so that our device, its MTU and its address are
ours alone. MTU is the underlay's less 20 bytes (the outer IPv4 header). IPIP carries no
Ethernet header, so there are no neighbour or FDB entries.

IPv4 only: IPv6's form (`ip6tnl`, which this build machine's kernel lacks) is not implemented,
so an IPv6 planner with ipip is refused at start (`IPIP_IPV6_REFUSAL`), never half-programmed.
"""
from __future__ import annotations

from ipaddress import IPv4Address, IPv4Interface

from netagent.noderoutes.routing.model import (
    ENCAP_OVERHEAD,
    IpipDevice,
    LocalNode,
    Mode,
    Peer,
    PeerPlan,
    Route,
    RoutingSettings,
)


IPIP_IPV6_REFUSAL = ("ipip carries IPv4 pod traffic only: IPv6 pod CIDRs need vxlan, host-gw, or auto with "
                     "--auto-encap vxlan (ip6tnl, IPv6's IPIP, is not implemented)")


def render_ipip_device(local: LocalNode, settings: RoutingSettings) -> IpipDevice:
    address = local.tunnel_address
    if not isinstance(local.public_ip, IPv4Address) or not isinstance(address, IPv4Interface):
        raise ValueError(IPIP_IPV6_REFUSAL)
    return IpipDevice(ifname=settings.ipip_ifname, local=local.public_ip,
                      mtu=local.underlay_mtu - ENCAP_OVERHEAD[Mode.IPIP], address=address)


def render_ipip_peer(peer: Peer, cidrs: tuple, settings: RoutingSettings) -> PeerPlan:
    return PeerPlan(name=peer.name, mode=Mode.IPIP,
                    routes=tuple(Route(dst=cidr, gateway=peer.public_ip, ifname=settings.ipip_ifname,
                                       onlink=True) for cidr in cidrs))
