"""Which BGP-learnt routes reach the main table: the admitted peers' own pod CIDRs, nothing else.

BIRD 2's kernel protocol writes routes with its own route protocol (`bird`, 12) and has no option
to write another, so it exports to a table of ours (`owned.BGP_ROUTE_TABLE`) and the agent copies
from there into main with route protocol 78 (`owned.ROUTE_PROTOCOL`), through the same diffing
reconciler as every other mode (`routing/routes.py`), so `netagent cleanup` and drift repair find
them like any other route of ours. The copy is a second filter after BIRD's import filters: only
a route whose destination is exactly a pod CIDR of a peer that `routing/admission.py` admitted
is copied (`render_bgp_peer`), with the next hop and device BIRD resolved for it.

Graceful restart: the table's routes stay while BIRD is down (`persist`; kill -9 removes nothing)
and while a restarted BIRD re-converges (`-R`), so the copies in main stay too.
"""
from __future__ import annotations

from typing import Mapping

from netagent.noderoutes.routing.model import Mode, Peer, PeerPlan, Route


def learnt_for(cidrs: tuple, learnt: Mapping) -> tuple:
    """The learnt routes (as found in our table) whose destination is exactly one of `cidrs`."""
    return tuple(learnt[cidr] for cidr in cidrs if cidr in learnt)


def render_bgp_peer(peer: Peer, cidrs: tuple, learnt: Mapping) -> PeerPlan:
    """An admitted peer's routes in main: a copy of each learnt route to one of its `cidrs`
    (none learnt yet: an empty plan; the peer is admitted, BIRD has not heard of it yet)."""
    routes = tuple(Route(dst=route.dst, gateway=route.gateway, ifname=route.ifname, onlink=False)
                   for route in learnt_for(cidrs, learnt) if route.gateway is not None and route.ifname)
    return PeerPlan(name=peer.name, mode=Mode.BGP, routes=routes)
