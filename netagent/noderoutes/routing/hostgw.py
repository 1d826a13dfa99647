"""The host-gw backend: per peer, a route to its pod CIDR via its underlay address.

No device and no encapsulation: the underlay itself carries pod packets, so the peer must
be directly reachable on the underlay's L2 segment (its public IP inside the connected
prefix of our underlay address). A peer elsewhere would need a router that knows pod
CIDRs, which the underlay does not: such a peer is refused with the reason, never
programmed. The routes live on a device we share with everyone else, which is why they
carry our route protocol.
"""
from __future__ import annotations

from netagent.noderoutes.routing.model import LocalNode, Mode, Peer, PeerPlan, Refused, Route


def on_underlay_subnet(local: LocalNode, peer: Peer) -> bool:
    return peer.public_ip in local.underlay_network


def render_host_gw_peer(local: LocalNode, peer: Peer, cidrs: tuple) -> PeerPlan | Refused:
    """`<cidr> via <peer public IP> dev <underlay>` for each of the peer's IPv4 `cidrs`."""
    if not on_underlay_subnet(local, peer):
        return Refused(f"public IP {peer.public_ip} is not on this node's underlay subnet "
                       f"{local.underlay_network} ({local.underlay_ifname}); host-gw needs all nodes "
                       f"on one L2 segment (use vxlan, ipip or auto across subnets)")
    return PeerPlan(name=peer.name, mode=Mode.HOST_GW,
                    routes=tuple(Route(dst=cidr, gateway=peer.public_ip, ifname=local.underlay_ifname,
                                       onlink=False) for cidr in cidrs))
