"""The proxy's parsing and catalog per IP family: dual-stack and single-stack IPv6 Services,
IPv6 EndpointSlices, hostile family fields, and the node's addresses of each family."""
from __future__ import annotations

import pytest

from netagent.infra.metrics import Registry
from netagent.kernel.families import IpFamily
from proxy.catalog import ServiceCatalog
from proxy.fake_local_addresses import FakeLocalAddresses
from proxy.kube_objects import MalformedObject, parse_endpoint_slice, parse_service
from proxy.metrics import ProxyMetrics
from netagent.kernel.ipset import FakeIpset, iptables_references
from netagent.kernel.iptables.fake import FakeIptables
from proxy.iptables import IptablesProxy
from proxy.model import Endpoint, NodeContext, Protocol, ProxyState, ServicePort, ServicePortName
from proxy.nodeport_addresses import of_family, parse_nodeport_cidrs
from tests.unit.proxy.proxy_objects import endpoint, endpoint_slice, service

V4, V6 = IpFamily.V4, IpFamily.V6
WEB = ServicePortName("default", "web", "http")


def dual(name: str = "web", **spec) -> dict:
    obj = service(name, cluster_ip="10.96.0.10", **spec)
    obj["spec"].update(clusterIPs=["10.96.0.10", "fd00:10:96::a"], ipFamilies=["IPv4", "IPv6"],
                       ipFamilyPolicy="RequireDualStack")
    return obj


def v6_only(name: str = "web", **spec) -> dict:
    obj = service(name, cluster_ip="fd00:10:96::a", **spec)
    obj["spec"].update(ipFamilies=["IPv6"], ipFamilyPolicy="SingleStack")
    return obj


def test_a_dual_stack_service_gives_each_family_its_own_cluster_ip():
    obj = dual(externalIPs=["203.0.113.7", "2001:db8::7", "2001:DB8::7"])
    v4, v6 = (parse_service(obj, family=f).ports[WEB] for f in (V4, V6))
    assert (v4.cluster_ip, v4.external_ips) == ("10.96.0.10", ("203.0.113.7",))
    assert (v6.cluster_ip, v6.external_ips) == ("fd00:10:96::a", ("2001:db8::7",))   # canonical, once
    assert parse_service(obj, family=V6).problems == ()


def test_ipv6_first_dual_stack_and_prefer_dual_stack_with_one_ip():
    obj = service("web", cluster_ip="fd00:10:96::a")
    obj["spec"].update(clusterIPs=["fd00:10:96::a", "10.96.0.10"], ipFamilies=["IPv6", "IPv4"],
                       ipFamilyPolicy="PreferDualStack")
    assert parse_service(obj).ports[WEB].cluster_ip == "10.96.0.10"
    assert parse_service(obj, family=V6).ports[WEB].cluster_ip == "fd00:10:96::a"
    obj["spec"].update(clusterIPs=["10.96.0.10"], ipFamilies=["IPv4"])   # a single-stack cluster's answer
    assert parse_service(obj, family=V6).ports == {}


def test_a_single_stack_service_is_absent_from_the_other_family_without_a_problem():
    assert parse_service(v6_only(), family=V4).ports == {} and parse_service(v6_only(), family=V4).problems == ()
    assert parse_service(service("web"), family=V6).ports == {}
    assert parse_service(service("web"), family=V6).problems == ()
    assert parse_service(v6_only(), family=V6).ports[WEB].cluster_ip == "fd00:10:96::a"


def test_an_address_of_a_family_not_in_ip_families_is_not_the_services():
    obj = service("web")
    obj["spec"].update(clusterIPs=["10.96.0.10"], ipFamilies=["IPv4"])
    obj["spec"]["externalIPs"] = ["2001:db8::7"]
    assert parse_service(obj, family=V6).ports == {}


def test_load_balancer_ips_and_source_ranges_of_each_family():
    obj = dual(kind="LoadBalancer", loadBalancerSourceRanges=["198.51.100.0/24", "2001:db8:1::/48"],
               status={"loadBalancer": {"ingress": [{"ip": "192.0.2.9"}, {"ip": "2001:db8::9"}]}})
    obj["status"] = {"loadBalancer": {"ingress": [{"ip": "192.0.2.9"}, {"ip": "2001:db8::9"}]}}
    v6 = parse_service(obj, family=V6).ports[WEB]
    assert v6.load_balancer_ips == ("2001:db8::9",) and v6.load_balancer_source_ranges == ("2001:db8:1::/48",)
    v4 = parse_service(obj, family=V4).ports[WEB]
    assert v4.load_balancer_ips == ("192.0.2.9",) and v4.load_balancer_source_ranges == ("198.51.100.0/24",)


def test_source_ranges_of_the_other_family_only_admit_no_client_of_this_one():
    """Restricted to IPv4 clients: the IPv6 load-balancer address is fenced shut (fail closed),
    not left open to every IPv6 client; an unrestricted Service stays open in both."""
    obj = dual(kind="LoadBalancer", loadBalancerSourceRanges=["198.51.100.0/24"])
    obj["status"] = {"loadBalancer": {"ingress": [{"ip": "192.0.2.9"}, {"ip": "2001:db8::9"}]}}
    assert parse_service(obj, family=V6).ports[WEB].load_balancer_source_ranges == ("::/128",)
    assert parse_service(obj, family=V4).ports[WEB].load_balancer_source_ranges == ("198.51.100.0/24",)
    del obj["spec"]["loadBalancerSourceRanges"]
    assert parse_service(obj, family=V6).ports[WEB].load_balancer_source_ranges == ()


def test_addresses_and_ranges_with_an_ipv6_zone_are_skipped_as_problems():
    """`ipaddress` reads `fe80::1%eth0` (and any text after the `%`, a newline too); no Service
    address, endpoint or client range has a zone: each is a problem and left out, and ranges
    that were all zoned fence the address shut (fail closed), never open."""
    zoned = "fe80::1%eth0\nflush ruleset"
    obj = v6_only(kind="LoadBalancer", externalIPs=[zoned, "2001:db8::7"],
                  loadBalancerSourceRanges=["fe80::%eth0\nflush ruleset/64", zoned])
    obj["status"] = {"loadBalancer": {"ingress": [{"ip": "2001:db8::9"}, {"ip": "fe80::9%lo"}]}}
    parsed = parse_service(obj, family=V6)
    port = parsed.ports[WEB]
    assert port.external_ips == ("2001:db8::7",) and port.load_balancer_ips == ("2001:db8::9",)
    assert port.load_balancer_source_ranges == ("::/128",)
    assert len(parsed.problems) == 4 and all("skipped" in problem and "\n" not in problem for problem in parsed.problems)
    slice_ = endpoint_slice("web-1", "web", [endpoint("fe80::5%eth0"), endpoint("fd00:10:244::5")],
                            address_type="IPv6")
    (endpoints,) = parse_endpoint_slice(slice_, family=V6).endpoints.values()
    assert [e.ip for e in endpoints] == ["fd00:10:244::5"]


@pytest.mark.parametrize("change, why", [
    ({"clusterIPs": ["10.96.0.10", "fd00::a", "10.96.0.11"]}, "3 entries"),
    ({"clusterIPs": ["fd00::a", "fd00::b"], "ipFamilies": None}, "two IPv6"),
    ({"clusterIPs": ["10.96.0.10", "10.96.0.11"], "ipFamilies": None}, "two IPv4"),
    ({"ipFamilies": ["IPv6", "IPv4"]}, r"not of spec\.ipFamilies\[0\]"),
    ({"ipFamilies": ["IPv4", "IPv4"]}, "twice"),
    ({"ipFamilies": ["IPv5"]}, "not IPv4 or IPv6"),
    ({"ipFamilies": "IPv4"}, "not a list"),
    ({"ipFamilyPolicy": "SingleStack"}, "SingleStack with two"),
    ({"ipFamilyPolicy": "Whatever"}, "is not one of"),
    ({"ipFamilyPolicy": 7}, "not a string"),
])
@pytest.mark.parametrize("family", [V4, V6])
def test_contradicting_family_fields_are_malformed_for_both_families(change, why, family):
    obj = dual()
    obj["spec"].update(change)
    with pytest.raises(MalformedObject, match=why):
        parse_service(obj, family=family)


def test_ipv6_slices_feed_the_ipv6_family_only():
    v6 = endpoint_slice("web-v6", "web", [endpoint("FD00:10:244:1::5"), endpoint("10.244.1.5")],
                        address_type="IPv6")
    parsed = parse_endpoint_slice(v6, family=V6)
    assert [e.ip for e in parsed.endpoints[("http", parsed_protocol(parsed))]] == ["fd00:10:244:1::5"]
    assert "has no IPv6 address" in parsed.problems[0]
    assert parse_endpoint_slice(v6, family=V4) is None
    assert parse_endpoint_slice(endpoint_slice("web-v4", "web", [endpoint("10.244.1.5")]), family=V6) is None
    fqdn = endpoint_slice("web-dns", "web", [endpoint("example.com")], address_type="FQDN")
    assert parse_endpoint_slice(fqdn, family=V4) is None and parse_endpoint_slice(fqdn, family=V6) is None


def parsed_protocol(parsed):
    ((_, protocol),) = parsed.endpoints
    return protocol


def changes(*objs):
    return {f"{o['metadata']['namespace']}/{o['metadata']['name']}": (None, o) for o in objs}


def test_each_familys_catalog_holds_its_half_of_a_dual_stack_cluster():
    services = changes(dual("web"), v6_only("six"), service("four", cluster_ip="10.96.0.44"))
    slices = changes(endpoint_slice("web-a", "web", [endpoint("10.244.1.5")]),
                     endpoint_slice("web-b", "web", [endpoint("fd00:10:244:1::5"), endpoint("fd00:10:244:1::3")],
                                    address_type="IPv6"),
                     endpoint_slice("six-a", "six", [endpoint("fd00:10:244:1::6")], address_type="IPv6"))
    catalogs = {f: ServiceCatalog(NodeContext(name="node-a", family=f), family=f) for f in (V4, V6)}
    states = {f: c.apply(services, slices).state for f, c in catalogs.items()}
    assert sorted(n.name for n in states[V4].services) == ["four", "web"]
    assert sorted(n.name for n in states[V6].services) == ["six", "web"]
    assert [e.ip for e in states[V6].endpoints_of(WEB)] == ["fd00:10:244:1::3", "fd00:10:244:1::5"]
    assert [e.ip for e in states[V4].endpoints_of(WEB)] == ["10.244.1.5"]
    assert states[V6].family is V6 and all(not c.rejected() and not c.problems for c in catalogs.values())


def test_a_catalog_refuses_a_node_context_of_the_other_family():
    with pytest.raises(ValueError):
        ServiceCatalog(NodeContext(name="node-a"), family=V6)


def test_local_addresses_and_nodeport_cidrs_per_family():
    local = FakeLocalAddresses({"eth0": ("192.168.1.10", "2001:db8::10", "fe80::1"), "lo": ("::1",),
                                "eth1": ("2001:db8::2",)})
    assert local.of_family(V6) == ("2001:db8::2", "2001:db8::10")    # numeric order, no link-local
    assert local.ipv4() == ("192.168.1.10",)
    cidrs = parse_nodeport_cidrs(["192.168.1.0/24,2001:db8::/64"])
    assert of_family(cidrs, V6) == ("2001:db8::/64",) and of_family(cidrs, V4) == ("192.168.1.0/24",)


def test_shared_metrics_count_both_families():
    registry = Registry()
    metrics = ProxyMetrics(registry)
    metrics.of_family(V4, metrics.services, 3)
    metrics.of_family(V6, metrics.services, 2)
    metrics.of_family(V4, metrics.services, 4)
    metrics.of_family(V6, metrics.no_local_endpoints, 1, traffic_policy="external")
    assert metrics.services.value == 6
    assert metrics.no_local_endpoints.labels(traffic_policy="external").value == 1


# -- the iptables backend per family (fakes) -----------------------------------------------------
def _ipv6_state(*hosts: int) -> ProxyState:
    port = ServicePort(name=WEB, protocol=Protocol.TCP, port=80, cluster_ip="fd00:10:96::a", node_port=30080)
    node = NodeContext(name="node-a", cluster_cidr="fd00:10:244::/56", family=V6)
    return ProxyState(node, {WEB: port}, {WEB: tuple(Endpoint(f"fd00:10:244:1::{h:x}", 8080) for h in hosts)})


def test_the_ipv6_iptables_backend_writes_ip6tables_and_an_inet6_hairpin_set():
    v4_tables, v6_tables = FakeIptables(), FakeIptables(family=V6)
    ipset = FakeIpset(in_use=iptables_references(v6_tables))
    backend = IptablesProxy(iptables=v6_tables, ipset=ipset)
    backend.sync(_ipv6_state(5, 6), changed=None)
    assert "-j DNAT --to-destination [fd00:10:244:1::5]:8080" in v6_tables.save()
    assert "NETAGENT" not in v4_tables.save()
    (held,) = ipset.snapshot().values()
    assert (held.name, held.family) == ("NETAGENT-HAIRPIN6", "inet6")
    assert held.members == {"fd00:10:244:1::5,tcp:8080,fd00:10:244:1::5", "fd00:10:244:1::6,tcp:8080,fd00:10:244:1::6"}
    backend.sync(_ipv6_state(6), changed=frozenset({WEB}))        # partial: the gone endpoint leaves the set
    assert ipset.snapshot()["NETAGENT-HAIRPIN6"].members == {"fd00:10:244:1::6,tcp:8080,fd00:10:244:1::6"}
    assert [s.backends for s in backend.programmed() if s.kind == "ClusterIP"] == [("[fd00:10:244:1::6]:8080",)]
    with pytest.raises(ValueError, match="IPv4 state"):
        IptablesProxy(iptables=FakeIptables(family=V6), ipset=FakeIpset()).sync(ProxyState(NodeContext(name="n")),
                                                                             changed=None)
    backend.cleanup()
    assert "NETAGENT" not in v6_tables.save() and not ipset.snapshot()


def test_the_factory_builds_an_ipv6_ipvs_backend_on_ip6tables():
    from netagent.kernel.iptables.backend import IptablesBackend
    from proxy.factory import IpvsSpec, build_backend
    backend = build_backend(IpvsSpec(IptablesBackend.LEGACY), family=V6)
    assert backend.family is V6 and backend.iptables.family is V6


# -- the daemon: one proxy per family --------------------------------------------------------------
def _proxy_config(*extra: str):
    from netagent.cli import build_parser
    from netagent.daemon.config import parse_run_config
    cluster = parse_run_config(build_parser().parse_args([
        "run", "--node-name", "node-a", "--cluster-cidr", "10.244.0.0/16", "--proxy-mode", "iptables",
        "--metrics-bind-address", "", "--healthz-bind-address", "127.0.0.1:0", *extra])).cluster
    assert cluster is not None
    return cluster.proxy


@pytest.mark.parametrize("cidrs, runners", [
    ({V4: "10.244.0.0/16"}, ["proxy"]),
    ({V4: "10.244.0.0/16", V6: "fd00:10:244::/56"}, ["proxy", "proxy-ipv6"]),
    ({V6: "fd00:10:244::/56"}, ["proxy-ipv6"]),
])
def test_build_proxy_builds_one_proxy_per_cluster_family(cidrs, runners):
    from netagent.daemon.proxy_start import build_proxy
    from netagent.kernel.iptables.backend import IptablesBackend
    from proxy.backend import ProxyMode
    registry = Registry()
    parts = build_proxy(_proxy_config(), mode=ProxyMode.IPTABLES, metrics_binds=(), api_client=None,
                        iptables_backend=IptablesBackend.LEGACY, registry=registry,
                        cluster_cidrs=cidrs)
    assert [p.runner.name for p in parts.proxies] == runners
    assert [p.backend.iptables.family for p in parts.proxies] == [IpFamily.from_label(
        "IPv6" if name.endswith("ipv6") else "IPv4") for name in runners]
    assert [p.settings.cluster_cidr for p in parts.proxies] == [cidrs[p.family] for p in parts.proxies]
    assert len({id(p.metrics) for p in parts.proxies}) == 1 and len(parts.node_listeners) == len(runners)
    report = parts.servers[0].health()
    assert not report.healthy and all(f"{name}: not synced yet" in report.reason for name in runners)
    assert registry.render().count("# TYPE kubeproxy_sync_proxy_rules_duration_seconds ") == 1


@pytest.mark.parametrize("text, spelled", [
    ("FD00:0:0::0:5", "fd00::5"), ("fd00:0:0:1:0:0:0:5", "fd00:0:0:1::5"), ("fd00:1:0:1:0:1:0:5", "fd00:1:0:1:0:1:0:5"),
    ("::ffff:10.0.0.1", "::ffff:a00:1"), ("::10.0.0.1", "::a00:1"), ("2001:db8::7/128", "2001:db8::7"),
])
def test_ipv6_set_members_are_spelled_as_ipaddress_and_ipset_save_do(text, spelled):
    from netagent.kernel.ipset.model import _address6
    assert _address6(text) == spelled


@pytest.mark.parametrize("text", ["fe80::1%eth0", "fd00::1::2", "fd00::g", "10.0.0.1", ""])
def test_an_ipv6_set_member_that_is_not_one_address_is_refused(text):
    from netagent.kernel.ipset.model import IpsetError, _address6
    with pytest.raises(IpsetError):
        _address6(text)
