"""Routing trust with real BIRD 2 in namespaces (issue 29, items 1 and 2): no Node can take over
another node's BGP sessions or routes.

- a Node labelling itself `netagent.io/route-reflector=true` (a kubelet may) is still a mesh peer
  of every node: the others keep their sessions with each other (the speaker reads Node objects
  as the agent does, `configure_from_cluster`);
- a reflector the operator chose but that rewrites reflected routes through itself (`next hop
  self`) intercepts nothing: the client's route to another client's CIDR is never copied into
  main through the reflector;
- in mesh mode beside a top-of-rack router, a Node announcing the router's address is refused
  and the router's eBGP session (its AS) stays, pods keep reaching the other segment.

Every BIRD runs in a namespace this test made (`tests/netns/bgp_world.py`, `test_bgp_tor.py`).
"""
from __future__ import annotations

import dataclasses
import shutil
from ipaddress import IPv4Network

import pytest

from netagent.noderoutes.bgp.bird_config import render_bird_config
from netagent.noderoutes.bgp.topology import BgpNode, compose_node_config
from netagent.noderoutes.routing.model import Mode, Peer
from netagent.noderoutes.routing.vxlan import vtep_mac
from tests.netns.bgp_world import UNDERLAY, BgpNodeRunner, BgpWorld, pod_cidr
from tests.netns.test_bgp import FAST, all_routed, sessions_up, wait_for
from tests.netns.test_bgp_tor import ROUTER, TOR, TorWorld

pytestmark = pytest.mark.skipif(shutil.which("bird") is None, reason="bird2 is not installed")

OLD_LABEL = "netagent.io/route-reflector"


class ObjectRunner(BgpNodeRunner):
    """A node whose speaker reads the Node objects, as the agent's does (labels: reflectors)."""

    def _sync(self, kind) -> None:
        peers = [Peer(name=n.name, public_ip=n.address, pod_cidrs=n.cidrs, vtep_mac=vtep_mac(n.name))
                 for n in self.admitted]
        report = self.routes.sync_all(peers)
        self.report = report
        admitted = [p for p in peers if p.name not in report.refused]
        self.speaker.configure_from_cluster(node_name=self.me.name, address=self.me.address, pod_cidrs=self.me.cidrs,
                                            admitted=admitted, nodes=self.world.objects.get,
                                            local_network=self.network)


class LabelWorld(BgpWorld):
    """Nodes whose objects carry `labels` (index -> labels), read by every node's speaker."""

    def __init__(self, count: int, labels: dict) -> None:
        super().__init__(count, topology=FAST)
        self.objects = {f"node{i}": {"metadata": {"name": f"node{i}", "labels": labels.get(i, {})}}
                        for i in range(count)}

    def _build(self) -> None:
        self._wire_underlay()
        self._wire_pods()
        for i in range(self.count):
            self.nodes.append(ObjectRunner(self, i, f"{self._state.name}/n{i}"))


def neighbours(world: BgpWorld, i: int) -> set:
    return {s.neighbor for s in world.nodes[i].speaker.sessions()}


def test_a_node_labelling_itself_a_reflector_takes_no_session_of_the_others():
    with LabelWorld(3, {2: {OLD_LABEL: "true"}}) as world:
        world.start()
        wait_for(lambda: all_routed(world) and all(sessions_up(world, i, 2) for i in range(3)),
                 what="a full mesh, node 2's own label notwithstanding")
        assert neighbours(world, 0) == {"192.168.60.11", "192.168.60.12"}
        assert neighbours(world, 1) == {"192.168.60.10", "192.168.60.12"}
        assert "rr client" not in world.nodes[2].speaker.last_text
        assert world.nodes[0].main_routes()[str(pod_cidr(1))] == "192.168.60.11"
        assert wait_for(lambda: world.ping(0, 1), what="pod 0 -> pod 1")


def test_a_reflector_rewriting_next_hops_through_itself_intercepts_nothing():
    with BgpWorld(4, reflectors=(0,), topology=FAST) as world:
        world.start()
        wait_for(lambda: all_routed(world), what="every pod CIDR routed on every node")
        client, victim = world.nodes[1], str(pod_cidr(2))
        assert client.main_routes()[victim] == "192.168.60.12"
        rogue = world.nodes[0]
        rogue.runner.stop(timeout=10)  # the rogue's agent no longer rewrites its BIRD
        config = compose_node_config(rogue.me, world.view(), FAST, local_network=UNDERLAY)
        text = render_bird_config(config).replace("    export filter export4_reflected;",
                                                  "    export filter export4_reflected;\n    next hop self;")
        assert rogue.bird.apply_config(text)
        # the reflected route to node 2's CIDR now reaches node 1 through the reflector
        wait_for(lambda: client.table_routes().get(victim) == "192.168.60.10",
                 what="the rogue's next hop in node 1's BGP table")
        client.sync_now()
        main = client.main_routes()
        assert main.get(victim) != "192.168.60.10"  # never copied through the reflector
        assert [dst for dst, via in main.items() if via == "192.168.60.10"] == [str(pod_cidr(0))]  # its own only


def test_a_node_announcing_the_tors_address_keeps_the_tor_session_in_mesh_mode():
    world = TorWorld(Mode.BGP)
    world.topology = dataclasses.replace(TOR, mesh=True)  # the default: node-to-node mesh beside the ToR
    with world:
        world.start()
        node = world.nodes[0]
        wait_for(lambda: node.main_routes().get(str(pod_cidr(1))) == "192.168.61.1", what="routes through the ToR")
        thief = BgpNode("thief", ROUTER[0], (IPv4Network("10.244.9.0/24"),))
        node.set_admitted(world.view() + [thief])
        assert "thief" in node.report.refused and "external BGP peer" in node.report.refused["thief"].reason
        assert f"neighbor {ROUTER[0]} as 65000;" in node.speaker.last_text
        assert f"neighbor {ROUTER[0]} as 64512;" not in node.speaker.last_text
        assert "10.244.9.0" not in node.speaker.last_text
        wait_for(lambda: any(s.neighbor == str(ROUTER[0]) and s.up for s in node.speaker.sessions()),
                 what="the ToR session up")
        assert node.main_routes().get(str(pod_cidr(1))) == "192.168.61.1"
        assert wait_for(lambda: world.ping(0, 1), what="pod 0 -> pod 1 across the router")
