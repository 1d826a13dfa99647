"""bgp mode's routing: which BGP-learnt routes reach the main table (the admitted peers' own pod
CIDRs, through the peer itself or a trusted next hop, nothing else).

It lives here, beside `hostgw.py`, `vxlan.py` and `ipip.py`, because it is a routing mode like
them: the planner (`plan.py`, `auto.py`) renders a peer's routes from it and never imports
`noderoutes/bgp/`; the BGP speaker (`bgp/speaker.py`) fills its input, `LearntTable`, and reads
`skipped_routes` to count and log what was not copied. So `bgp/` depends on `routing/`, never
the other way round.

BIRD 2's kernel protocol writes routes with its own route protocol (`bird`, 12) and has no option
to write another, so it exports to a table of ours (`owned.BGP_ROUTE_TABLE`) and the agent copies
from there into main with route protocol 78 (`owned.ROUTE_PROTOCOL`), through the same diffing
reconciler as every other mode (`routes.py`), so `netagent cleanup` and drift repair find
them like any other route of ours. The copy is a second filter after BIRD's import filters: only
a route whose destination is exactly a pod CIDR of a peer that `admission.py` admitted
is copied (`render_bgp_peer`), and only when its next hop is that peer's own address (a mesh
peer's `next hop self`; a route reflector passes the originator's next hop on unchanged) or one
of the operator's external peers (a top-of-rack router, `LearntTable.trusted_next_hops`). So a
peer (a reflector included) that announces another node's CIDR through itself, or through any
third address, intercepts nothing: the route is skipped (`skipped_routes` says which; the
speaker counts and logs them).

`LearntTable` is what `BgpSpeaker.learnt()` hands the planner: the table's routes plus the
operator's trust (`trusted_next_hops`) and the addresses no Node may announce as its public IP
(`reserved`: external peers, this node's gateways; `admission.py` refuses such a Node).

Graceful restart: the table's routes stay while BIRD is down (`persist`; kill -9 removes nothing)
and while a restarted BIRD re-converges (`-R`), so the copies in main stay too.
"""
from __future__ import annotations

from typing import Iterable, Mapping

from netagent.noderoutes.routing.model import Mode, Peer, PeerPlan, Route


class LearntTable(dict):
    """Destination -> learnt `Route`, with the operator's trust: `trusted_next_hops` (the external
    peers' addresses) and `reserved` ((address, what it is), ...: no Node's public IP)."""

    def __init__(self, routes: Mapping | None = None, *, trusted_next_hops: Iterable = (),
                 reserved: Iterable = ()) -> None:
        super().__init__(routes or {})
        self.trusted_next_hops = frozenset(trusted_next_hops)
        self.reserved = tuple(reserved)


def trusted_next_hops(learnt: Mapping) -> frozenset:
    return learnt.trusted_next_hops if isinstance(learnt, LearntTable) else frozenset()


def reserved_addresses(learnt: Mapping | None) -> tuple:
    return learnt.reserved if isinstance(learnt, LearntTable) else ()


def learnt_for(cidrs: tuple, learnt: Mapping) -> tuple:
    """The learnt routes (as found in our table) whose destination is exactly one of `cidrs`."""
    return tuple(learnt[cidr] for cidr in cidrs if cidr in learnt)


def next_hop_allowed(owner: Peer, route: Route, trusted: frozenset) -> bool:
    """A route to `owner`'s CIDR may go through `owner` itself or an operator's external peer."""
    return route.gateway is not None and (route.gateway == owner.public_ip or route.gateway in trusted)


def usable_for(peer: Peer, cidrs: tuple, learnt: Mapping) -> tuple:
    """The learnt routes to `cidrs` that may be copied: a next hop allowed, a device known."""
    trusted = trusted_next_hops(learnt)
    return tuple(route for route in learnt_for(cidrs, learnt)
                 if route.ifname and next_hop_allowed(peer, route, trusted))


def skipped_routes(peer: Peer, cidrs: tuple, learnt: Mapping) -> tuple:
    """The learnt routes to `cidrs` whose next hop is neither `peer` nor trusted (never copied)."""
    trusted = trusted_next_hops(learnt)
    return tuple(route for route in learnt_for(cidrs, learnt)
                 if route.gateway is not None and not next_hop_allowed(peer, route, trusted))


def render_bgp_peer(peer: Peer, cidrs: tuple, learnt: Mapping) -> PeerPlan:
    """An admitted peer's routes in main: a copy of each learnt route to one of its `cidrs` whose
    next hop is allowed (none learnt yet: an empty plan; the peer is admitted, BIRD has not heard
    of it yet)."""
    routes = tuple(Route(dst=route.dst, gateway=route.gateway, ifname=route.ifname, onlink=False)
                   for route in usable_for(peer, cidrs, learnt))
    return PeerPlan(name=peer.name, mode=Mode.BGP, routes=routes)
