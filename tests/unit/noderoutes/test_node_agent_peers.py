"""The node agent against hostile Nodes, through its real sync over the fakes (`node_agent_support`):
one unreadable Node costs nobody else their routes, claims outside the cluster CIDR or over
reserved ranges are refused, a newcomer copying a peer's VTEP MAC loses (and is admitted once
the owner is gone), every refusal is a rejection with its reason (cleared when the Node is
fixed or deleted, listed in /healthz's details), and the agent restores its own announcement
when another writer changes it."""
from __future__ import annotations

import dataclasses
import json
from ipaddress import IPv4Address, IPv4Interface, IPv4Network, IPv6Address

import pytest

from netagent.infra.sync_runner import SyncKind, SyncResult, SyncRunner
from netagent.kernel.families import IpFamily
from netagent.noderoutes import node_objects as nodes
from netagent.noderoutes.routing.vxlan import vtep_mac
from netagent.noderoutes.agent import REASSERT_MIN_INTERVAL, own_networks
from netagent.noderoutes.underlay import InterfaceInfo, UnderlaySnapshot
from tests.unit.noderoutes.node_agent_support import CLUSTER, LOCAL_IP, AgentHarness, node


def deep_json(size: int = 20_000) -> str:
    """The issue's annotation: 20 KB of nested arrays."""
    return "[" * (size // 2) + "]" * (size // 2)


def good_cluster(harness: AgentHarness) -> None:
    for index in (2, 3):
        harness.put(node(f"node-{index}", index))


def test_a_deep_json_node_does_not_stop_the_first_full_sync():
    """On the old code json.loads raised RecursionError and the full sync failed: no routes at all."""
    harness = AgentHarness()
    good_cluster(harness)
    deep = node("node-9", 9)
    deep["metadata"]["annotations"][nodes.BACKEND_DATA] = deep_json()
    harness.put(deep)
    harness.sync(SyncKind.FULL)
    assert set(harness.overlay_routes()) == {IPv4Network("10.244.2.0/24"), IPv4Network("10.244.3.0/24")}
    assert harness.rejected() == {"node-9": "too-large"}


@pytest.mark.parametrize("spoil, label", [
    (lambda n: n["metadata"]["annotations"].update({nodes.BACKEND_DATA: "[" * 40 + "]" * 40}), "too-large"),
    (lambda n: n["metadata"]["annotations"].update({nodes.BACKEND_DATA: "{\"vtepMAC\": "}), "malformed"),
    (lambda n: n["metadata"]["annotations"].update({nodes.BACKEND_DATA: "[1]"}), "malformed"),
    (lambda n: n["metadata"]["annotations"].update({nodes.BACKEND_DATA: json.dumps({"vtepMAC": 7})}), "malformed"),
    (lambda n: n["metadata"]["annotations"].update({nodes.PUBLIC_IP: None}), "malformed"),
    (lambda n: n["metadata"]["annotations"].update({nodes.PUBLIC_IP: ["198.18.16.19"]}), "malformed"),
    (lambda n: n["metadata"]["annotations"].update({nodes.PUBLIC_IP: "x" * 100_000}), "too-large"),
    (lambda n: n["metadata"].update({"annotations": ["not", "a", "map"]}), "malformed"),
    (lambda n: n.update({"spec": "podCIDR=10.244.9.0/24"}), "malformed"),
    (lambda n: n["spec"].update({"podCIDRs": [9]}), "malformed"),
    (lambda n: n["spec"].update({"podCIDRs": "10.244.9.0/24"}), "malformed"),
    (lambda n: n["spec"].update({"podCIDRs": [f"10.244.{i}.0/24" for i in range(9, 20)]}), "too-large"),
    (lambda n: n["spec"].update({"podCIDRs": ["10.244.9.0/33"]}), "malformed"),
])
def test_one_unreadable_node_is_rejected_and_costs_no_other_node(spoil, label):
    harness = AgentHarness()
    good_cluster(harness)
    harness.sync(SyncKind.FULL)
    bad = node("node-9", 9)
    spoil(bad)
    harness.put(bad)
    harness.put(node("node-4", 4))  # arrives in the same partial sync
    harness.sync()
    assert set(harness.overlay_routes()) == {IPv4Network(f"10.244.{i}.0/24") for i in (2, 3, 4)}
    assert harness.rejected() == {"node-9": label}
    harness.sync(SyncKind.FULL)
    assert harness.rejected() == {"node-9": label}
    harness.put(node("node-9", 9))  # fixed: routed, and the rejection is cleared
    harness.sync()
    assert IPv4Network("10.244.9.0/24") in harness.overlay_routes() and harness.rejected() == {}


@pytest.mark.parametrize("cidr, label", [
    ("169.254.169.254/32", "outside-cluster-cidr"),
    ("10.96.0.0/16", "outside-cluster-cidr"),   # the lab's service range is outside 10.244/16 too
    ("198.18.16.0/20", "outside-cluster-cidr"),  # the node subnet
    ("198.18.16.12/32", "outside-cluster-cidr"),  # node-2's own underlay address
    ("10.244.1.0/25", "overlap"),                 # half of our own pod CIDR
    ("10.244.0.0/16", "overlap"),                 # the whole cluster
])
def test_claims_outside_the_cluster_cidr_never_reach_the_overlay(cidr, label):
    harness = AgentHarness()
    good_cluster(harness)
    harness.sync(SyncKind.FULL)
    harness.put(node("evil", 50, cidr=cidr))
    harness.sync()
    routes = harness.overlay_routes()
    assert set(routes) == {IPv4Network("10.244.2.0/24"), IPv4Network("10.244.3.0/24")}
    assert all(dst.subnet_of(CLUSTER) for dst in routes)
    assert harness.rejected() == {"evil": label}


def test_the_service_range_is_reserved_even_inside_the_cluster_cidr():
    harness = AgentHarness()
    harness.agent.settings = dataclasses.replace(harness.agent.settings,
                                                 service_cidrs=(IPv4Network("10.244.200.0/24"),))
    harness.agent.routed[IpFamily.V4].routes.bounds = harness.agent.bounds()
    harness.put(node("evil", 50, cidr="10.244.200.0/24"))
    harness.sync(SyncKind.FULL)
    assert harness.overlay_routes() == {} and harness.rejected() == {"evil": "reserved"}


def test_a_thief_copying_node_2s_vtep_mac_is_refused_until_node_2_is_gone():
    harness = AgentHarness()
    good_cluster(harness)
    harness.sync(SyncKind.FULL)
    thief = node("a-thief", 66, created="2026-06-01T00:00:00Z", mac=vtep_mac("node-2"))
    harness.put(thief)
    harness.sync()
    fdb = {entry.mac: entry.dst for entry in harness.kernel.dump_fdb("na-vxlan")}
    assert str(fdb[vtep_mac("node-2")]) == "198.18.16.12"  # node-2's pods stay reachable
    assert IPv4Network("10.244.66.0/24") not in harness.overlay_routes()
    assert harness.rejected() == {"a-thief": "conflict"}
    harness.delete("node-2")
    harness.sync()
    fdb = {entry.mac: entry.dst for entry in harness.kernel.dump_fdb("na-vxlan")}
    assert str(fdb[vtep_mac("node-2")]) == "198.18.16.76"
    assert IPv4Network("10.244.66.0/24") in harness.overlay_routes() and harness.rejected() == {}


def test_a_deleted_rejected_node_is_accepted_again():
    harness = AgentHarness()
    harness.put(node("evil", 50, cidr="169.254.169.254/32"))
    harness.sync(SyncKind.FULL)
    assert harness.rejected() == {"evil": "outside-cluster-cidr"}
    harness.delete("evil")
    harness.sync()
    assert harness.rejected() == {}


def test_a_rejected_node_is_listed_and_the_node_stays_healthy():
    harness = AgentHarness()
    good_cluster(harness)
    harness.put(node("evil", 50, cidr="169.254.169.254/32"))
    runner = harness.agent.runner = SyncRunner(name="node-routes", sync=harness.agent._sync, min_interval=0,
                                               max_interval=3600, retry_interval=1.0)
    filters = harness.agent.filter_loop.runner  # the tunnel filter's runner, which the route sync asks
    runner.start()
    filters.start()
    try:
        assert runner.run_now_and_wait(timeout=60, kind=SyncKind.FULL) is SyncResult.SUCCEEDED
        assert filters.run_now_and_wait(timeout=60) is SyncResult.SUCCEEDED
        report = harness.agent.health()
    finally:
        runner.stop()
        filters.stop()
    assert report.healthy  # a refused peer costs the node nothing; it is listed as rejected
    (line,) = harness.agent.rejections.health_details()
    assert "Node evil rejected (outside-cluster-cidr)" in line and "169.254.169.254/32" in line


def test_the_agent_restores_its_announcement_without_a_patch_loop():
    harness = AgentHarness()
    good_cluster(harness)
    harness.sync(SyncKind.FULL)
    assert harness.api.patches == []  # our Node already says what we announced
    wanted = dict(harness.agent._announcement)
    tampered = json.loads(json.dumps(harness.api.store.get("node-1")))
    tampered["metadata"]["annotations"][nodes.PUBLIC_IP] = "198.18.16.12"  # node-2's address
    tampered["metadata"]["annotations"]["unrelated.io/x"] = "kept"
    harness.put(tampered)
    harness.sync()
    assert harness.api.patches == [("node-1", {nodes.PUBLIC_IP: wanted[nodes.PUBLIC_IP]})]
    harness.sync()  # our own write came back through the watch: nothing more to do
    harness.sync(SyncKind.FULL)
    assert len(harness.api.patches) == 1
    assert nodes.node_annotations(harness.api.store.get("node-1"))["unrelated.io/x"] == "kept"


def test_own_networks_are_reserved_unless_they_hold_the_whole_cluster():
    """A node subnet inside the cluster CIDR is reserved; one so wide it holds the cluster CIDR
    (10.0.0.0/8 around 10.244.0.0/16) is not (every peer would be refused), but the node's own
    address still is; our pod bridge's addresses are our pod CIDR's business (an overlap)."""
    harness = AgentHarness()
    harness.agent.host_networks = own_networks(UnderlaySnapshot(interfaces=(
        InterfaceInfo(name="eth0", index=2, mtu=1500, addresses=(IPv4Interface("10.3.0.5/8"),)),
        InterfaceInfo(name="eth1", index=3, mtu=1500, addresses=(IPv4Interface("10.244.250.1/24"),)),
        InterfaceInfo(name="na0", index=4, mtu=1500, addresses=(IPv4Interface("10.244.1.1/24"),)),
        InterfaceInfo(name="lo", index=1, mtu=65536, addresses=(IPv4Interface("127.0.0.1/8"),))),
        default_route_ifindexes=(2,)))
    reserved = {str(network) for network, _ in harness.agent.bounds().reserved}
    assert reserved == {"10.96.0.0/16", "10.3.0.5/32", "10.244.250.1/32", "10.244.250.0/24"}


def test_a_writer_that_keeps_fighting_is_answered_at_most_every_few_seconds():
    """A second agent with our node name would rewrite the announcement after each of our patches:
    restorations are at least REASSERT_MIN_INTERVAL apart; a full sync after that restores it."""
    harness = AgentHarness()
    clock = [1000.0]
    harness.agent.monotonic = lambda: clock[0]

    def tamper(address: str) -> None:
        tampered = json.loads(json.dumps(harness.api.store.get("node-1")))
        tampered["metadata"]["annotations"][nodes.PUBLIC_IP] = address
        harness.put(tampered)

    tamper("198.18.16.200")
    harness.sync()
    tamper("198.18.16.201")  # the other writer again, after our write came back
    harness.sync()
    assert len(harness.api.patches) == 1
    clock[0] += REASSERT_MIN_INTERVAL
    harness.sync(SyncKind.FULL)
    assert len(harness.api.patches) == 2 and harness.api.patches[1] == ("node-1", {nodes.PUBLIC_IP: str(LOCAL_IP)})
    assert nodes.node_annotations(harness.api.store.get("node-1"))[nodes.PUBLIC_IP] == str(LOCAL_IP)


def test_no_pod_cidr_may_hold_the_api_servers_address_though_its_node_may_announce_it():
    """A Node claiming a pod CIDR around the API server's address would draw every agent's and
    kubelet's API traffic into the overlay: refused. The node the API server runs on rightly
    announces that address as its public IP: accepted."""
    harness = AgentHarness()
    harness.agent.settings = dataclasses.replace(harness.agent.settings,
                                                 api_server_addresses=(IPv4Address("10.244.77.10"),
                                                                       IPv4Address("198.18.16.12")))
    harness.agent.routed[IpFamily.V4].routes.bounds = harness.agent.bounds()
    harness.put(node("node-2", 2))                              # public IP 198.18.16.12: the API server's host
    harness.put(node("evil", 77, created="2025-01-01T00:00:00Z"))   # 10.244.77.0/24 holds the API server
    harness.sync(SyncKind.FULL)
    assert set(harness.overlay_routes()) == {IPv4Network("10.244.2.0/24")}
    assert harness.rejected() == {"evil": "reserved"}


def test_the_api_server_address_is_what_the_client_reaches():
    from types import SimpleNamespace

    from netagent.kube.config import api_server_addresses
    client = lambda host: SimpleNamespace(configuration=SimpleNamespace(host=host))   # noqa: E731
    assert api_server_addresses(client("https://192.0.2.7:6443")) == (IPv4Address("192.0.2.7"),)
    assert api_server_addresses(client("https://[2001:db8::7]:6443")) == (IPv6Address("2001:db8::7"),)
    assert api_server_addresses(client("https://localhost:6443")) in {(IPv4Address("127.0.0.1"),),
                                                                     (IPv4Address("127.0.0.1"), IPv6Address("::1")),
                                                                     (IPv6Address("::1"), IPv4Address("127.0.0.1"))}
    assert api_server_addresses(client("https://no-such-host.invalid:6443")) == ()
    assert api_server_addresses(client("")) == ()
