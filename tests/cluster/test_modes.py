"""Pod-to-pod traffic across nodes in each mode, checked on the wire.

For vxlan and host-gw on one segment, bgp across two (through both segments' top-of-rack
routers, over BGP-learnt routes), and auto across two segments: TCP and UDP between
pods on different nodes (the server sees the client pod's own address: no NAT between
pods), the underlay capture shows the encapsulation each mode promises, and packets of the
full pod MTU pass with the don't-fragment bit set. IPIP runs the same checks in the VM tier.
"""
import ipaddress
import json
import os
import sys
import time

import pytest
from scapy.layers.inet import ICMP, IP, UDP
from scapy.layers.vxlan import VXLAN

from tests.cluster.lab_tools import Background, capture_ping, lab_cluster, pods_by_node, serve, traffic
from tests.netns.test_anti_spoofing import RECEIVER, SENDER

VXLAN_PORT = 4789


@pytest.fixture(scope="module", params=["vxlan", "host-gw", "bgp"])
def two_nodes(request):
    segments = 2 if request.param == "bgp" else 1   # bgp: the nodes on different segments
    with lab_cluster(nodes=2, mode=request.param, pods_per_node=1, segments=segments) as lab:
        yield lab


def pods_on_two_nodes(lab):
    pods = pods_by_node(lab)
    return pods["node-1"], pods["node-2"]


def test_tcp_and_udp_between_pods_on_different_nodes(two_nodes):
    a, b = pods_on_two_nodes(two_nodes)
    with serve(two_nodes, b.name, "tcp", 8080), serve(two_nodes, b.name, "udp", 8081):
        tcp = traffic(two_nodes, a.name, "ask-tcp", b.ip, "8080", "--payload", "over-tcp")
        udp = traffic(two_nodes, a.name, "ask-udp", b.ip, "8081", "--payload", "over-udp")
    assert tcp.stdout.split() == [a.ip, "over-tcp"], tcp.stderr
    assert udp.stdout.split() == [a.ip, "over-udp"], udp.stderr


def test_a_pod_cannot_send_with_another_address_with_network_policy_off(two_nodes):
    """Pod anti-spoofing is on by default and is not NetworkPolicy: these labs run without
    `--network-policy`, and a UDP packet pod a sends with its neighbour's address (built on a
    raw socket) is dropped at its node, while the one with its own address arrives."""
    a, b = pods_on_two_nodes(two_nodes)
    neighbour = str(ipaddress.ip_address(a.ip) + 1)
    receiver = Background(two_nodes.netns_of(b.name), [sys.executable, "-c", RECEIVER, "9999", "60"],
                          ready_line="ready")
    try:
        two_nodes.exec(a.name, [sys.executable, "-c", SENDER, "9999", a.ip, b.ip, "own", neighbour, b.ip, "spoofed"],
                       timeout=60, check=True)
        time.sleep(1.5)              # what is in flight arrives; a dropped packet never does
    finally:
        out, err = receiver.stop()
    arrived = {tuple(line.split()) for line in out.splitlines() if line.strip()}
    assert arrived == {("own", a.ip)}, (out, err)


def test_underlay_shows_the_mode(two_nodes, tmp_path):
    a, b = pods_on_two_nodes(two_nodes)
    ok, packets = capture_ping(two_nodes, a, b, os.path.join(tmp_path, "underlay.pcap"))
    assert ok
    node_a, node_b = two_nodes.state.nodes[a.node], two_nodes.state.nodes[b.node]
    if two_nodes.state.mode == "vxlan":
        tunnelled = [p for p in packets if VXLAN in p and p[UDP].dport == VXLAN_PORT]
        assert tunnelled, [p.summary() for p in packets]
        for p in tunnelled:
            assert p[VXLAN].vni == 1
            assert {p[IP].src, p[IP].dst} == {node_a.address, node_b.address}  # outer: the nodes
            inner = p[VXLAN].payload[IP]
            assert {inner.src, inner.dst} == {a.ip, b.ip}                      # inner: the pods
            assert ICMP in inner
        assert not [p for p in packets if IP in p and p[IP].src == a.ip and VXLAN not in p]
    else:
        plain = [p for p in packets if IP in p and ICMP in p and {p[IP].src, p[IP].dst} == {a.ip, b.ip}]
        assert len(plain) >= 4, [p.summary() for p in packets]  # 2 requests, 2 replies, bare on the wire
        assert not [p for p in packets if UDP in p and p[UDP].dport == VXLAN_PORT]
        assert not [p for p in packets if IP in p and p[IP].proto == 4]


def test_full_mtu_packets_pass_without_fragmentation(two_nodes):
    a, b = pods_on_two_nodes(two_nodes)
    link = json.loads(two_nodes.exec(a.name, ["ip", "-j", "link", "show", "eth0"], check=True).stdout)[0]
    expected = 1450 if two_nodes.state.mode == "vxlan" else 1500
    assert link["mtu"] == expected
    payload = expected - 28  # IPv4 + ICMP headers
    ok = two_nodes.exec(a.name, ["ping", "-c", "2", "-i", "0.2", "-W", "2", "-M", "do", "-s", str(payload), b.ip])
    assert ok.returncode == 0, ok.stdout + ok.stderr
    too_big = two_nodes.exec(a.name, ["ping", "-c", "1", "-W", "1", "-M", "do", "-s", str(payload + 1), b.ip])
    assert too_big.returncode != 0
    with serve(two_nodes, b.name, "tcp", 8082):
        big = traffic(two_nodes, a.name, "ask-tcp", b.ip, "8082", "--payload", "x" * 100_000)
    assert big.stdout.strip() == f"{a.ip} {'x' * 100_000}"


def test_auto_mode_routes_same_segment_and_encapsulates_across(tmp_path):
    with lab_cluster(nodes=3, mode="auto", segments=2, pods_per_node=1) as lab:
        pods = pods_by_node(lab)
        assert [lab.state.nodes[n].segment for n in ("node-1", "node-2", "node-3")] == [1, 2, 1]
        source = pods["node-1"]
        ok, packets = capture_ping(lab, source, pods["node-3"], os.path.join(tmp_path, "same.pcap"))  # same segment
        assert ok
        assert [p for p in packets if ICMP in p and IP in p and p[IP].dst == pods["node-3"].ip and VXLAN not in p]
        assert not [p for p in packets if VXLAN in p]
        ok, packets = capture_ping(lab, source, pods["node-2"], os.path.join(tmp_path, "across.pcap"))  # through the router
        assert ok
        tunnelled = [p for p in packets if VXLAN in p]
        assert tunnelled and all(p[VXLAN].payload[IP].dst in (pods["node-2"].ip, source.ip) for p in tunnelled)
        routes = {r["dst"]: r for r in json.loads(lab.exec("node-1", ["ip", "-j", "route"], check=True).stdout)}
        assert routes[lab.state.nodes["node-3"].pod_cidr]["dev"] == "eth0"
        assert routes[lab.state.nodes["node-2"].pod_cidr]["dev"] == "na-vxlan"
