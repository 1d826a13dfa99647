"""This node's own addresses are read again at every sync, not once at start (issue 29, item 11).

Admission refuses a peer that announces one of this node's addresses as its public IP, or a pod
CIDR over one of its networks (`PeerBounds.reserved`); an address added after the agent started
(a second interface, a floating IP) used to be unknown to it until a restart, so a Node could claim
it. Through the agent over the fakes (`node_agent_support.AgentHarness`): the kernel's links
change under a running agent and the next sync, partial or full, judges peers by them.
"""
from __future__ import annotations

from ipaddress import IPv4Network

from netagent.infra.sync_runner import SyncKind
from tests.unit.noderoutes.node_agent_support import AgentHarness, node


def test_an_address_added_after_start_is_refused_to_a_peer_at_the_next_sync():
    world = AgentHarness()
    world.sync(SyncKind.FULL)
    taker = node("node-9", 9, public_ip="203.0.113.7", created="2026-02-01T00:00:00Z")
    world.put(taker)
    world.sync()
    assert "node-9" not in world.rejected()   # nobody's address yet: an ordinary peer
    world.kernel.add_link("eth1", addresses=("203.0.113.7/24",))   # now this node's
    world.sync()
    assert world.rejected() == {"node-9": "reserved"}
    assert IPv4Network("10.244.9.0/24") not in world.overlay_routes()
    world.kernel.delete_link("eth1")   # gone again: the peer is accepted at the next (full) sync
    world.sync(SyncKind.FULL)
    assert "node-9" not in world.rejected() and IPv4Network("10.244.9.0/24") in world.overlay_routes()


def test_a_network_added_after_start_cannot_be_claimed_as_a_pod_cidr():
    world = AgentHarness()
    world.sync(SyncKind.FULL)
    world.kernel.add_link("eth1", addresses=("10.244.50.1/24",))   # a network of this node's, inside the cluster
    world.put(node("node-50", 50, created="2026-02-01T00:00:00Z"))   # claims 10.244.50.0/24
    world.sync()
    assert world.rejected() == {"node-50": "reserved"}
    assert IPv4Network("10.244.50.0/24") not in world.overlay_routes()
