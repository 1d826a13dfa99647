"""The tc packet path (ebpf/nodeport.c) under BPF_PROG_TEST_RUN: packets built with scapy go in,
the packets that come out are parsed and asserted. The maps are the real pinned ones, filled by
EbpfProxy from a ProxyState, in a private bpffs (compiled once for the module). Both families' services are programmed (an
IPv4 and an IPv6 backend over the same maps); the tests marked with `family` run for IPv6 too
(a representative subset: NodePort DNAT and SNAT, egress reversal, source ranges, UDP, pods
outside the cgroup, the RST of an empty service), with the same assertions on IPv6 packets."""
from typing import NamedTuple

import pytest
from scapy.layers.inet import IP, TCP, UDP
from scapy.layers.inet6 import IPv6
from scapy.layers.l2 import Ether

from ebpf.loader import SocketLbLoader
from ebpf.syscall import prog_test_run
from netagent.kernel.families import IpFamily
from proxy.ebpf.backend import EbpfPaths, EbpfProxy
from proxy.factory import build_ebpf_backend
from proxy.model import Endpoint, NodeContext, Protocol, ProxyState, ServicePort, ServicePortName, TrafficPolicy
from tests.netns.ebpf_fixtures import child_cgroup, private_bpffs, require_bcc

TC_ACT_OK, TC_ACT_SHOT = 0, 2


class Net(NamedTuple):
    """The addresses of one family's scenario."""
    node_ip: str
    client: str
    other_client: str
    local_pod: str
    remote_pod: str
    pod_client: str
    lb_ip: str
    client_range: str
    pod: str        # a pod address with a slot for a number
    cluster: str    # a cluster IP with a slot for the service's number


NETS = {IpFamily.V4: Net("198.18.16.11", "203.0.113.2", "192.0.2.77", "10.244.1.5", "10.244.2.5", "10.244.1.9",
                         "198.51.100.9", "203.0.113.0/24", "10.244.2.{}", "10.96.0.{}"),
        IpFamily.V6: Net("fd00:18::11", "2001:db8:113::2", "2001:db8:2::77", "fd00:10:244:1::5", "fd00:10:244:2::5",
                         "fd00:10:244:1::9", "2001:db8:100::9", "2001:db8:113::/64", "fd00:10:244:2::{:x}",
                         "fd00:10:96::{:x}")}
NET = NETS[IpFamily.V4]
NODE_IP, CLIENT, OTHER_CLIENT = NET.node_ip, NET.client, NET.other_client
LOCAL_POD, REMOTE_POD = NET.local_pod, NET.remote_pod
by_family = pytest.mark.parametrize("family", list(IpFamily), ids=lambda f: f.label)


def services(net: Net) -> dict:
    def port(name, number, node_port, *, endpoints_on, **spec):
        service = ServicePort(name=ServicePortName("default", name), protocol=spec.pop("protocol", Protocol.TCP),
                              port=80, cluster_ip=net.cluster.format(number), node_port=node_port, **spec)
        endpoints = tuple(Endpoint(ip=ip, port=8080, node_name=node) for ip, node in endpoints_on)
        return service, endpoints

    return dict(
        remote=port("remote", 1, 30001, endpoints_on=[(net.remote_pod, "node-2")]),
        local=port("local", 2, 30002, endpoints_on=[(net.local_pod, "node-1")]),
        etp_local=port("etp-local", 3, 30003, endpoints_on=[(net.local_pod, "node-1"), (net.remote_pod, "node-2")],
                       external_policy=TrafficPolicy.LOCAL),
        ranges=port("ranges", 4, None, endpoints_on=[(net.remote_pod, "node-2")], load_balancer_ips=(net.lb_ip,),
                    load_balancer_source_ranges=(net.client_range,)),
        sticky=port("sticky", 5, 30005, endpoints_on=[(net.pod.format(i), "node-2") for i in range(10, 20)],
                    affinity_timeout=600),
        dns=port("dns", 6, 30053, endpoints_on=[(net.remote_pod, "node-2")], protocol=Protocol.UDP),
        empty=port("empty", 7, 30007, endpoints_on=[]),
    )


@pytest.fixture(scope="module")
def tc(tmp_path_factory):
    """The programs over maps programmed with both families' services, compiled once for the
    module: every test uses flows (client ports) of its own, so none meets another's."""
    yield from _programs(tmp_path_factory, tc_snat=True)


@pytest.fixture(scope="module")
def tc_no_snat(tmp_path_factory):
    yield from _programs(tmp_path_factory, tc_snat=False)


def _programs(tmp_path_factory, *, tc_snat):
    require_bcc()
    with private_bpffs(tmp_path_factory.mktemp("tc")) as bpf_root, child_cgroup() as cgroup:
        yield from _programmed(bpf_root, cgroup, tc_snat=tc_snat)


def _programmed(bpf_root, test_cgroup, *, tc_snat):
    paths = EbpfPaths(bpf_root=bpf_root, cgroup=test_cgroup)
    backend = build_ebpf_backend(paths, tc_snat=tc_snat)
    for family, net in NETS.items():
        scenario = services(net)
        state = ProxyState(node=NodeContext(name="node-1", local_addresses=(net.node_ip,), family=family),
                           services={s.name: s for s, _ in scenario.values()},
                           endpoints={s.name: e for s, e in scenario.values()})
        proxy = backend if family is IpFamily.V4 else EbpfProxy(maps=backend.maps, family=family, tc_snat=tc_snat)
        proxy.sync(state, changed=None)
    try:
        with SocketLbLoader(bpf_root=bpf_root, cgroup=test_cgroup).load_tc() as programs:
            yield programs.fds
    finally:
        backend.cleanup()


def run(fd: int, packet) -> tuple[int, Ether]:
    retval, out = prog_test_run(fd, bytes(packet))
    return retval, Ether(out)


def l3(src, dst):
    """The IP header of the addresses' family."""
    return IPv6(src=src, dst=dst) if ":" in src else IP(src=src, dst=dst)


def ip_of(packet: Ether):
    return packet[IPv6] if IPv6 in packet else packet[IP]


def tcp(src, sport, dst, dport, flags="S"):
    return Ether(src="02:00:00:00:00:01", dst="02:00:00:00:00:02") / l3(src, dst) / \
        TCP(sport=sport, dport=dport, flags=flags, seq=1000) / b"payload"


def checksums_valid(packet: Ether) -> bool:
    ip = ip_of(packet)
    header = type(ip)
    l4 = ip[TCP] if TCP in ip else ip[UDP]
    rebuilt = header(bytes(ip))
    if header is IP:
        rebuilt.chksum = None
    (rebuilt[TCP] if TCP in rebuilt else rebuilt[UDP]).chksum = None
    fresh = header(bytes(rebuilt))
    fresh_l4 = (fresh[TCP] if TCP in fresh else fresh[UDP]).chksum
    return (getattr(fresh, "chksum", None), fresh_l4) == (getattr(ip, "chksum", None), l4.chksum)


@by_family
def test_nodeport_to_a_remote_backend_is_dnated_and_snated_and_the_reply_reversed(tc, family):
    net = NETS[family]
    code, out = run(tc["na_tc_ingress"], tcp(net.client, 40000, net.node_ip, 30001))
    assert code == TC_ACT_OK
    assert (ip_of(out).dst, out[TCP].dport) == (net.remote_pod, 8080)
    assert ip_of(out).src == net.node_ip and 32768 <= out[TCP].sport <= 60999
    assert bytes(out[TCP].payload) == b"payload" and checksums_valid(out)
    again_code, again = run(tc["na_tc_ingress"], tcp(net.client, 40000, net.node_ip, 30001, flags="A"))
    assert again_code == TC_ACT_OK and (ip_of(again).src, again[TCP].sport) == (net.node_ip, out[TCP].sport)
    code, reply = run(tc["na_tc_ingress"], tcp(net.remote_pod, 8080, net.node_ip, out[TCP].sport, flags="SA"))
    assert code == TC_ACT_OK
    assert (ip_of(reply).src, reply[TCP].sport, ip_of(reply).dst, reply[TCP].dport) == \
        (net.node_ip, 30001, net.client, 40000)
    assert checksums_valid(reply)


@by_family
def test_nodeport_to_a_local_backend_keeps_the_client_and_egress_reverses_the_reply(tc, family):
    net = NETS[family]
    code, out = run(tc["na_tc_ingress"], tcp(net.client, 40001, net.node_ip, 30002))
    assert code == TC_ACT_OK
    assert (ip_of(out).src, out[TCP].sport, ip_of(out).dst, out[TCP].dport) == (net.client, 40001, net.local_pod, 8080)
    code, reply = run(tc["na_tc_egress"], tcp(net.local_pod, 8080, net.client, 40001, flags="SA"))
    assert code == TC_ACT_OK and checksums_valid(reply)
    assert (ip_of(reply).src, reply[TCP].sport) == (net.node_ip, 30002)


def test_external_traffic_policy_local_uses_local_endpoints_and_keeps_the_client(tc):
    for sport in range(41000, 41020):
        code, out = run(tc["na_tc_ingress"], tcp(CLIENT, sport, NODE_IP, 30003))
        assert code == TC_ACT_OK and (out[IP].src, out[IP].dst) == (CLIENT, LOCAL_POD)


@by_family
def test_source_ranges_admit_only_the_listed_clients(tc, family):
    net = NETS[family]
    code, out = run(tc["na_tc_ingress"], tcp(net.client, 40002, net.lb_ip, 80))
    assert code == TC_ACT_OK and ip_of(out).dst == net.remote_pod
    code, _ = run(tc["na_tc_ingress"], tcp(net.other_client, 40002, net.lb_ip, 80))
    assert code == TC_ACT_SHOT


def test_client_ip_affinity_keeps_a_client_on_one_backend(tc):
    chosen = {run(tc["na_tc_ingress"], tcp(CLIENT, sport, NODE_IP, 30005))[1][IP].dst for sport in range(42000, 42020)}
    assert len(chosen) == 1
    others = {run(tc["na_tc_ingress"], tcp(f"192.0.2.{n}", 42000, NODE_IP, 30005))[1][IP].dst for n in range(1, 40)}
    assert len(others) > 1   # different clients spread over the ten endpoints


def test_without_snat_a_remote_backend_sees_the_client_and_egress_reverses_the_reply(tc_no_snat):
    code, out = run(tc_no_snat["na_tc_ingress"], tcp(CLIENT, 43000, NODE_IP, 30001))
    assert code == TC_ACT_OK and (out[IP].src, out[TCP].sport, out[IP].dst) == (CLIENT, 43000, REMOTE_POD)
    code, reply = run(tc_no_snat["na_tc_egress"], tcp(REMOTE_POD, 8080, CLIENT, 43000, flags="SA"))
    assert code == TC_ACT_OK and (reply[IP].src, reply[TCP].sport) == (NODE_IP, 30001) and checksums_valid(reply)


@by_family
def test_udp_is_translated_with_valid_checksums(tc, family):
    net = NETS[family]
    packet = Ether() / l3(net.client, net.node_ip) / UDP(sport=5353, dport=30053) / b"query"
    code, out = run(tc["na_tc_ingress"], packet)
    assert code == TC_ACT_OK and (ip_of(out).dst, out[UDP].dport) == (net.remote_pod, 8080) and checksums_valid(out)


def test_packets_that_are_not_for_a_service_pass_untouched(tc):
    for packet in (tcp(CLIENT, 40003, NODE_IP, 22), tcp(CLIENT, 40003, "10.96.0.1", 80),   # cluster IP: not here
                   Ether() / IP(src=CLIENT, dst=NODE_IP) / (b"\x00" * 20)):
        code, out = run(tc["na_tc_ingress"], packet)
        assert code == TC_ACT_OK and bytes(out) == bytes(packet)


POD_CLIENT = NET.pod_client


@by_family
def test_from_a_pod_a_cluster_ip_is_translated_to_the_cluster_set_and_the_reply_reversed_at_egress(tc, family):
    net = NETS[family]
    cluster_ip = net.cluster.format(1)
    code, out = run(tc["na_tc_from_pod"], tcp(net.pod_client, 40100, cluster_ip, 80))
    assert code == TC_ACT_OK and checksums_valid(out)
    assert (ip_of(out).src, out[TCP].sport, ip_of(out).dst, out[TCP].dport) == (net.pod_client, 40100, net.remote_pod, 8080)
    code, reply = run(tc["na_tc_egress"], tcp(net.remote_pod, 8080, net.pod_client, 40100, flags="SA"))
    assert code == TC_ACT_OK and checksums_valid(reply)
    assert (ip_of(reply).src, reply[TCP].sport, ip_of(reply).dst, reply[TCP].dport) == \
        (cluster_ip, 80, net.pod_client, 40100)
    _, outside = run(tc["na_tc_ingress"], tcp(net.client, 40100, cluster_ip, 80))   # the underlay leaves cluster IPs
    assert (ip_of(outside).dst, outside[TCP].dport) == (cluster_ip, 80)


def test_from_a_pod_a_node_port_is_never_snated_and_local_policy_uses_the_cluster_set(tc):
    code, out = run(tc["na_tc_from_pod"], tcp(POD_CLIENT, 40101, NODE_IP, 30001))   # SNAT is asked for (tc)
    assert code == TC_ACT_OK and (out[IP].src, out[IP].dst) == (POD_CLIENT, REMOTE_POD)
    picked = {run(tc["na_tc_from_pod"], tcp(POD_CLIENT, sport, NODE_IP, 30003))[1][IP].dst
              for sport in range(41100, 41140)}
    assert picked == {LOCAL_POD, REMOTE_POD}   # Local policy is for traffic from outside the cluster


def test_from_a_pod_replies_are_not_translated_on_the_way_in_and_other_packets_pass(tc):
    run(tc["na_tc_ingress"], tcp(CLIENT, 40102, NODE_IP, 30002))   # outside -> NodePort -> the local pod
    code, reply = run(tc["na_tc_from_pod"], tcp(LOCAL_POD, 8080, CLIENT, 40102, flags="SA"))
    assert code == TC_ACT_OK and (reply[IP].src, reply[TCP].sport) == (LOCAL_POD, 8080)   # left to the egress
    plain = tcp(POD_CLIENT, 40103, "10.244.2.77", 9000)
    code, out = run(tc["na_tc_from_pod"], plain)
    assert code == TC_ACT_OK and bytes(out) == bytes(plain)


TC_ACT_REDIRECT = 7


def test_a_pod_reaching_itself_is_snated_to_the_service_and_sent_straight_back_both_ways(tc):
    """A hairpin: the pod's own address as the source would be dropped by the pod, a node
    address as the source by the host on the veth, so neither is routed: both directions are
    translated and redirected out of the veth they came in by, MACs swapped."""
    hairpin = tcp(LOCAL_POD, 40104, NODE_IP, 30002)   # "local": LOCAL_POD is the only endpoint
    code, out = run(tc["na_tc_from_pod"], hairpin)
    assert code == TC_ACT_REDIRECT and checksums_valid(out)
    assert (out.src, out.dst) == (hairpin.dst, hairpin.src)
    assert (out[IP].src, out[TCP].sport, out[IP].dst, out[TCP].dport) == (NODE_IP, 40104, LOCAL_POD, 8080)
    code, reply = run(tc["na_tc_from_pod"], tcp(LOCAL_POD, 8080, NODE_IP, 40104, flags="SA"))
    assert code == TC_ACT_REDIRECT and checksums_valid(reply)
    assert (reply[IP].src, reply[TCP].sport, reply[IP].dst, reply[TCP].dport) == (NODE_IP, 30002, LOCAL_POD, 40104)
    code, again = run(tc["na_tc_from_pod"], tcp(LOCAL_POD, 40104, NODE_IP, 30002, flags="A"))
    assert code == TC_ACT_REDIRECT and (again[IP].src, again[IP].dst) == (NODE_IP, LOCAL_POD)


@by_family
def test_a_syn_to_a_service_without_endpoints_is_answered_by_a_reset_from_the_service(tc, family):
    net = NETS[family]
    syn = Ether(src="02:00:00:00:00:01", dst="02:00:00:00:00:02") / l3(net.client, net.node_ip) / \
        TCP(sport=40200, dport=30007, flags="S", seq=5000, options=[("MSS", 1460), ("SAckOK", b""), ("WScale", 7)])
    for program, packet in (("na_tc_ingress", syn), ("na_tc_from_pod", syn)):
        code, out = run(tc[program], packet)
        assert code == TC_ACT_REDIRECT and (out.src, out.dst) == (syn.dst, syn.src), program
        assert (ip_of(out).src, out[TCP].sport, ip_of(out).dst, out[TCP].dport) == (net.node_ip, 30007, net.client, 40200)
        assert out[TCP].flags == "RA" and out[TCP].ack == 5001 and checksums_valid(out)
        assert len(out) == 14 + (40 if family is IpFamily.V4 else 60)   # headers only: options and payload cut off
    code, _ = run(tc["na_tc_from_pod"], tcp(net.pod_client, 40201, net.cluster.format(7), 80, flags="A"))   # not a SYN
    assert code == TC_ACT_SHOT
