"""The auto backend: host-gw to peers on our underlay subnet, encapsulation to the rest.

Like flannel's DirectRouting / CrossSubnet: a peer whose public IP is inside our
underlay's connected prefix is reached directly (no overhead), any other peer through the
configured encapsulation (`auto_encap`: vxlan or ipip), unless BGP is on and BIRD learnt a route
to every one of its pod CIDRs through an allowed next hop (`learnt`, `bgp.py`: the peer
itself or an operator's external peer): then that route, with no encapsulation. The choice is made per peer on
every render, so a peer that moves subnet switches mode with one route replace. The
encapsulation device always exists in this mode, even when every peer is local, because
the next peer may need it at any moment and its VTEP MAC must be announced up front.
"""
from __future__ import annotations

from typing import Mapping

from netagent.noderoutes.routing.bgp import render_bgp_peer, usable_for
from netagent.noderoutes.routing.hostgw import on_underlay_subnet, render_host_gw_peer
from netagent.noderoutes.routing.ipip import render_ipip_peer
from netagent.noderoutes.routing.model import LocalNode, Mode, Peer, PeerPlan, Pending, Refused, RoutingSettings
from netagent.noderoutes.routing.vxlan import render_vxlan_peer


def choose_mode(local: LocalNode, peer: Peer, settings: RoutingSettings, *, learnt: Mapping | None = None,
                cidrs: tuple = ()) -> Mode:
    if on_underlay_subnet(local, peer):
        return Mode.HOST_GW
    if learnt and cidrs and len(usable_for(peer, cidrs, learnt)) == len(cidrs):
        return Mode.BGP
    return settings.auto_encap


def render_auto_peer(local: LocalNode, peer: Peer, cidrs: tuple, settings: RoutingSettings, *,
                     learnt: Mapping | None = None) -> PeerPlan | Pending | Refused:
    mode = choose_mode(local, peer, settings, learnt=learnt, cidrs=cidrs)
    if mode is Mode.BGP:
        return render_bgp_peer(peer, cidrs, learnt or {})
    if mode is Mode.HOST_GW:
        return render_host_gw_peer(local, peer, cidrs)
    if mode is Mode.IPIP:
        return render_ipip_peer(peer, cidrs, settings)
    return render_vxlan_peer(peer, cidrs, settings)
