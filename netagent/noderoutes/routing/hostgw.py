"""host-gw mode: per peer, a route to each of its pod CIDRs via its underlay address.

No device and no encapsulation: the underlay itself carries pod packets, so the peer must
be directly reachable on the underlay's L2 segment (its public IP inside the connected
prefix of our underlay address: `on_underlay_subnet`). A peer elsewhere would need a router
that knows pod CIDRs, which the underlay does not: such a peer is `Refused` with the reason
(the agent reports it), never programmed. The same test is auto mode's choice (`auto.py`:
host-gw on our subnet, BGP or encapsulation beyond it), which is why it is a function here.

Like every mode module it renders one family: the planner hands it that family's `LocalNode`
and the peer projected onto the family (`Peer.in_family`), so IPv6 is the same route in IPv6
addresses. The routes live on a device we share with everyone else, which is why they carry
our route protocol (`owned.ROUTE_PROTOCOL`): drift repair and `netagent cleanup` find ours by it.
"""
from __future__ import annotations

from netagent.noderoutes.routing.model import LocalNode, Mode, Peer, PeerPlan, Refused, Route


def on_underlay_subnet(local: LocalNode, peer: Peer) -> bool:
    return peer.public_ip in local.underlay_network


def render_host_gw_peer(local: LocalNode, peer: Peer, cidrs: tuple) -> PeerPlan | Refused:
    """`<cidr> via <peer public IP> dev <underlay>` for each of the peer's `cidrs` (the planned family's)."""
    if not on_underlay_subnet(local, peer):
        return Refused(f"public IP {peer.public_ip} is not on this node's underlay subnet "
                       f"{local.underlay_network} ({local.underlay_ifname}); host-gw needs all nodes "
                       f"on one L2 segment (use vxlan, ipip or auto across subnets)")
    return PeerPlan(name=peer.name, mode=Mode.HOST_GW,
                    routes=tuple(Route(dst=cidr, gateway=peer.public_ip, ifname=local.underlay_ifname,
                                       onlink=False) for cidr in cidrs))
