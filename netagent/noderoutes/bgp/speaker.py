"""`BgpSpeaker`: the agent's side of BGP in one place: configure BIRD from the cluster's view,
read what it learnt, report its health and its sessions.

Each routing sync calls `configure` with this node and the Nodes the plan admitted; the text is
rendered (`bird_config.py`) from the composed `BgpNodeConfig` (`topology.py`) and handed to the
`BirdControl` (`supervisor.py` or `fake_control.py`), which reloads BIRD only when the text
changed. `learnt()` is the `RouteManager`'s source of BGP routes (`learnt.py`); changes in our
table poke the routing runner through `watch_learnt`. So a new Node becomes a BIRD session in
one sync, and its announced CIDR a route in main in the sync its arrival in our table triggers.

Trust comes from the operator: the reflector label is read only under
`node-restriction.kubernetes.io/` (`cluster_config.is_reflector`); `learnt()` hands the planner a
`routing/bgp.LearntTable` naming the operator's external peers (trusted next hops) and the addresses no
Node may hold (external peers, this node's gateways, `reserved()`), so `routing/admission.py`
refuses such a Node in the plan (an Event through the agent's rejections) and `topology.py`
never gives it a session; a learnt route through any other next hop than its owner is skipped,
counted (`netagent_bgp_routes_skipped`) and logged once.
"""
from __future__ import annotations

import logging
from ipaddress import IPv4Address, IPv4Network
from typing import Callable, Iterable

from netagent.kernel.families import IpFamily
from netagent.infra.rejections import ObjectRef, RejectionScope, standalone
from netagent.noderoutes.bgp.bird_config import render_bird_config
from netagent.noderoutes.bgp.cluster_config import (
    PEERS_ANNOTATION,
    is_reflector,
    node_annotation,
    parse_node_peers,
    parse_topology,
)
from netagent.noderoutes.bgp.control import BirdControl, BirdError, BirdHealth
from netagent.noderoutes.bgp.learnt import LearntRoutes
from netagent.noderoutes.routing.bgp import LearntTable, skipped_routes
from netagent.noderoutes.bgp.status import SessionStatus, parse_protocols
from netagent.noderoutes.bgp.topology import BgpNode, TopologySettings, compose_node_config, screen_nodes
from netagent.noderoutes.bgp.topology import reserved_addresses as topology_reserved

log = logging.getLogger("netagent.bgp")


class BgpSpeaker:
    def __init__(self, *, bird: BirdControl, learnt: LearntRoutes, topology: TopologySettings,
                 rejections: RejectionScope | None = None,
                 topology_source: Callable[[], object] = lambda: None,
                 reserved: Callable[[], Iterable] = lambda: ()) -> None:
        """`topology` holds the defaults (flags); `topology_source()` returns the topology ConfigMap
        (a raw object from its watch, or None), whose values override them one by one; `reserved()`
        ((address, what), ...) further addresses no Node may peer from (the API server's)."""
        self.rejections = rejections if rejections is not None else standalone("bgp")
        self.defaults = topology
        self.topology_source = topology_source
        self._poke: Callable[[], None] = lambda: None
        self.bird = bird
        self.learnt_routes = learnt
        self.topology = topology
        self.node_peers: tuple = ()   # ExternalPeer, ... from this Node's annotation
        self.last_text: str | None = None
        self.reserved = reserved
        self.skipped: dict = {}       # (destination, next hop) -> owner: learnt routes never copied

    def _extra_reserved(self) -> tuple:
        """(address, what), ...: this node's gateways and the caller's `reserved()`."""
        extra = [(address, f"a gateway of this node ({address})") for address in self.learnt_routes.gateways()]
        return tuple(extra) + tuple(self.reserved())

    def configure(self, local: BgpNode, admitted: Iterable[BgpNode], *, local_network: IPv4Network) -> bool:
        """Make BIRD run the configuration for this view; True when BIRD was reconfigured. A Node
        whose address is reserved (an external peer, a gateway, this node's) gets no session."""
        admitted = list(admitted)
        extra = self._extra_reserved()
        _, refused = screen_nodes(local, admitted, topology_reserved(local, self.topology, extra))
        for name, why in sorted(refused.items()):
            log.warning("BGP: no session for Node %s: %s", name, why)
        config = compose_node_config(local, admitted, self.topology, local_network=local_network,
                                     node_peers=self.node_peers, reserved=extra)
        text = render_bird_config(config)
        self.learnt_routes.ensure_blackholes(config.own_cidrs)
        changed = self.bird.apply_config(text)
        self.bird.ensure_running()
        if changed:
            log.info("BIRD configured: %d peer(s)", len(config.peers))
        self.last_text = text
        return changed

    def configure_from_cluster(self, *, node_name: str, address: IPv4Address, pod_cidrs: tuple,
                               admitted: Iterable, nodes: Callable[[str], object],
                               local_network: IPv4Network) -> bool:
        """`configure` from the node agent's view: `admitted` are the peers the plan admitted
        (`routing/model.Peer`), `nodes(name)` the raw Node objects (labels: reflectors; this Node's
        annotation: its external peers, each refused entry recorded in scope `bgp`)."""
        self._read_topology()
        label = self.topology.reflector_label
        own = nodes(node_name)
        peers, refusals = parse_node_peers(node_annotation(own, PEERS_ANNOTATION)) \
            if node_annotation(own, PEERS_ANNOTATION) is not None else ((), [])
        self.node_peers = peers
        if refusals:
            self.rejections.reject(ObjectRef.of("Node", own, key=node_name), reason="malformed",
                                   detail=f"{PEERS_ANNOTATION}: " + "; ".join(refusals[:5]))
        else:
            self.rejections.accept(kind="Node", key=node_name)
        local = BgpNode(node_name, address, tuple(c for c in pod_cidrs if IpFamily.V4.holds(c)),
                        reflector=is_reflector(own, label))
        admitted = list(admitted)
        others = [BgpNode(p.name, p.public_ip, tuple(p.pod_cidrs), reflector=is_reflector(nodes(p.name), label))
                  for p in admitted]
        self.note_skipped(admitted, self.learnt())
        return self.configure(local, others, local_network=local_network)

    def _read_topology(self) -> None:
        source = self.topology_source()
        data = source.get("data") if isinstance(source, dict) else None
        self.topology, refusals = parse_topology(data, self.defaults)
        ref = ObjectRef.of("ConfigMap", source, key="topology")
        if refusals:
            self.rejections.reject(ref, reason="malformed", detail="; ".join(refusals[:5]))
        elif source is not None:
            self.rejections.accept(kind="ConfigMap", key=ref.key)

    def poke(self) -> None:
        """Ask the agent for a sync (the topology ConfigMap changed)."""
        self._poke()

    def learnt(self) -> LearntTable:
        """Our table's routes, with the operator's trust: the external peers as trusted next hops,
        and the addresses (external peers, gateways, `reserved()`) no Node's public IP may be."""
        self._read_topology()
        reserved = [(peer.address, f"the external BGP peer {peer.address} (AS {peer.asn})")
                    for peer in self.topology.external]
        return LearntTable(self.learnt_routes.dump(), trusted_next_hops=(p.address for p in self.topology.external),
                           reserved=tuple(reserved) + self._extra_reserved())

    def note_skipped(self, admitted: Iterable, learnt: LearntTable) -> int:
        """Count and log (once each) the learnt routes to admitted peers' CIDRs whose next hop is not
        their owner's address nor trusted (`routing/bgp.skipped_routes`): never copied into main."""
        now = {}
        for peer in admitted:
            for route in skipped_routes(peer, tuple(peer.pod_cidrs), learnt):
                now[(route.dst, route.gateway)] = peer.name
        for (dst, gateway), owner in sorted(now.items(), key=str):
            if (dst, gateway) not in self.skipped:
                log.warning("BGP: route to %s via %s not copied: %s's pod CIDR, whose address is not that next hop",
                            dst, gateway, owner)
        self.skipped = now
        return len(now)

    def watch_learnt(self, callback: Callable[[], None]) -> None:
        """`callback` (the agent's sync request) on each change of our table or of the topology."""
        self._poke = callback
        self.learnt_routes.watch(callback)

    def sessions(self) -> list[SessionStatus]:
        return parse_protocols(self.bird.show_protocols())

    def register_metrics(self, registry) -> None:
        """`netagent_bgp_session_up{peer}` and `netagent_bgp_routes{peer,direction}`, read from
        BIRD when scraped (at most once a second: the status server's snapshots)."""
        def sessions() -> list[SessionStatus]:
            try:
                return self.sessions()
            except BirdError:
                return []
        registry.callback_gauge("netagent_bgp_session_up", "1 when the BGP session with the peer is established.",
                                lambda: {(s.neighbor or s.name,): 1.0 if s.up else 0.0 for s in sessions()},
                                labels=("peer",))
        registry.callback_gauge(
            "netagent_bgp_routes", "Routes imported from and exported to the peer.",
            lambda: {key: float(value) for s in sessions()
                     for key, value in (((s.neighbor or s.name, "imported"), s.imported),
                                        ((s.neighbor or s.name, "exported"), s.exported))},
            labels=("peer", "direction"))
        registry.callback_gauge(
            "netagent_bgp_routes_skipped",
            "Learnt routes to a Node's pod CIDR not copied into main: the next hop is not that Node's address.",
            lambda: float(len(self.skipped)))

    def health(self) -> BirdHealth:
        return self.bird.health()

    def health_error(self) -> str:
        """"" when BIRD runs; otherwise why not (for /healthz)."""
        health = self.bird.health()
        return "" if health.running else f"BIRD is not running: {health.detail or 'stopped'}"

    def stop(self, *, withdraw: bool) -> None:
        try:
            self.bird.stop(withdraw=withdraw)
        except BirdError as err:
            log.warning("stopping BIRD: %s", err)
        self.learnt_routes.close()
