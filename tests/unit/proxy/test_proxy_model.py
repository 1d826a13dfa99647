"""The proxy's pure half: Service and EndpointSlice parsing, endpoint selection, stale UDP flows."""
from __future__ import annotations

import pytest

from proxy.conntrack import FlowFilter, stale_flows
from proxy.kube_objects import merge_endpoints, parse_endpoint_slice, parse_service
from proxy.model import (
    DEFAULT_AFFINITY_TIMEOUT,
    Endpoint,
    NodeContext,
    Protocol,
    ProxyState,
    ServicePort,
    ServicePortName,
    TrafficPolicy,
)
from proxy.selection import select_endpoints
from tests.unit.proxy.proxy_objects import endpoint, endpoint_slice, service

NODE = NodeContext(name="node-a", zone="zone-1", cluster_cidr="10.244.0.0/16")


def only(parsed):
    (port,) = parsed.ports.values()
    return port


# -- services ------------------------------------------------------------------------------------
def test_cluster_ip_service_port():
    port = only(parse_service(service("web")))
    assert port == ServicePort(name=ServicePortName("default", "web", "http"), protocol=Protocol.TCP, port=80,
                               cluster_ip="10.96.0.10")
    assert str(port.name) == "default/web:http" and not port.has_external_addresses


@pytest.mark.parametrize("obj, reason", [
    (service("h", cluster_ip="None"), "headless"),
    (service("x", kind="ExternalName", cluster_ip=""), "ExternalName"),
    (service("bad", cluster_ip="10.96.0.999"), "no IPv4 cluster IP"),
    (service("empty", ports=[]), "no ports"),
])
def test_services_not_proxied_say_why(obj, reason):
    parsed = parse_service(obj)
    assert parsed.ports == {} and reason in parsed.problems[0]


def test_dual_stack_takes_the_ipv4_family():
    obj = service("ds", cluster_ip="fd00::10")
    obj["spec"]["clusterIPs"] = ["fd00::10", "10.96.0.20"]
    assert only(parse_service(obj)).cluster_ip == "10.96.0.20"


def test_bad_port_and_address_are_dropped_and_the_rest_kept():
    obj = service("odd", ports=[{"name": "a", "port": 80, "protocol": "ICMP"}, {"name": "b", "port": 70000},
                                {"name": "c", "port": 53, "protocol": "UDP"}, "junk", {"name": "c", "port": 54}],
                  externalIPs=["203.0.113.7", "not-an-ip", "2001:db8::1"])
    parsed = parse_service(obj)
    assert list(parsed.ports) == [ServicePortName("default", "odd", "c")]
    assert parsed.ports[ServicePortName("default", "odd", "c")].external_ips == ("203.0.113.7",)
    assert len(parsed.problems) == 5   # the IPv6 external IP is the IPv6 proxy's, not a problem


def test_load_balancer_policies_affinity_and_topology():
    obj = service("lb", kind="LoadBalancer",
                  ports=[{"name": "https", "port": 443, "nodePort": 30443, "protocol": "SCTP"}],
                  externalTrafficPolicy="Local", internalTrafficPolicy="Local", healthCheckNodePort=31000,
                  sessionAffinity="ClientIP", trafficDistribution="PreferClose",
                  annotations={"service.beta.kubernetes.io/load-balancer-source-ranges": "192.0.2.0/24, 198.51.100.7"},
                  status={"loadBalancer": {"ingress": [{"ip": "198.51.100.1"}, {"hostname": "lb.example"},
                                                       {"ip": "198.51.100.2", "ipMode": "Proxy"}]}})
    port = only(parse_service(obj))
    assert port.protocol is Protocol.SCTP and port.node_port == 30443
    assert port.load_balancer_ips == ("198.51.100.1",)
    assert port.load_balancer_source_ranges == ("192.0.2.0/24", "198.51.100.7/32")
    assert port.external_policy is TrafficPolicy.LOCAL and port.internal_policy is TrafficPolicy.LOCAL
    assert port.health_check_node_port == 31000 and port.external_local
    assert port.affinity_timeout == DEFAULT_AFFINITY_TIMEOUT and port.prefer_close


def test_affinity_timeout_and_node_port_only_for_external_types():
    obj = service("a", sessionAffinity="ClientIP", sessionAffinityConfig={"clientIP": {"timeoutSeconds": 60}},
                  ports=[{"name": "http", "port": 80, "nodePort": 30080}])
    port = only(parse_service(obj))
    assert port.affinity_timeout == 60 and port.node_port is None
    obj["spec"]["sessionAffinityConfig"]["clientIP"]["timeoutSeconds"] = 10 ** 9
    assert only(parse_service(obj)).affinity_timeout == DEFAULT_AFFINITY_TIMEOUT


# -- endpoint slices -----------------------------------------------------------------------------
def test_slice_conditions_default_as_kubernetes_documents():
    parsed = parse_endpoint_slice(endpoint_slice("web-1", "web", [
        endpoint("10.244.1.5", ready=None), endpoint("10.244.1.6", ready=False, serving=True, terminating=True),
        endpoint("10.244.1.7", ready=False), {"addresses": ["fd00::1"]},
    ], trigger_time="2026-11-22T10:00:00Z"))
    eps = parsed.endpoints[("http", Protocol.TCP)]
    assert [(e.ip, e.port, e.ready, e.serving, e.terminating) for e in eps] == [
        ("10.244.1.5", 8080, True, True, False), ("10.244.1.6", 8080, False, True, True),
        ("10.244.1.7", 8080, False, False, False)]
    assert parsed.trigger_time == 1795341600.0 and parsed.problems


def test_slices_without_a_service_or_not_ipv4_are_ignored():
    orphan = endpoint_slice("x", "web", [endpoint("10.0.0.1")])
    del orphan["metadata"]["labels"]
    assert parse_endpoint_slice(orphan) is None
    assert parse_endpoint_slice(endpoint_slice("y", "web", [], address_type="IPv6")) is None


def test_merge_matches_port_name_and_protocol_and_dedups_across_slices():
    port = only(parse_service(service("web")))
    one = parse_endpoint_slice(endpoint_slice("web-1", "web", [endpoint("10.244.1.9"), endpoint("10.244.1.10")]))
    two = parse_endpoint_slice(endpoint_slice("web-2", "web", [endpoint("10.244.1.9", ready=False)]))
    udp = parse_endpoint_slice(endpoint_slice("web-3", "web", [endpoint("10.244.1.1")],
                                              ports=[{"name": "http", "port": 8080, "protocol": "UDP"}]))
    merged = merge_endpoints(port, [one, two, udp])
    assert [(e.ip, e.ready) for e in merged] == [("10.244.1.9", True), ("10.244.1.10", True)]


# -- selection -----------------------------------------------------------------------------------
def svc(**fields) -> ServicePort:
    return ServicePort(name=ServicePortName("default", "web", "http"), protocol=Protocol.TCP, port=80,
                       cluster_ip="10.96.0.10", **fields)


def ep(ip, node="node-a", **fields) -> Endpoint:
    return Endpoint(ip=ip, port=8080, node_name=node, **fields)


def test_ready_endpoints_and_the_terminating_fallback():
    ready, terminating = ep("10.0.0.1"), ep("10.0.0.2", ready=False, terminating=True)
    dead = ep("10.0.0.3", ready=False, serving=False, terminating=True)
    assert select_endpoints(svc(), [ready, terminating, dead], NODE).cluster == (ready,)
    fallback = select_endpoints(svc(), [terminating, dead], NODE)
    assert fallback.cluster == (terminating,) and fallback.has_endpoints
    nothing = select_endpoints(svc(), [dead], NODE)
    assert nothing.cluster == () and not nothing.has_endpoints


def test_local_policies():
    here, there = ep("10.0.0.1"), ep("10.0.0.2", node="node-b")
    internal = select_endpoints(svc(internal_policy=TrafficPolicy.LOCAL), [here, there], NODE)
    assert internal.cluster == (here,) and internal.external == ()
    external = select_endpoints(svc(node_port=30080, external_policy=TrafficPolicy.LOCAL), [here, there], NODE)
    assert external.cluster == (here, there) and external.external == (here,) and external.local_ready == 1
    none_here = select_endpoints(svc(node_port=30080, external_policy=TrafficPolicy.LOCAL), [there], NODE)
    assert none_here.external == () and none_here.has_endpoints


def test_topology_hints_only_when_asked_and_usable():
    same, other = ep("10.0.0.1", zone_hints=frozenset({"zone-1"})), ep("10.0.0.2", zone_hints=frozenset({"zone-2"}))
    assert select_endpoints(svc(), [same, other], NODE).cluster == (same, other)
    assert select_endpoints(svc(prefer_close=True), [same, other], NODE).cluster == (same,)
    unhinted = ep("10.0.0.3")
    assert select_endpoints(svc(prefer_close=True), [same, unhinted], NODE).cluster == (same, unhinted)
    far = ep("10.0.0.4", zone_hints=frozenset({"zone-9"}))
    assert select_endpoints(svc(prefer_close=True), [far, other], NODE).cluster == (far, other)
    mine = ep("10.0.0.5", node_hints=frozenset({"node-a"}), zone_hints=frozenset({"zone-2"}))
    theirs = ep("10.0.0.6", node_hints=frozenset({"node-b"}), zone_hints=frozenset({"zone-1"}))
    assert select_endpoints(svc(prefer_close=True), [mine, theirs], NODE).cluster == (mine,)


# -- stale UDP flows -----------------------------------------------------------------------------
def udp_state(*ips, node_port=None) -> ProxyState:
    name = ServicePortName("kube-system", "dns", "dns")
    port = ServicePort(name=name, protocol=Protocol.UDP, port=53, cluster_ip="10.96.0.10", node_port=node_port,
                       external_ips=("203.0.113.5",))
    return ProxyState(node=NODE, services={name: port},
                      endpoints={name: tuple(Endpoint(ip=ip, port=5353) for ip in ips)} if ips else {})


def test_removed_udp_endpoint_flows_are_deleted_per_service_address():
    name = ServicePortName("kube-system", "dns", "dns")
    flows = stale_flows(udp_state("10.244.1.5", "10.244.2.5", node_port=30053), udp_state("10.244.2.5", node_port=30053),
                        frozenset({name}))
    assert flows == [FlowFilter(port=53, address="10.96.0.10", reply_source="10.244.1.5"),
                     FlowFilter(port=53, address="203.0.113.5", reply_source="10.244.1.5"),
                     FlowFilter(port=30053, address=None, reply_source="10.244.1.5")]
    assert flows[0].argv() == ["-D", "-p", "udp", "--orig-dst", "10.96.0.10", "--orig-port-dst", "53",
                               "--reply-src", "10.244.1.5"]


def test_first_udp_endpoint_clears_the_rejected_flows_and_tcp_is_left_alone():
    name = ServicePortName("kube-system", "dns", "dns")
    flows = stale_flows(udp_state(), udp_state("10.244.1.5"), frozenset({name}))
    assert flows == [FlowFilter(port=53, address="10.96.0.10"), FlowFilter(port=53, address="203.0.113.5")]
    assert stale_flows(udp_state("10.244.1.5"), udp_state("10.244.1.5", "10.244.1.6"), frozenset({name})) == []
    tcp = ServicePort(name=name, protocol=Protocol.TCP, port=53, cluster_ip="10.96.0.10")
    before = ProxyState(node=NODE, services={name: tcp}, endpoints={name: (Endpoint(ip="10.244.1.5", port=53),)})
    after = ProxyState(node=NODE, services={name: tcp})
    assert stale_flows(before, after, frozenset({name})) == []
