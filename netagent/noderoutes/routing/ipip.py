"""The IPIP backend: one NBMA tunnel device per family, and per peer an onlink route via the peer.

IPv4 pods: the device (`na-ipip`, kind ipip) has a local address and no remote: the kernel takes
the outer destination from each route's gateway, so one device serves every peer and a peer
costs a single route, `<peer CIDR> via <peer public IP> dev na-ipip onlink`. A dedicated
device rather than the fallback `tunl0`, so that our device, its MTU and its address are
ours alone. MTU is the underlay's less 20 bytes (the outer IPv4 header). IPIP carries no
Ethernet header, so there are no neighbour or FDB entries.

IPv6 pods: IPIP's IPv6 form, `na-ipip6` of kind ip6tnl in mode ip6ip6 (IP protocol 41 on the
wire), over the IPv6 underlay, the same rule as VXLAN's `na-vxlan6` (a family's overlay rides
that family's underlay, so IPv6-only nodes need no IPv4 at all). Not the NBMA shape of IPv4:
the kernel refuses an IPv6 onlink route whose gateway a more specific route of another device
covers ("Nexthop has invalid gateway or device mismatch", ip6_route_check_nh_onlink), so
`<peer CIDR> via <peer public-ipv6> dev na-ipip6 onlink` fails for every peer on our own
underlay subnet (and in one trial in the guest, a peer reached over the default route got
"Address unreachable" on it too). Instead the device is `external` (collect_md: no local, no remote, one per namespace)
and each peer's route carries its outer destination as a lightweight-tunnel encapsulation:

    route <peer IPv6 CIDR> encap ip6 dst <peer public-ipv6> dev na-ipip6

The outer source is then chosen by the underlay's routing (the node's IPv6 underlay address),
and an external device receives every ip6ip6 packet for the namespace, as `na-ipip` with no
remote receives every IPIP packet. The kernel allows one external ip6tnl per namespace: if
another program holds one, creating `na-ipip6` fails with EEXIST (a `KernelError` naming the
device). tests/vm/guest/test_ipip_kernel.py pins this down with real packets. No encapsulation
limit option is added in external mode, so the outer header is the 40-byte IPv6 header alone
(the guest test asserts next header 41 right after it) and the MTU is the underlay's less 40
(`encap_overhead(Mode.IPIP, IpFamily.V6)`).
"""
from __future__ import annotations

from netagent.kernel.families import IpFamily
from netagent.noderoutes.routing.model import (
    IpipDevice,
    LocalNode,
    Mode,
    Peer,
    PeerPlan,
    Route,
    RoutingSettings,
    encap_overhead,
)


def ipip_ifname(settings: RoutingSettings, family: IpFamily) -> str:
    return settings.ipip_ifname if family is IpFamily.V4 else settings.ipip6_ifname


def render_ipip_device(local: LocalNode, settings: RoutingSettings) -> IpipDevice:
    """`na-ipip` (ipip) for an IPv4 node's plan, `na-ipip6` (ip6tnl, external, ip6ip6) for an IPv6 one."""
    family = local.family
    return IpipDevice(ifname=ipip_ifname(settings, family), local=local.public_ip,
                      mtu=local.underlay_mtu - encap_overhead(Mode.IPIP, family), address=local.tunnel_address)


def render_ipip_peer(peer: Peer, cidrs: tuple, settings: RoutingSettings) -> PeerPlan:
    """The peer's routes over its family's tunnel (the family of its projected public IP, see
    `Peer.in_family`)."""
    if IpFamily.of(peer.public_ip) is IpFamily.V6:
        return PeerPlan(name=peer.name, mode=Mode.IPIP,
                        routes=tuple(Route(dst=cidr, ifname=settings.ipip6_ifname, encap_dst=peer.public_ip)
                                     for cidr in cidrs))
    return PeerPlan(name=peer.name, mode=Mode.IPIP,
                    routes=tuple(Route(dst=cidr, gateway=peer.public_ip, ifname=settings.ipip_ifname, onlink=True)
                                 for cidr in cidrs))
