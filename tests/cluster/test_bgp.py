"""`--backend bgp` on a 2-segment lab: pod routes learnt over BGP, no encapsulation anywhere.

One lab for the module (`lab up --mode bgp --segments 2 --network-policy`): node-1 and node-3 on
segment 1, node-2 on segment 2, each segment's top-of-rack router running BIRD (the lab's), every
agent running its own BIRD and peering with its ToR. The pods and policies are
test_network_policy.py's (x-a, y-b on node-1; x-b, y-c on node-2, across the segments), its
matrix helpers judging reachability; a pod on node-3 adds the same-segment case. Then node-3 is
removed (its route gone from every other node and the ToR) and node-4 added on segment 2 (routed).
The ToR fabric alone (ToRs peering, no agents) has its own small test first.
"""
from __future__ import annotations

import ipaddress
import json
import subprocess
import sys
import tempfile

import pytest

from lab import bgp_fabric, physical
from lab.processes import Processes
from lab.state import LabState
from netagent.kernel import namespaces, owned
from tests.cluster.lab_tools import Background, ip_routes, wait_for
from tests.cluster.test_network_policy import (LOCK_B, PODS, ANSWER_SECONDS, becomes, expect, lab_cli, policy_lab,
                                               probe)
from tests.conftest import require_root_netns
from tests.netns.policy_lab import SERVER

TUNNELS = (owned.VXLAN_DEVICE, owned.IPIP_DEVICE)


@pytest.fixture(scope="module", autouse=True)
def _no_leaks_per_module():
    """policy_lab checks its own namespaces (as in test_network_policy.py); the fabric test too."""
    require_root_netns()
    yield


def test_tor_fabric_peers_with_rendered_configs():
    """The ToRs alone: their BIRDs start from the rendered configs and peer across the fabric."""
    prefix = namespaces.unique_name("na-tc-fab")
    state = LabState(prefix=prefix, workdir=tempfile.mkdtemp(prefix=f"{prefix}-"), mode="bgp", auto_encap="vxlan",
                     segments=2, resync_period=30.0, switch=f"{prefix}-sw", router=f"{prefix}-rtr",
                     internet=f"{prefix}-inet")
    fabric = bgp_fabric.BgpFabric(state, Processes(cwd=state.workdir))
    try:
        physical.build_backbone(switch=state.switch, router=state.router, internet=state.internet, segments=2)
        fabric.build(cluster_cidr=ipaddress.IPv4Network("10.244.0.0/16"))

        def fabric_up():
            tors = fabric.sessions()
            return all(any(s["name"] == "fabric1" and s["bgpState"] == "Established" for s in t.get("sessions", []))
                       for t in tors) and tors
        tors = wait_for(fabric_up, what="the ToRs' fabric session")
        assert [(t["segment"], t["asn"], t["address"]) for t in tors] == [(1, 65001, "198.18.16.2"),
                                                                          (2, 65002, "198.18.32.2")]
        for tor in fabric.tors:   # what runs is what the lab renders from its typed values
            with open(tor.config_path) as f:
                assert f.read() == bgp_fabric.render_tor_config(
                    bgp_fabric.tor_config(state, tor.segment, cluster_cidr=ipaddress.IPv4Network("10.244.0.0/16")))
    finally:
        fabric.down([])
        for ns in (state.switch, state.router, state.internet):
            namespaces.remove(ns)
    left = [n for n in namespaces_listed() if n.startswith(prefix)]
    assert not left, left


def namespaces_listed() -> list:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


@pytest.fixture(scope="module")
def lab():
    with policy_lab("iptables", PODS, nodes=3, mode="bgp", segments=2) as lab:
        lab_cli(lab, "pod", "add", "w-3", "--node", "node-3", "--labels", "app=w")
        lab.state = type(lab).load(lab.workdir).state
        with Background(lab.netns_of("w-3"), [sys.executable, "-c", SERVER, "80"], ready_line="ready"):
            yield lab


def sessions_up(lab) -> bool:
    status = json.loads(lab_cli(lab, "status", "--json"))
    nodes_up = all(n.get("bgp", {}).get("sessions") and all(s["bgpState"] == "Established" for s in n["bgp"]["sessions"])
                   for n in status["nodes"])
    tor_up = all(any(s["bgpState"] == "Established" for s in t.get("sessions", [])) for t in status["tors"])
    return nodes_up and tor_up


def routes_to(lab, node: str, cidr: str) -> list:
    return [r for r in ip_routes(lab, node) if r.get("dst") == cidr]


def test_every_node_peers_with_its_tor_and_no_tunnel_exists(lab):
    wait_for(lambda: sessions_up(lab), what="every node's session with its ToR")
    status = json.loads(lab_cli(lab, "status", "--json"))
    for node in status["nodes"]:
        tor = str(physical.tor_address(node["segment"]))
        assert [s["neighbor"] for s in node["bgp"]["sessions"]] == [tor], node["bgp"]
    for name in lab.state.nodes:
        links = {link["ifname"] for link in json.loads(lab.exec(name, ["ip", "-j", "link"], check=True).stdout)}
        assert not links & set(TUNNELS), (name, links)


def test_routes_go_direct_within_a_segment_and_through_the_tor_across(lab):
    cidr = {name: node.pod_cidr for name, node in lab.state.nodes.items()}
    same = wait_for(lambda: routes_to(lab, "node-1", cidr["node-3"]), what="node-3's pod CIDR on node-1")
    across = wait_for(lambda: routes_to(lab, "node-1", cidr["node-2"]), what="node-2's pod CIDR on node-1")
    assert same[0]["gateway"] == lab.state.nodes["node-3"].address and same[0]["dev"] == "eth0"
    assert across[0]["gateway"] == str(physical.tor_address(1)) and across[0]["dev"] == "eth0"


def test_pods_reach_each_other_across_and_within_segments(lab):
    becomes(lab, expect())    # x-a, y-b (segment 1) <-> x-b, y-c (segment 2): all open
    w3 = lab.state.pods["w-3"].ip
    for source in PODS:       # node-3's pod: the same segment as node-1's pods, the other as node-2's
        wait_for(lambda: probe(lab, source, [("w-3", w3, 80)])["w-3"], what=f"{source} -> w-3")


def test_service_reached_across_segments(lab):
    cluster_ip = lab.api().get("v1", "Service", "web", namespace="x")["spec"]["clusterIP"]

    def both_endpoints() -> bool:   # x-a on segment 1, x-b on segment 2, from node-3's pod
        answers = probe(lab, "w-3", [(str(n), cluster_ip, 80) for n in range(16)], timeout=ANSWER_SECONDS)
        return all(answers.values())
    wait_for(both_endpoints, what="the Service answering from every endpoint")


def test_network_policy_enforced_over_bgp_routes(lab):
    lab_cli(lab, "apply", "-f", "-", stdin=LOCK_B)
    try:
        becomes(lab, expect(closed_to=("x-b",)))    # x-b (segment 2) closed to both segments' pods
    finally:
        lab_cli(lab, "delete", "-f", "-", stdin=LOCK_B)
    becomes(lab, expect())


def test_removed_node_withdrawn_and_added_node_routed(lab):
    gone = lab.state.nodes["node-3"].pod_cidr
    wait_for(lambda: routes_to(lab, "node-2", gone), what="node-3's route on node-2 before its removal")
    lab_cli(lab, "node", "remove", "node-3")
    lab.state = type(lab).load(lab.workdir).state
    for name in ("node-1", "node-2"):
        wait_for(lambda: not routes_to(lab, name, gone), what=f"node-3's route withdrawn on {name}")
        wait_for(lambda: gone not in lab.exec(name, ["ip", "route", "show", "table", str(owned.BGP_ROUTE_TABLE)],
                                              check=True).stdout, what=f"node-3's BGP route gone on {name}")
    for tor in bgp_fabric.BgpFabric(lab.state, lab.processes).tors:
        wait_for(lambda: gone not in namespaces.run_in(tor.netns, ["ip", "route"], check=True).stdout,
                 what=f"node-3's route gone from the ToR of segment {tor.segment}")

    lab_cli(lab, "node", "add", "--name", "node-4", "--segment", "2")
    lab_cli(lab, "pod", "add", "w-4", "--node", "node-4", "--labels", "app=w")
    lab.state = type(lab).load(lab.workdir).state
    with Background(lab.netns_of("w-4"), [sys.executable, "-c", SERVER, "80"], ready_line="ready"):
        w4 = lab.state.pods["w-4"].ip
        wait_for(lambda: probe(lab, "x-a", [("w-4", w4, 80)])["w-4"], what="x-a (segment 1) -> w-4 on node-4")
        wait_for(lambda: probe(lab, "y-c", [("w-4", w4, 80)])["w-4"], what="y-c (segment 2) -> w-4 on node-4")
    wait_for(lambda: sessions_up(lab), what="node-4's session with its ToR")
