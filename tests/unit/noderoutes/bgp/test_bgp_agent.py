"""The BGP backend's agent logic on the fakes: who peers with whom (topology), which learnt
routes reach main (only admitted peers' own CIDRs), `auto` preferring a learnt route to a tunnel,
the speaker reloading BIRD only on change and never restarting it for one, and the parser of
BIRD's `show protocols all` on captured real output."""
from __future__ import annotations

from ipaddress import IPv4Address, IPv4Network, ip_network
from pathlib import Path

import pytest

from netagent.noderoutes.bgp.control import BirdError
from netagent.noderoutes.bgp.fake_control import FakeBird
from netagent.noderoutes.bgp.fake_learnt import FakeLearntRoutes
from netagent.noderoutes.routing.bgp import LearntTable
from netagent.noderoutes.bgp.model import PeerRole
from netagent.noderoutes.bgp.speaker import BgpSpeaker
from netagent.noderoutes.bgp.status import parse_protocols
from netagent.noderoutes.bgp.supervisor import MAX_BACKOFF, restart_delay
from netagent.noderoutes.bgp.topology import BgpNode, ExternalPeer, TopologySettings, compose_node_config
from netagent.noderoutes.routing.fake_kernel import FakeKernel
from netagent.noderoutes.routing.model import (
    LocalNode,
    Mode,
    Peer,
    PeerBounds,
    Route,
    RoutingSettings,
    pod_mtu,
)
from netagent.noderoutes.routing.plan import render_plan
from netagent.noderoutes.routing.routes import RouteManager

GOLDEN = Path(__file__).resolve().parents[2] / "golden" / "bgp"
UNDERLAY = IPv4Network("192.0.2.0/24")
BOUNDS = PeerBounds(cluster_cidrs=(IPv4Network("10.244.0.0/16"),))
N = ip_network


def node(i: int, *, reflector: bool = False) -> BgpNode:
    return BgpNode(f"node{i}", IPv4Address(f"192.0.2.{i}"), (N(f"10.244.{i}.0/24"),), reflector=reflector)


def local_node(i: int = 1) -> LocalNode:
    return LocalNode(name=f"node{i}", vtep_mac=f"02:00:00:00:00:{i:02x}", public_ip=IPv4Address(f"192.0.2.{i}"), underlay_ifname="eth0",
                     underlay_network=UNDERLAY, underlay_mtu=1500, pod_cidrs=(N(f"10.244.{i}.0/24"),))


def peer(i: int, ip: str | None = None, *cidrs) -> Peer:
    return Peer(name=f"node{i}", public_ip=IPv4Address(ip or f"192.0.2.{i}"),
                pod_cidrs=tuple(N(c) for c in cidrs) or (N(f"10.244.{i}.0/24"),))


def learnt(dst: str, gw: str) -> Route:
    return Route(dst=N(dst), gateway=IPv4Address(gw), ifname="eth0")


# ---------------------------------------------------------------- topology

def test_full_mesh_peers_with_every_admitted_node_accepting_only_its_own_cidrs():
    config = compose_node_config(node(1), [node(i) for i in (1, 2, 3, 4)], TopologySettings(),
                                 local_network=UNDERLAY)
    assert [(str(p.address), p.role, p.accept) for p in config.peers] == [
        (f"192.0.2.{i}", PeerRole.MESH, (N(f"10.244.{i}.0/24"),)) for i in (2, 3, 4)]
    assert config.own_cidrs == (N("10.244.1.0/24"),) and all(p.multihop is None for p in config.peers)


def test_reflector_clients_peer_only_with_reflectors_and_reflectors_with_everyone():
    nodes = [node(1, reflector=True), node(2, reflector=True), node(3), node(4)]
    client = compose_node_config(node(3), nodes, TopologySettings(), local_network=UNDERLAY)
    assert [(str(p.address), p.role) for p in client.peers] == [("192.0.2.1", PeerRole.REFLECTOR),
                                                                ("192.0.2.2", PeerRole.REFLECTOR)]
    assert set(client.peers[0].accept) == {N("10.244.1.0/24"), N("10.244.2.0/24"), N("10.244.4.0/24")}
    assert client.rr_cluster_id is None
    reflector = compose_node_config(nodes[0], nodes, TopologySettings(), local_network=UNDERLAY)
    assert [(str(p.address), p.role) for p in reflector.peers] == [
        ("192.0.2.2", PeerRole.REFLECTOR), ("192.0.2.3", PeerRole.REFLECTOR_CLIENT),
        ("192.0.2.4", PeerRole.REFLECTOR_CLIENT)]
    assert reflector.peers[1].accept == (N("10.244.3.0/24"),)  # a client: its own CIDR only
    assert reflector.rr_cluster_id == IPv4Address("192.0.2.1")
    assert set(reflector.reflected) == {N("10.244.2.0/24"), N("10.244.3.0/24"), N("10.244.4.0/24")}


def test_external_peers_by_subnet_and_by_node_accept_only_admitted_cidrs():
    topology = TopologySettings(mesh=False, external=(
        ExternalPeer(IPv4Address("192.0.2.254"), 65001, subnet=UNDERLAY),
        ExternalPeer(IPv4Address("198.51.100.1"), 65002, subnet=N("198.51.100.0/24"))))
    config = compose_node_config(node(1), [node(1), node(2), node(3)], topology, local_network=UNDERLAY,
                                 node_peers=(ExternalPeer(IPv4Address("203.0.113.9"), 65003, password="k"),))
    assert [(str(p.address), p.asn, p.multihop) for p in config.peers] == [  # the operator's first
        ("192.0.2.254", 65001, None), ("203.0.113.9", 65003, 255)]
    assert all(set(p.accept) == {N("10.244.2.0/24"), N("10.244.3.0/24")} for p in config.peers)
    assert config.peers[1].password == "k"


def test_our_own_cidr_is_never_accepted_even_when_another_node_claims_it():
    thief = BgpNode("node9", IPv4Address("192.0.2.9"), (N("10.244.1.0/24"), N("10.244.9.0/24")))
    config = compose_node_config(node(1), [thief], TopologySettings(), local_network=UNDERLAY)
    assert config.peers[0].accept == (N("10.244.9.0/24"),)


# ---------------------------------------------------------------- plan: what reaches main

def test_bgp_plan_copies_only_admitted_peers_own_cidrs():
    learnt_routes = {r.dst: r for r in (learnt("10.244.2.0/24", "192.0.2.2"), learnt("10.99.0.0/24", "192.0.2.3"),
                                        learnt("10.244.3.0/24", "192.0.2.3"))}
    peers = [peer(2), peer(3, None, "10.244.3.0/24"), peer(5, "192.0.2.5", "10.250.0.0/24")]
    plan = render_plan(local_node(), peers, RoutingSettings(mode=Mode.BGP), bounds=BOUNDS, learnt=learnt_routes)
    routes = {str(r.dst): str(r.gateway) for p in plan.peers.values() for r in p.routes}
    assert routes == {"10.244.2.0/24": "192.0.2.2", "10.244.3.0/24": "192.0.2.3"}
    assert "node5" in plan.refused  # outside the cluster CIDR: refused, its routes never copied
    assert plan.devices == () and pod_mtu(Mode.BGP, Mode.VXLAN, 1500) == 1500


def test_auto_uses_a_learnt_route_across_subnets_and_encapsulation_only_without_one():
    far = peer(7, "198.51.100.7", "10.244.7.0/24")
    settings = RoutingSettings(mode=Mode.AUTO)
    without = render_plan(local_node(), [far], settings, bounds=BOUNDS, learnt={})
    assert "node7" not in without.peers or without.peers["node7"].mode is Mode.VXLAN
    route = learnt("10.244.7.0/24", "192.0.2.254")  # through the operator's router (an external peer)
    plan = render_plan(local_node(), [far], settings, bounds=BOUNDS,
                       learnt=LearntTable({route.dst: route}, trusted_next_hops=[route.gateway]))
    assert plan.peers["node7"].mode is Mode.BGP and plan.peers["node7"].routes == (route,)


def test_route_manager_follows_the_learnt_table_with_our_protocol():
    kernel = FakeKernel()
    kernel.add_link("eth0", addresses=("192.0.2.1/24",))
    table = FakeLearntRoutes()
    manager = RouteManager(kernel=kernel, settings=RoutingSettings(mode=Mode.BGP), local=local_node(),
                           bounds=BOUNDS, learnt=table.dump)
    manager.sync_all([peer(2), peer(3)])
    assert kernel.dump_routes() == []
    table.learn(learnt("10.244.2.0/24", "192.0.2.2"))
    report = manager.apply_changes(upserts=(), removals=())
    assert kernel.dump_routes() == [learnt("10.244.2.0/24", "192.0.2.2")] and report.peers_by_mode["bgp"] == 2
    table.forget(N("10.244.2.0/24"))
    manager.apply_changes(upserts=(), removals=())
    assert kernel.dump_routes() == []


# ---------------------------------------------------------------- the speaker on a fake BIRD

def speaker() -> tuple:
    bird, table = FakeBird(), FakeLearntRoutes()
    return BgpSpeaker(bird=bird, learnt=table, topology=TopologySettings()), bird


def test_speaker_reloads_only_on_change_and_never_restarts_for_it():
    bgp, bird = speaker()
    assert bgp.configure(node(1), [node(2)], local_network=UNDERLAY)
    assert (bird.starts, bird.configures) == (1, 0)
    assert not bgp.configure(node(1), [node(2)], local_network=UNDERLAY)
    assert bgp.configure(node(1), [node(2), node(3)], local_network=UNDERLAY)
    assert (bird.starts, bird.configures, bird.restarts) == (1, 1, 0)
    assert "neighbor 192.0.2.3 as 64512;" in bird.text
    assert bgp.learnt_routes.blackholes == {N("10.244.1.0/24")}  # ours, dropped in the kernel when unknown


def test_a_refused_text_keeps_the_previous_configuration():
    bgp, bird = speaker()
    bgp.configure(node(1), [node(2)], local_network=UNDERLAY)
    before = bird.text
    bird.refuse = "192.0.2.3"
    with pytest.raises(BirdError):
        bgp.configure(node(1), [node(2), node(3)], local_network=UNDERLAY)
    assert bird.text == before and bird.running


def test_a_crashed_bird_is_reported_and_started_again():
    bgp, bird = speaker()
    bgp.configure(node(1), [node(2)], local_network=UNDERLAY)
    bird.crash()
    assert bgp.health_error().startswith("BIRD is not running")
    bgp.configure(node(1), [node(2)], local_network=UNDERLAY)
    assert bird.running and bird.restarts == 1 and bgp.health_error() == ""


def test_restart_backoff_grows_and_is_capped():
    assert [restart_delay(n) for n in (1, 2, 3, 4)] == [0.5, 1.0, 2.0, 4.0]
    assert restart_delay(50) == MAX_BACKOFF


# ---------------------------------------------------------------- show protocols all

def test_parse_an_established_session_from_real_output():
    [session] = parse_protocols((GOLDEN / "show_protocols_up.txt").read_text())
    assert (session.neighbor, session.neighbor_as, session.bgp_state, session.up) == \
        ("192.168.7.2", 64512, "Established", True)
    assert (session.imported, session.exported, session.last_error) == (1, 1, "")
    assert session.since.count(":") == 2 and session.as_dict()["routesImported"] == 1


def test_parse_a_session_that_went_down_from_real_output():
    [session] = parse_protocols((GOLDEN / "show_protocols_down.txt").read_text())
    assert (session.state, session.bgp_state, session.up) == ("start", "Active", False)
    assert session.last_error == "Received: Administrative shutdown"


@pytest.mark.parametrize("text", ["", "garbage\n  more garbage: x\n", "BIRD 2.0.12 ready.\n",
                                  "p1 BGP --- up\n  Neighbor AS: lots\n  Routes: x imported\n"])
def test_parser_tolerates_unexpected_text(text):
    for session in parse_protocols(text):
        assert session.neighbor_as is None


# ---------------------------------------------------------------- status and metrics

def test_status_renders_sessions_as_text_and_json():
    import json

    from netagent.daemon.status_bgp import render_bgp_status
    sessions = parse_protocols((GOLDEN / "show_protocols_down.txt").read_text())
    text = render_bgp_status(sessions, as_json=False)
    assert text.splitlines()[1].split()[:3] == ["192.168.7.2", "64512", "Active"]
    assert text.endswith("Received: Administrative shutdown")
    [peer_json] = json.loads(render_bgp_status(sessions, as_json=True))["peers"]
    assert peer_json["neighbor"] == "192.168.7.2" and peer_json["lastError"] == "Received: Administrative shutdown"


def test_metrics_read_the_sessions_and_survive_a_bird_that_is_down():
    from netagent.infra.metrics import Registry
    bgp, bird = speaker()
    registry = Registry()
    bgp.register_metrics(registry)
    bgp.configure(node(1), [node(2)], local_network=UNDERLAY)
    bird.protocols_output = (GOLDEN / "show_protocols_up.txt").read_text()
    text = registry.render()
    assert 'netagent_bgp_session_up{peer="192.168.7.2"} 1' in text
    assert 'netagent_bgp_routes{peer="192.168.7.2",direction="imported"} 1' in text
    bird.crash()
    assert "netagent_bgp_session_up{" not in registry.render()
