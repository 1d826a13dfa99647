"""Hostile Nodes written through the lab API server against real agents (issue 18, items 1-2).

One 2-node vxlan lab for the module; each test adds one hostile Node and then checks, from the
real agents and kernels: cross-node pod pings still work, no route to the Node's prefixes goes
via the overlay, and node-1's /healthz (its loopback metrics address's) names the Node as
rejected with its reason. The last test adds a new node with every hostile Node still present:
its agent's first full sync must succeed (on the old code a deep-JSON Node made it raise, and
the node never got routes) and its pod must reach the others. Plus: the agent restores its own
announcement when another writer changes it.
"""
from __future__ import annotations

import datetime
import json
import sys
import time

import pytest

from lab.cluster import SERVICE_CIDR
from netagent.noderoutes import node_objects as nodes
from netagent.noderoutes.routing.vxlan import vtep_mac
from tests.cluster.lab_tools import lab_cluster, pods_by_node, wait_for

# The deep-JSON Node comes last but one: on the old code it failed every sync after it, which
# would hide what the old code did with the other Nodes.
FETCH = ("import urllib.request,sys;"   # the loopback metrics address: where /healthz has its details
         "print(urllib.request.urlopen('http://127.0.0.1:10249/' + sys.argv[1], timeout=30).read().decode())")


@pytest.fixture(scope="module")
def lab():
    with lab_cluster(nodes=2, mode="vxlan", pods_per_node=1, resync_period=5.0) as lab:
        yield lab


def hostile_node(name: str, *, pod_cidr: str, public_ip: str, backend_data: str) -> dict:
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "annotations": {nodes.BACKEND_TYPE: "vxlan", nodes.PUBLIC_IP: public_ip,
                                                       nodes.BACKEND_DATA: backend_data}},
            "spec": {"podCIDR": pod_cidr, "podCIDRs": [pod_cidr]}}


def rejected_on(lab, node: str) -> list[str]:
    health = json.loads(lab.exec(node, [sys.executable, "-c", FETCH, "healthz"], check=True, timeout=60).stdout)
    return health["details"].get("rejected_objects", [])


def is_rejected(lab, node: str, name: str, reason: str) -> bool:
    return any(f"Node {name} rejected ({reason})" in line for line in rejected_on(lab, node))


def wait_rejected(lab, name: str, reason: str, *, hijacked=lambda node: False) -> None:
    """Until every agent has judged Node `name`: rejected, or (`hijacked(node)` True: the old code)
    it programmed what the Node claimed; then it must have been the rejection."""
    for node in sorted(lab.state.nodes):
        wait_for(lambda: hijacked(node) or is_rejected(lab, node, name, reason),
                 what=f"{node}'s agent to judge Node {name}")
        assert not hijacked(node), f"{node} programmed what Node {name} claimed"
        assert is_rejected(lab, node, name, reason)


def via_overlay(lab, node: str, *addresses: str) -> bool:
    return any(route_device(lab, node, address) == "na-vxlan" for address in addresses)


def vtep_destinations(lab, node: str, mac: str) -> list:
    fdb = json.loads(lab.exec(node, ["bridge", "-j", "fdb", "show", "dev", "na-vxlan"], check=True).stdout)
    return [f.get("dst") for f in fdb if f.get("mac") == mac]


def route_device(lab, node: str, address: str) -> str:
    out = lab.exec(node, ["ip", "-j", "route", "get", address], check=True).stdout
    return json.loads(out)[0].get("dev", "")


def assert_cross_node_pings(lab) -> None:
    pods = pods_by_node(lab)
    for source in pods.values():
        for target in pods.values():
            if source.node != target.node:
                assert wait_for(lambda: lab.ping(source.name, target.ip, count=1),
                                what=f"{source.name} to reach {target.name}")


def assert_not_via_overlay(lab, *addresses: str) -> None:
    for node in sorted(lab.state.nodes):
        for address in addresses:
            assert route_device(lab, node, address) != "na-vxlan", f"{node}: {address} goes into the overlay"


def wait_past_creation_second(lab, name: str) -> None:
    """Until the clock is past the second Node `name` was created in: creationTimestamp has
    one-second granularity, and within one second seniority falls to the uid (random), so a Node
    created in the same second is not younger."""
    created = lab.api().get("v1", "Node", name)["metadata"]["creationTimestamp"]
    second = datetime.datetime.strptime(created, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=datetime.timezone.utc)
    time.sleep(max(0.0, second.timestamp() + 1.05 - time.time()))


def announced_vtep_mac(lab, name: str) -> str:
    """The VTEP MAC Node `name` announces (random per node: read, not derived from the name)."""
    def announced() -> str | None:
        data = lab.api().get("v1", "Node", name)["metadata"].get("annotations", {}).get(nodes.BACKEND_DATA)
        return json.loads(data).get("vtepMAC") if data else None
    return wait_for(announced, what=f"Node {name}'s VTEP MAC announced")


def test_a_thief_copying_node_2s_vtep_mac_is_refused(lab):
    wait_past_creation_second(lab, "node-2")   # a younger thief (a lab comes up within a second)
    mac = announced_vtep_mac(lab, "node-2")
    lab.api().create(hostile_node("a-thief", pod_cidr="10.244.66.0/24", public_ip="198.18.31.66",
                                  backend_data=json.dumps({"vtepMAC": mac})))
    node_2 = lab.state.nodes["node-2"].address
    wait_rejected(lab, "a-thief", "conflict",
                  hijacked=lambda node: node != "node-2" and vtep_destinations(lab, node, mac) != [node_2])
    assert_cross_node_pings(lab)
    assert_not_via_overlay(lab, "10.244.66.1")


@pytest.mark.parametrize("name, pod_cidr, probes", [
    ("metadata", "169.254.169.254/32", ["169.254.169.254"]),
    ("services", str(SERVICE_CIDR), ["10.96.0.10", "10.96.0.1"]),
    ("underlay", "198.18.16.0/20", ["198.18.16.12", "198.18.16.11", "198.18.16.1"]),
], ids=lambda v: v if isinstance(v, str) and "/" not in v and "." not in v else "")
def test_nodes_claiming_prefixes_outside_the_cluster_cidr_are_refused(lab, name, pod_cidr, probes):
    lab.api().create(hostile_node(name, pod_cidr=pod_cidr, public_ip=f"198.18.31.{len(name)}",
                                  backend_data=json.dumps({"vtepMAC": vtep_mac(name)})))
    wait_rejected(lab, name, "outside-cluster-cidr", hijacked=lambda node: via_overlay(lab, node, *probes))
    assert_cross_node_pings(lab)
    assert_not_via_overlay(lab, *probes)


def test_the_agent_restores_its_announcement(lab):
    wanted = lab.api().get("v1", "Node", "node-1")["metadata"]["annotations"][nodes.PUBLIC_IP]
    lab.api().patch("v1", "Node", "node-1", {"metadata": {"annotations": {nodes.PUBLIC_IP: "198.18.31.1"}}})
    wait_for(lambda: lab.api().get("v1", "Node", "node-1")["metadata"]["annotations"][nodes.PUBLIC_IP] == wanted,
             what="node-1's agent to restore its public-ip annotation")
    assert_cross_node_pings(lab)


def test_a_deep_json_node_is_rejected_and_costs_nobody_routes(lab):
    lab.api().create(hostile_node("deep", pod_cidr="10.244.90.0/24", public_ip="198.18.31.90",
                                  backend_data="[" * 10_000 + "]" * 10_000))
    wait_rejected(lab, "deep", "too-large", hijacked=lambda node: via_overlay(lab, node, "10.244.90.1"))
    assert_cross_node_pings(lab)
    assert_not_via_overlay(lab, "10.244.90.1")


def test_a_node_added_after_the_hostile_ones_gets_routes(lab):
    """The issue's repro: a third node joining after the deep-JSON Node never got routes."""
    node = lab.add_node()
    lab.add_pod("late-pod", node=node.name)
    assert_cross_node_pings(lab)
    assert_not_via_overlay(lab, "169.254.169.254", "10.96.0.10", "198.18.16.12", "10.244.90.1", "10.244.66.1")
    for hostile, reason in (("deep", "too-large"), ("a-thief", "conflict"), ("metadata", "outside-cluster-cidr")):
        assert any(f"Node {hostile} rejected ({reason})" in line for line in rejected_on(lab, node.name))
