"""NodeAgent from `start()` on, on the fakes (`node_agent_support.AgentWorld`): its real sync runner,
lease, underlay, forwarding, announcement, lease report, masquerade and route syncs.

- start: the lease is taken and reported (pod CIDR and the pods' MTU), forwarding turned on,
  this Node announced (only what differs), masquerade and every peer programmed before it returns;
- the lease refused: no Node, no pod CIDR, a pod CIDR outside the cluster CIDR: a clear error
  and nothing written to the node;
- peer churn: Nodes added, changed and deleted become routes added, changed and removed;
- drift: what another hand removed from the kernel is restored by the next full sync.
"""
from __future__ import annotations

from collections.abc import Callable, Iterator
from ipaddress import IPv4Address, IPv4Network

import pytest

from netagent.infra.sync_runner import SyncKind, SyncResult
from netagent.kernel.sysctl import IP_FORWARD
from netagent.noderoutes import node_objects as nodes
from netagent.noderoutes.agent import AgentStartError
from netagent.noderoutes.host import Lease, Masquerade
from netagent.noderoutes.routing.model import Mode
from netagent.noderoutes.routing.vxlan import vtep_mac
from tests.unit.noderoutes.node_agent_support import LOCAL_CIDR, LOCAL_IP, LOCAL_NAME, AgentWorld, node

NET_2, NET_3 = IPv4Network("10.244.2.0/24"), IPv4Network("10.244.3.0/24")


@pytest.fixture
def started() -> Iterator[Callable[..., AgentWorld]]:
    """Start an agent over a new world of fakes; every one is stopped after the test."""
    worlds: list[AgentWorld] = []

    def start(**world) -> AgentWorld:
        made = AgentWorld(**world)
        worlds.append(made)
        made.agent.start()
        return made
    yield start
    for made in worlds:
        made.agent.stop()


def settle(world: AgentWorld, kind: SyncKind = SyncKind.PARTIAL) -> None:
    """One sync that starts after everything the test did so far, run by the agent's own runner."""
    runner = world.agent.runner
    assert runner is not None
    assert runner.run_now_and_wait(timeout=60, kind=kind) is SyncResult.SUCCEEDED, runner.status().last_error


def unannounced(name: str, index: int) -> dict:
    """A Node as the controller leaves it before its agent runs: leased, nothing announced."""
    fresh = node(name, index)
    fresh["metadata"]["annotations"] = {}
    return fresh


def test_start_takes_the_lease_announces_and_programs_everything_before_returning(started):
    world = started(masquerade=Masquerade.ON,
                    nodes=[unannounced(LOCAL_NAME, 1), node("node-2", 2), node("node-3", 3)])
    assert world.leases == [Lease(node_name=LOCAL_NAME, pod_cidrs=(LOCAL_CIDR,), mtu=1450)]  # eth0's 1500 - VXLAN
    assert world.sysctls.writes == [(IP_FORWARD.key, "1")]
    (patch,) = world.api.patches
    assert patch[0] == LOCAL_NAME and patch[1][nodes.PUBLIC_IP] == str(LOCAL_IP)
    own_mac = world.kernel.links["na-vxlan"].mac   # random per node (issue 29, item 11), announced
    assert own_mac is not None and own_mac != vtep_mac(LOCAL_NAME) and own_mac in patch[1][nodes.BACKEND_DATA]
    assert nodes.node_annotations(world.api.store.get(LOCAL_NAME)) == patch[1]  # our write came back
    assert set(world.overlay_routes()) == {NET_2, NET_3}
    assert {entry.mac for entry in world.kernel.dump_fdb("na-vxlan")} == {vtep_mac("node-2"), vtep_mac("node-3")}
    assert "NETAGENT-POSTRTG" in world.iptables.state()["nat"].chains
    assert world.agent.health().healthy


def test_a_node_that_says_what_we_would_announce_is_not_patched(started):
    world = started(mode=Mode.VXLAN)
    assert world.api.patches == [] and world.overlay_routes() == {}
    assert world.leases[0].pod_cidrs == (LOCAL_CIDR,)


@pytest.mark.parametrize("nodes_in_api, words", [
    ([node("node-2", 2)], "node node-1 does not exist"),
    ([node(LOCAL_NAME, 1, cidr="10.245.1.0/24")], "outside the cluster CIDR"),
    ([dict(node(LOCAL_NAME, 1), spec={})], "no spec.podCIDR"),
    ([dict(node(LOCAL_NAME, 1), spec={"podCIDR": "10.244.1.0/33", "podCIDRs": ["10.244.1.0/33"]})],
     "spec.podCIDR '10.244.1.0/33'"),
])
def test_a_refused_lease_is_a_clear_error_and_nothing_is_written(nodes_in_api, words):
    world = AgentWorld(nodes=nodes_in_api)
    try:
        with pytest.raises(AgentStartError, match=words):
            world.agent.start()
    finally:
        world.agent.stop()
    assert world.leases == [] and world.api.patches == [] and world.sysctls.writes == []
    assert world.kernel.writes == [] and world.agent.runner is None


@pytest.mark.parametrize("mode", [Mode.HOST_GW, Mode.VXLAN], ids=lambda m: m.value)
def test_peer_churn_becomes_routes(started, mode):
    world = started(mode=mode, nodes=[node(LOCAL_NAME, 1), node("node-2", 2)])
    assert set(world.overlay_routes()) == {NET_2}
    world.put(node("node-3", 3))
    settle(world)
    assert set(world.overlay_routes()) == {NET_2, NET_3}
    world.put(node("node-2", 2, public_ip="198.18.16.42"))  # node-2 moved
    settle(world)
    if mode is Mode.HOST_GW:
        assert world.overlay_routes()[NET_2].gateway == IPv4Address("198.18.16.42")
    else:
        fdb = {entry.mac: entry.dst for entry in world.kernel.dump_fdb("na-vxlan")}
        assert fdb[vtep_mac("node-2")] == IPv4Address("198.18.16.42")
    world.delete("node-3")
    settle(world)
    assert set(world.overlay_routes()) == {NET_2}
    writes = len(world.kernel.writes)
    heartbeat = dict(world.api.store.get("node-2"), status={"conditions": [{"type": "Ready", "status": "True"}]})
    world.put(heartbeat)
    settle(world)
    assert len(world.kernel.writes) == writes


def test_drift_is_restored_by_a_full_sync(started):
    world = started(nodes=[node(LOCAL_NAME, 1), node("node-2", 2), node("node-3", 3)])
    programmed = (world.overlay_routes(), world.kernel.dump_neighbours("na-vxlan"), world.kernel.dump_fdb("na-vxlan"))
    del world.kernel.routes[NET_2]  # another hand, behind the agent's back (records no write)
    world.kernel.neighbours.pop(("na-vxlan", NET_3.network_address))
    settle(world, SyncKind.PARTIAL)  # a partial sync trusts what it programmed
    assert NET_2 not in world.overlay_routes()
    settle(world, SyncKind.FULL)
    assert (world.overlay_routes(), world.kernel.dump_neighbours("na-vxlan"),
            world.kernel.dump_fdb("na-vxlan")) == programmed
    world.kernel.delete_link("na-vxlan")  # the device and everything on it
    settle(world, SyncKind.FULL)
    assert (world.overlay_routes(), world.kernel.dump_neighbours("na-vxlan"),
            world.kernel.dump_fdb("na-vxlan")) == programmed
