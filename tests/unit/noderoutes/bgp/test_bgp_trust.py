"""Routing trust comes from the operator, never from a Node (issue 29, items 1 and 2), through the
node agent on the fakes (`test_bgp_node_agent.BgpWorld`: the real agent, speaker, planner and
renderer; BIRD and its table faked) and through the pure composition:

- a Node labelling itself `netagent.io/route-reflector=true` (any kubelet may set that label on
  its own Node) changes no session of another node; only the `node-restriction.kubernetes.io/`
  label, which NodeRestriction keeps from kubelets, makes a reflector, and a reflector label
  outside that prefix is refused (flag and ConfigMap);
- the operator's external peers are added first and keep their AS and password; a Node whose
  public IP is an external peer's, a gateway of this node or one of this node's addresses is
  refused (a rejection of the plan: an Event) and gets no session, its CIDR accepted from no one;
- a learnt route is copied into main only through its owner's address (or an operator's
  external peer): a peer announcing another node's CIDR through itself intercepts nothing.
"""
from __future__ import annotations

import re
from ipaddress import IPv4Address, IPv4Network

import pytest

from netagent.infra.sync_runner import SyncKind
from netagent.noderoutes.bgp.cluster_config import check_label, is_reflector
from netagent.noderoutes.routing.bgp import LearntTable, render_bgp_peer, skipped_routes
from netagent.noderoutes.bgp.model import BgpConfigError, PeerRole
from netagent.noderoutes.bgp.topology import (
    REFLECTOR_LABEL,
    BgpNode,
    ExternalPeer,
    TopologySettings,
    compose_node_config,
)
from netagent.noderoutes.routing.model import (
    LocalNode,
    Mode,
    Peer,
    PeerBounds,
    RefusalReason,
    Route,
    RoutingSettings,
)
from netagent.noderoutes.routing.plan import render_plan
from tests.unit.noderoutes.node_agent_support import node
from tests.unit.noderoutes.bgp.test_bgp_node_agent import BgpWorld

OLD_LABEL = "netagent.io/route-reflector"
TOR = IPv4Address("198.18.16.2")
TOR_CONFIG = {"metadata": {"name": "netagent-bgp", "namespace": "kube-system"},
              "data": {"externalPeers": '[{"address": "198.18.16.2", "as": 65000, "password": "tor key"}]'}}
N = IPv4Network


def neighbours(text: str) -> dict:
    """BIRD text -> {peer address: "as N"}."""
    return dict(re.findall(r"neighbor (\S+) (as \d+);", text))


def labelled(name: str, index: int, label: str, **fields) -> dict:
    obj = node(name, index, **fields)
    obj["metadata"]["labels"] = {label: "true"}
    return obj


# ---------------------------------------------------------------- item 1: reflector roles

def test_a_node_labelling_itself_a_reflector_changes_no_session_of_another_node():
    world = BgpWorld()
    world.put(labelled("node-3", 3, OLD_LABEL))  # what node-3's kubelet may write on its own Node
    world.sync(SyncKind.FULL)
    text = world.bird.text
    assert neighbours(text) == {"198.18.16.12": "as 64512", "198.18.16.13": "as 64512"}  # the mesh stays
    assert "rr client" not in text and "rr cluster id" not in text
    # node-3 may announce its own CIDR only, not everyone's
    assert re.search(r"filter import4_peer4_198_18_16_13 \{\n  if net ~ \[ 10\.244\.3\.0/24 \] then accept;", text)


def test_the_operators_node_restriction_label_still_makes_a_reflector():
    world = BgpWorld()
    world.put(labelled("node-3", 3, REFLECTOR_LABEL))  # set by the operator: NodeRestriction bars kubelets
    world.sync(SyncKind.FULL)
    assert neighbours(world.bird.text) == {"198.18.16.13": "as 64512"}  # a client peers with its reflector only


def test_a_reflector_label_a_kubelet_could_set_is_refused_from_the_configmap_and_the_flag():
    world = BgpWorld(config_map={"metadata": {"name": "netagent-bgp", "namespace": "kube-system"},
                                 "data": {"reflectorLabel": OLD_LABEL}})
    world.put(labelled("node-3", 3, OLD_LABEL))
    world.sync(SyncKind.FULL)
    assert set(neighbours(world.bird.text)) == {"198.18.16.12", "198.18.16.13"}
    [refusal] = world.bgp_rejections.snapshot()
    assert refusal.ref.kind == "ConfigMap" and "node-restriction.kubernetes.io/" in refusal.detail
    for label in (OLD_LABEL, "kubernetes.io/hostname", "node.kubernetes.io/rr", "node-restriction.kubernetes.io/"):
        with pytest.raises(BgpConfigError):
            check_label(label)
    assert check_label(REFLECTOR_LABEL) == REFLECTOR_LABEL
    # and a TopologySettings built around the check still reads no untrusted label
    assert not is_reflector(labelled("x", 5, OLD_LABEL), OLD_LABEL)
    assert is_reflector(labelled("x", 5, REFLECTOR_LABEL), REFLECTOR_LABEL)


def test_the_daemons_default_reflector_label_is_the_trusted_one():
    import argparse

    from netagent.daemon.bgp_start import add_bgp_flags
    parser = argparse.ArgumentParser()
    add_bgp_flags(parser)
    assert check_label(parser.parse_args([]).bgp_reflector_label) == REFLECTOR_LABEL


# ---------------------------------------------------------------- item 2: external peers win

def test_a_node_announcing_the_tors_address_is_refused_and_the_tor_session_kept():
    world = BgpWorld(config_map=TOR_CONFIG)
    world.put(node("node-4", 4, public_ip=str(TOR)))
    world.sync(SyncKind.FULL)
    text = world.bird.text
    assert neighbours(text) == {"198.18.16.2": "as 65000", "198.18.16.12": "as 64512", "198.18.16.13": "as 64512"}
    assert 'password "tor key";' in text
    assert "10.244.4.0" not in text  # its CIDR accepted from no one
    assert world.rejected()["node-4"] == RefusalReason.RESERVED.value  # an Event on node-4
    [refusal] = [r for r in world.rejections.snapshot() if r.ref.name == "node-4"]
    assert "external BGP peer 198.18.16.2" in refusal.detail


def test_a_node_announcing_a_gateway_or_another_address_of_this_node_is_refused():
    world = BgpWorld()
    world.table.main_gateways = (IPv4Address("198.18.16.1"),)
    world.kernel.add_link("eth1", addresses=("198.18.30.5/32",))   # read again at every sync
    world.put(node("node-5", 5, public_ip="198.18.16.1"))
    world.put(node("node-6", 6, public_ip="198.18.30.5"))
    world.sync(SyncKind.FULL)
    assert set(neighbours(world.bird.text)) == {"198.18.16.12", "198.18.16.13"}
    assert {name: world.rejected()[name] for name in ("node-5", "node-6")} == {"node-5": "reserved",
                                                                              "node-6": "reserved"}
    details = {r.ref.name: r.detail for r in world.rejections.snapshot()}
    assert "a gateway of this node" in details["node-5"] and "this node's address on eth1" in details["node-6"]


def local(name: str = "node1", address: str = "192.0.2.1", cidr: str = "10.244.1.0/24") -> BgpNode:
    return BgpNode(name, IPv4Address(address), (N(cidr),))


def test_compose_adds_the_operators_external_peers_first_and_leaves_a_node_on_their_address_out():
    tor = ExternalPeer(IPv4Address("192.0.2.254"), 65000, password="k")
    thief = BgpNode("node9", IPv4Address("192.0.2.254"), (N("10.244.9.0/24"),), reflector=True)
    honest = BgpNode("node2", IPv4Address("192.0.2.2"), (N("10.244.2.0/24"),))
    for mesh in (True, False):
        config = compose_node_config(local(), [thief, honest], TopologySettings(mesh=mesh, external=(tor,)),
                                     local_network=N("192.0.2.0/24"))
        by_address = {str(p.address): p for p in config.peers}
        assert by_address["192.0.2.254"].role is PeerRole.EXTERNAL
        assert (by_address["192.0.2.254"].asn, by_address["192.0.2.254"].password) == (65000, "k")
        assert all(N("10.244.9.0/24") not in p.accept for p in config.peers)
        assert ("192.0.2.2" in by_address) is mesh
    # an annotation peer (this Node's own choice) takes no address in use
    config = compose_node_config(local(), [honest], TopologySettings(external=(tor,)), local_network=N("192.0.2.0/24"),
                                 node_peers=(ExternalPeer(IPv4Address("192.0.2.2"), 65009),
                                             ExternalPeer(IPv4Address("192.0.2.254"), 65009)))
    assert {(str(p.address), p.asn) for p in config.peers} == {("192.0.2.254", 65000), ("192.0.2.2", 64512)}


def test_admission_refuses_a_reserved_public_ip_in_every_mode():
    me = LocalNode(name="node1", vtep_mac="0e:00:00:00:00:01", public_ip=IPv4Address("192.0.2.1"), underlay_ifname="eth0",
                   underlay_network=N("192.0.2.0/24"), underlay_mtu=1500, pod_cidrs=(N("10.244.1.0/24"),))
    peers = [Peer("tor-thief", IPv4Address("192.0.2.254"), (N("10.244.9.0/24"),)),
             Peer("node2", IPv4Address("192.0.2.2"), (N("10.244.2.0/24"),), vtep_mac="0e:00:00:00:00:02")]
    learnt = LearntTable({}, reserved=[(IPv4Address("192.0.2.254"), "the external BGP peer 192.0.2.254")])
    bounds = PeerBounds(cluster_cidrs=(N("10.244.0.0/16"),))
    for mode in (Mode.BGP, Mode.HOST_GW, Mode.VXLAN, Mode.AUTO):
        plan = render_plan(me, peers, RoutingSettings(mode=mode), bounds=bounds, learnt=learnt)
        assert set(plan.refused) == {"tor-thief"} and "node2" in plan.peers
        assert plan.refused["tor-thief"].label is RefusalReason.RESERVED
    plan = render_plan(me, peers, RoutingSettings(mode=Mode.VXLAN), bounds=bounds, learnt=None)
    assert not plan.refused  # without BGP nothing names the router


# ---------------------------------------------------------------- the mirror: the owner's next hop only

def learnt_route(dst: str, via: str) -> Route:
    return Route(dst=N(dst), gateway=IPv4Address(via), ifname="eth0")


def test_a_learnt_route_through_another_address_than_its_owner_is_not_copied():
    world = BgpWorld(config_map=TOR_CONFIG)
    registry = world.agent.metrics.registry  # the speaker's metrics are the agent's
    world.sync(SyncKind.FULL)
    world.table.learn(learnt_route("10.244.2.0/24", "198.18.16.13"))  # node-2's CIDR through node-3
    world.table.learn(learnt_route("10.244.3.0/24", "198.18.16.13"))  # node-3's own
    world.sync()
    assert world.overlay_routes() == {N("10.244.3.0/24"): learnt_route("10.244.3.0/24", "198.18.16.13")}
    assert world.speaker.skipped == {(N("10.244.2.0/24"), IPv4Address("198.18.16.13")): "node-2"}
    assert "netagent_bgp_routes_skipped 1" in registry.render()
    world.table.learn(learnt_route("10.244.2.0/24", str(TOR)))  # through the operator's router: copied
    world.sync()
    assert world.overlay_routes()[N("10.244.2.0/24")].gateway == TOR
    assert world.speaker.skipped == {}


def test_mirror_copies_only_through_the_owner_or_a_trusted_next_hop():
    owner = Peer("node2", IPv4Address("192.0.2.2"), (N("10.244.2.0/24"),))
    via_thief = {N("10.244.2.0/24"): learnt_route("10.244.2.0/24", "192.0.2.9")}
    assert render_bgp_peer(owner, owner.pod_cidrs, via_thief).routes == ()
    assert skipped_routes(owner, owner.pod_cidrs, via_thief) == tuple(via_thief.values())
    direct = {N("10.244.2.0/24"): learnt_route("10.244.2.0/24", "192.0.2.2")}
    assert render_bgp_peer(owner, owner.pod_cidrs, direct).routes[0].gateway == IPv4Address("192.0.2.2")
    trusted = LearntTable(via_thief, trusted_next_hops=[IPv4Address("192.0.2.9")])
    assert len(render_bgp_peer(owner, owner.pod_cidrs, trusted).routes) == 1
