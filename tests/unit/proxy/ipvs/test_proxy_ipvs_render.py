"""The IPVS backend's pure parts: the plan rendered per service port, its reverse index, and the
constant iptables chains (golden)."""
from netagent.kernel.iptables.runner import PortRandomization
from proxy.ipvs.render import IpvsSettings, render_ipvs
from proxy.ipvs.render import render_service_port as render_planned
from proxy.ipvs.rules import render_ipvs_chains
from proxy.ipvs.table import Destination, Scheduler, VirtualServer, VirtualServerKey
from proxy.model import (
    Endpoint,
    EntryKind,
    NodeContext,
    Protocol,
    ProxyState,
    ServicePort,
    ServicePortName,
    TrafficPolicy,
)
from proxy.selection import select_endpoints

NODE = NodeContext(name="node-1", cluster_cidr="10.244.0.0/16", local_addresses=("192.168.1.10", "172.16.0.10"))
SETTINGS = IpvsSettings()
WEB = ServicePortName("default", "web", "http")


def render_service_port(service, endpoints, node, settings):
    """One service port's plan, its endpoints selected as a sync selects them."""
    return render_planned(service, select_endpoints(service, endpoints, node), node=node, settings=settings)


def sets_of(plan):
    return {name: set(members) for name, members in plan.members.items()}


def test_cluster_ip_service():
    service = ServicePort(WEB, Protocol.TCP, 80, "10.96.0.10")
    endpoints = (Endpoint("10.244.1.5", 8080, node_name="node-2"), Endpoint("10.244.0.7", 8080, node_name="node-1"))
    plan = render_service_port(service, endpoints, NODE, SETTINGS)
    (server,) = plan.virtual_servers
    assert server.server == VirtualServer(VirtualServerKey("10.96.0.10", Protocol.TCP, 80), scheduler="rr")
    assert server.kind is EntryKind.CLUSTER_IP and server.service == WEB
    assert server.destinations == (Destination("10.244.0.7", 8080), Destination("10.244.1.5", 8080))
    assert plan.addresses == {"10.96.0.10"}
    assert sets_of(plan) == {
        "NETAGENT-IPVS-ADDRESSES": {"10.96.0.10"},
        "NETAGENT-IPVS-CLUSTER-IP": {"10.96.0.10,tcp:80"},
        "NETAGENT-IPVS-HAIRPIN": {"10.244.0.7,tcp:8080,10.244.0.7", "10.244.1.5,tcp:8080,10.244.1.5"},
    }


def test_nodeport_on_every_node_address_and_policy_local():
    service = ServicePort(WEB, Protocol.UDP, 53, "10.96.0.10", node_port=30053)
    endpoints = (Endpoint("10.244.1.5", 5353, node_name="node-2"), Endpoint("10.244.0.7", 5353, node_name="node-1"))
    plan = render_service_port(service, endpoints, NODE, SETTINGS)
    nodeports = [s for s in plan.virtual_servers if s.kind is EntryKind.NODE_PORT]
    assert [str(s.key) for s in nodeports] == ["192.168.1.10:30053/UDP", "172.16.0.10:30053/UDP"]
    assert all(len(s.destinations) == 2 for s in nodeports)
    assert sets_of(plan)["NETAGENT-IPVS-NODEPORT"] == {"192.168.1.10,udp:30053", "172.16.0.10,udp:30053"}
    assert plan.addresses == {"10.96.0.10"}, "node addresses are not put on the dummy device"

    local = ServicePort(WEB, Protocol.UDP, 53, "10.96.0.10", node_port=30053, external_policy=TrafficPolicy.LOCAL)
    plan = render_service_port(local, endpoints, NODE, SETTINGS)
    nodeports = [s for s in plan.virtual_servers if s.kind is EntryKind.NODE_PORT]
    assert all(s.destinations == (Destination("10.244.0.7", 5353),) for s in nodeports)
    cluster = next(s for s in plan.virtual_servers if s.kind is EntryKind.CLUSTER_IP)
    assert len(cluster.destinations) == 2
    assert "NETAGENT-IPVS-NODEPORT" not in plan.members
    assert sets_of(plan)["NETAGENT-IPVS-NODEPORT-LOCAL"] == {"192.168.1.10,udp:30053", "172.16.0.10,udp:30053"}


def test_nodeport_addresses_setting_limits_the_addresses():
    node = NodeContext(name="node-1", nodeport_addresses=("172.16.0.10",), local_addresses=NODE.local_addresses)
    service = ServicePort(WEB, Protocol.TCP, 80, "10.96.0.10", node_port=30080)
    plan = render_service_port(service, (Endpoint("10.244.1.5", 80),), node, SETTINGS)
    assert [str(s.key) for s in plan.virtual_servers] == ["10.96.0.10:80/TCP", "172.16.0.10:30080/TCP"]


def test_external_and_load_balancer_ips_with_source_ranges():
    service = ServicePort(WEB, Protocol.TCP, 443, "10.96.0.10", external_ips=("203.0.113.7",),
                          load_balancer_ips=("198.51.100.1",), load_balancer_source_ranges=("192.0.2.0/24", "10.0.0.1/32"))
    plan = render_service_port(service, (Endpoint("10.244.1.5", 8443),), NODE, SETTINGS)
    kinds = {str(s.key): s.kind for s in plan.virtual_servers}
    assert kinds == {"10.96.0.10:443/TCP": EntryKind.CLUSTER_IP, "203.0.113.7:443/TCP": EntryKind.EXTERNAL_IP,
                     "198.51.100.1:443/TCP": EntryKind.LOAD_BALANCER}
    assert plan.addresses == {"10.96.0.10", "203.0.113.7", "198.51.100.1"}
    members = sets_of(plan)
    assert members["NETAGENT-IPVS-EXTERNAL"] == {"203.0.113.7,tcp:443", "198.51.100.1,tcp:443"}
    assert members["NETAGENT-IPVS-LB-FW"] == {"198.51.100.1,tcp:443"}
    assert members["NETAGENT-IPVS-LB-SRC"] == {"198.51.100.1,tcp:443,192.0.2.0/24", "198.51.100.1,tcp:443,10.0.0.1"}

    local = ServicePort(WEB, Protocol.TCP, 443, "10.96.0.10", external_ips=("203.0.113.7",),
                        external_policy=TrafficPolicy.LOCAL)
    assert "NETAGENT-IPVS-EXTERNAL" not in render_service_port(local, (), NODE, SETTINGS).members


def test_source_ranges_that_allow_everyone_need_no_firewall_and_ipv6_ranges_are_left_out():
    def firewall(*ranges):
        service = ServicePort(WEB, Protocol.TCP, 443, "10.96.0.10", load_balancer_ips=("198.51.100.1",),
                              load_balancer_source_ranges=ranges)
        members = sets_of(render_service_port(service, (Endpoint("10.244.1.5", 8443),), NODE, SETTINGS))
        return members.get("NETAGENT-IPVS-LB-FW"), members.get("NETAGENT-IPVS-LB-SRC")

    assert firewall("192.0.2.0/24", "0.0.0.0/0") == (None, None)
    assert firewall("2001:db8::/32", "192.0.2.7/24") == ({"198.51.100.1,tcp:443"}, {"198.51.100.1,tcp:443,192.0.2.0/24"})
    assert firewall("2001:db8::/32") == ({"198.51.100.1,tcp:443"}, None)


def test_affinity_is_persistence_and_the_scheduler_is_configurable():
    service = ServicePort(WEB, Protocol.TCP, 80, "10.96.0.10", node_port=30080, affinity_timeout=600)
    plan = render_service_port(service, (Endpoint("10.244.1.5", 80),), NODE, IpvsSettings(scheduler=Scheduler.WEIGHTED_ROUND_ROBIN))
    assert {(s.server.scheduler, s.server.persistence_timeout) for s in plan.virtual_servers} == {("wrr", 600)}
    assert all(s.server.persistent for s in plan.virtual_servers)


def test_no_endpoints_lists_every_address_for_rejection():
    service = ServicePort(WEB, Protocol.TCP, 80, "10.96.0.10", node_port=30080, external_ips=("203.0.113.7",))
    plan = render_service_port(service, (Endpoint("10.244.1.5", 80, ready=False, serving=False),), NODE, SETTINGS)
    assert all(s.destinations == () for s in plan.virtual_servers)
    assert sets_of(plan)["NETAGENT-IPVS-NO-EP"] == {"10.96.0.10,tcp:80", "203.0.113.7,tcp:80",
                                                    "192.168.1.10,tcp:30080", "172.16.0.10,tcp:30080"}
    assert "NETAGENT-IPVS-HAIRPIN" not in plan.members


def test_terminating_endpoints_serve_only_when_nothing_is_ready():
    service = ServicePort(WEB, Protocol.TCP, 80, "10.96.0.10")
    ready = Endpoint("10.244.1.5", 80)
    terminating = Endpoint("10.244.1.6", 80, ready=False, serving=True, terminating=True)
    (server,) = render_service_port(service, (ready, terminating), NODE, SETTINGS).virtual_servers
    assert server.destinations == (Destination("10.244.1.5", 80),)
    (server,) = render_service_port(service, (terminating,), NODE, SETTINGS).virtual_servers
    assert server.destinations == (Destination("10.244.1.6", 80),)


def test_index_keeps_shared_addresses_and_members_until_the_last_owner_goes():
    dns = ServicePortName("kube-system", "dns", "dns")
    dns_tcp = ServicePortName("kube-system", "dns", "dns-tcp")
    other = ServicePortName("kube-system", "dns-copy", "dns")
    pod = Endpoint("10.244.1.5", 53)
    state = ProxyState(NODE, services={
        dns: ServicePort(dns, Protocol.UDP, 53, "10.96.0.10"),
        dns_tcp: ServicePort(dns_tcp, Protocol.TCP, 53, "10.96.0.10"),
        other: ServicePort(other, Protocol.UDP, 53, "10.96.0.11"),
    }, endpoints={dns: (pod,), dns_tcp: (pod,), other: (pod,)})
    plan = render_ipvs(state, SETTINGS)
    index = plan.index()
    index.remove(plan.services[dns])
    assert index.wanted_address("10.96.0.10")
    assert index.wanted_member("NETAGENT-IPVS-HAIRPIN", "10.244.1.5,udp:53,10.244.1.5")
    assert not index.wanted_member("NETAGENT-IPVS-CLUSTER-IP", "10.96.0.10,udp:53")
    index.remove(plan.services[other])
    assert not index.wanted_member("NETAGENT-IPVS-HAIRPIN", "10.244.1.5,udp:53,10.244.1.5")
    assert index.server(VirtualServerKey("10.96.0.10", Protocol.TCP, 53)).service == dns_tcp


def test_the_first_service_port_by_name_wins_a_shared_external_address():
    a, b = ServicePortName("default", "a"), ServicePortName("default", "b")
    state = ProxyState(NODE, services={
        b: ServicePort(b, Protocol.TCP, 80, "10.96.0.2", external_ips=("203.0.113.7",)),
        a: ServicePort(a, Protocol.TCP, 80, "10.96.0.1", external_ips=("203.0.113.7",)),
    }, endpoints={a: (Endpoint("10.244.1.1", 80),), b: (Endpoint("10.244.1.2", 80),)})
    index = render_ipvs(state, SETTINGS).index()
    claimed = index.server(VirtualServerKey("203.0.113.7", Protocol.TCP, 80))
    assert claimed.service == a and claimed.destinations == (Destination("10.244.1.1", 80),)


GOLDEN_CHAINS = [
    ("nat", "NETAGENT-IPVS-SVCS", ("PREROUTING", "OUTPUT"), [
        "! -s 10.244.0.0/16 -m set --match-set NETAGENT-IPVS-CLUSTER-IP dst,dst -j MARK --set-xmark 0x4000/0x4000",
        "-m set --match-set NETAGENT-IPVS-EXTERNAL dst,dst -j MARK --set-xmark 0x4000/0x4000",
        "-m set --match-set NETAGENT-IPVS-NODEPORT dst,dst -j MARK --set-xmark 0x4000/0x4000",
    ]),
    ("nat", "NETAGENT-IPVS-POSTRTG", ("POSTROUTING",), [
        "-m set --match-set NETAGENT-IPVS-HAIRPIN dst,dst,src -j MASQUERADE --random-fully",
        "-m mark ! --mark 0x4000/0x4000 -j RETURN",
        "-j MARK --set-xmark 0x4000/0x0",
        "-j MASQUERADE --random-fully",
    ]),
    ("filter", "NETAGENT-IPVS-FORWARD", ("FORWARD",), [
        "-m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT",
    ]),
    ("filter", "NETAGENT-IPVS-FILTER", ("INPUT", "OUTPUT", "FORWARD"), [
        "-m conntrack --ctstate NEW -m set --match-set NETAGENT-IPVS-NO-EP dst,dst -j REJECT --reject-with icmp-port-unreachable",
        "-m set --match-set NETAGENT-IPVS-LB-FW dst,dst -m set ! --match-set NETAGENT-IPVS-LB-SRC dst,dst,src -j DROP",
        "-m conntrack --ctstate NEW -m set --match-set NETAGENT-IPVS-ADDRESSES dst "
        "-m set ! --match-set NETAGENT-IPVS-CLUSTER-IP dst,dst -m set ! --match-set NETAGENT-IPVS-EXTERNAL dst,dst "
        "-m set ! --match-set NETAGENT-IPVS-EXTERNAL-LOCAL dst,dst -j DROP",
    ]),
]


def test_chains_golden():
    chains = render_ipvs_chains(cluster_cidr="10.244.0.0/16")
    assert [(c.table, c.name, c.parents, [" ".join(r) for r in c.rules]) for c in chains] == GOLDEN_CHAINS
    assert all(len(c.name) <= 28 for c in chains)


def test_chains_without_cluster_cidr_masquerade_every_source_and_old_iptables_lose_random_fully():
    chains = render_ipvs_chains(cluster_cidr=None, ports=PortRandomization.KERNEL_DEFAULT)
    assert chains[0].rules[0] == ("-m", "set", "--match-set", "NETAGENT-IPVS-CLUSTER-IP", "dst,dst",
                                  "-j", "MARK", "--set-xmark", "0x4000/0x4000")
    assert chains[1].rules[-1] == ("-j", "MASQUERADE")
