"""`BgpSpeaker`: the agent's side of BGP in one place: configure BIRD from the cluster's view,
read what it learnt, report its health and its sessions.

Each routing sync calls `configure` with this node and the Nodes the plan admitted; the text is
rendered (`bird_config.py`) from the composed `BgpNodeConfig` (`topology.py`) and handed to the
`BirdControl` (`supervisor.py` or `fake_control.py`), which reloads BIRD only when the text
changed. `learnt()` is the `RouteManager`'s source of BGP routes (`learnt.py`); changes in our
table poke the routing runner through `watch_learnt`. So a new Node becomes a BIRD session in
one sync, and its announced CIDR a route in main in the sync its arrival in our table triggers.
"""
from __future__ import annotations

import logging
from ipaddress import IPv4Network
from typing import Callable, Iterable

from netagent.noderoutes.bgp.bird_config import render_bird_config
from netagent.noderoutes.bgp.control import BirdControl, BirdError, BirdHealth
from netagent.noderoutes.bgp.learnt import LearntRoutes
from netagent.noderoutes.bgp.status import SessionStatus, parse_protocols
from netagent.noderoutes.bgp.topology import BgpNode, TopologySettings, compose_node_config

log = logging.getLogger("netagent.bgp")


class BgpSpeaker:
    def __init__(self, *, bird: BirdControl, learnt: LearntRoutes, topology: TopologySettings) -> None:
        self.bird = bird
        self.learnt_routes = learnt
        self.topology = topology
        self.node_peers: tuple = ()   # ExternalPeer, ... from this Node's annotation
        self.last_text: str | None = None

    def configure(self, local: BgpNode, admitted: Iterable[BgpNode], *, local_network: IPv4Network) -> bool:
        """Make BIRD run the configuration for this view; True when BIRD was reconfigured."""
        config = compose_node_config(local, admitted, self.topology, local_network=local_network,
                                     node_peers=self.node_peers)
        text = render_bird_config(config)
        changed = self.bird.apply_config(text)
        self.bird.ensure_running()
        if changed:
            log.info("BIRD configured: %d peer(s)", len(config.peers))
        self.last_text = text
        return changed

    def learnt(self) -> dict:
        return self.learnt_routes.dump()

    def watch_learnt(self, callback: Callable[[], None]) -> None:
        self.learnt_routes.watch(callback)

    def sessions(self) -> list[SessionStatus]:
        return parse_protocols(self.bird.show_protocols())

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
