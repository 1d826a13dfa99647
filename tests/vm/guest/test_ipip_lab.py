"""IPIP mode in the lab, on a kernel that has IPIP (Debian's, inside the VM tier's guest).

The same checks as tests/cluster/test_modes.py for vxlan and host-gw: TCP and UDP between
pods on different nodes with the pods' own addresses, IP protocol 4 on the underlay carrying
the pods' packets between the node addresses, and full-MTU (underlay - 20) packets passing
with don't-fragment set. Then auto mode with IPIP as its encapsulation across two segments:
plain routes to the same-segment peer, IPIP through the router to the other.
"""
import json
import os

from scapy.layers.inet import ICMP, IP

from tests.cluster.lab_tools import capture_ping, lab_cluster, pods_by_node, serve, traffic


def ipip_packets(packets):
    return [p for p in packets if IP in p and p[IP].proto == 4]


def test_ipip_mode_between_pods_on_two_nodes(tmp_path):
    with lab_cluster(nodes=2, mode="ipip", pods_per_node=1) as lab:
        pods = pods_by_node(lab)
        a, b = pods["node-1"], pods["node-2"]
        with serve(lab, b.name, "tcp", 8080, lifetime=300), serve(lab, b.name, "udp", 8081, lifetime=300):
            tcp = traffic(lab, a.name, "ask-tcp", b.ip, "8080", "--payload", "over-tcp")
            udp = traffic(lab, a.name, "ask-udp", b.ip, "8081", "--payload", "over-udp")
        assert tcp.stdout.split() == [a.ip, "over-tcp"], tcp.stderr
        assert udp.stdout.split() == [a.ip, "over-udp"], udp.stderr

        link = json.loads(lab.exec(a.name, ["ip", "-j", "link", "show", "eth0"], check=True).stdout)[0]
        assert link["mtu"] == 1480
        ok, packets = capture_ping(lab, a, b, os.path.join(tmp_path, "ipip.pcap"), size=1480 - 28, df=True)
        assert ok
        tunnelled = ipip_packets(packets)
        nodes = {lab.state.nodes["node-1"].address, lab.state.nodes["node-2"].address}
        assert len(tunnelled) >= 4, [p.summary() for p in packets]
        for p in tunnelled:
            assert {p[IP].src, p[IP].dst} == nodes
            inner = p[IP].payload
            assert {inner.src, inner.dst} == {a.ip, b.ip} and ICMP in inner
            assert p[IP].len == 1500  # a full-MTU pod packet plus the 20-byte outer header
        assert not [p for p in packets if IP in p and p[IP].proto == 1 and p[IP].src == a.ip]
        routes = json.loads(lab.exec("node-1", ["ip", "-j", "route"], check=True).stdout)
        route = next(r for r in routes if r["dst"] == lab.state.nodes["node-2"].pod_cidr)
        assert route["dev"] == "na-ipip" and "onlink" in route.get("flags", [])


def test_auto_mode_with_ipip_across_segments(tmp_path):
    with lab_cluster(nodes=3, mode="auto", auto_encap="ipip", segments=2, pods_per_node=1) as lab:
        pods = pods_by_node(lab)
        source = pods["node-1"]
        ok, packets = capture_ping(lab, source, pods["node-3"], os.path.join(tmp_path, "same.pcap"))
        assert ok and not ipip_packets(packets)
        assert [p for p in packets if ICMP in p and IP in p and p[IP].dst == pods["node-3"].ip]
        ok, packets = capture_ping(lab, source, pods["node-2"], os.path.join(tmp_path, "across.pcap"))
        assert ok
        tunnelled = ipip_packets(packets)
        assert tunnelled and all(p[IP].payload.dst in (pods["node-2"].ip, source.ip) for p in tunnelled)
