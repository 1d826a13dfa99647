"""External IPs that cannot hijack (issue 29, item 4): a Service's external or load-balancer IP that
is the API server's, this node's, or inside the pod or Service network is left out (the rest of the
Service programmed) and the Service rejected `forbidden-address`; `--deny-external-ips` refuses
every external IP.

Through the proxy's real path short of the API: its recorders, `_sync`, the catalog, and the IPVS
backend on its fakes (the mode where an external IP becomes a local address of every node).
"""
from __future__ import annotations

import dataclasses
from types import SimpleNamespace

from netagent.infra.metrics import Registry
from netagent.infra.rejections import Rejections
from netagent.infra.sync_runner import SyncKind
from netagent.kernel.fake_sysctl import FakeSysctls
from netagent.kernel.ipset import FakeIpset, iptables_references
from netagent.kernel.iptables.fake import FakeIptables
from proxy.fake_local_addresses import FakeLocalAddresses
from proxy.ipvs.fake_device import FakeAddressDevice
from proxy.ipvs.fake_table import FakeIpvsTable
from proxy.ipvs.proxy import IpvsProxy
from proxy.ipvs.sysctls import IPVS_SYSCTLS
from proxy.limits import ProxyLimits
from proxy.model import ServicePortName
from proxy.service_proxy import ProxySettings, ServiceProxy
from tests.unit.proxy.proxy_objects import endpoint, endpoint_slice, service

API_SERVER, NODE_ADDRESS = "192.168.1.2", "192.168.1.10"
GOOD = "203.0.113.7"
EDGE = ServicePortName("tenant", "edge", "http")


def limits(**policy) -> ProxyLimits:
    """Limits with the external-IP policy, when this ProxyLimits has one (so the tests also run,
    and fail for what the code does, against a proxy without it)."""
    if "external_ips" not in {field.name for field in dataclasses.fields(ProxyLimits)}:
        return ProxyLimits()
    from proxy.external_ips import ExternalIpPolicy
    return ProxyLimits(external_ips=ExternalIpPolicy(**policy))


def make_proxy(**policy):
    iptables = FakeIptables()
    device = FakeAddressDevice()
    backend = IpvsProxy(table=FakeIpvsTable(), device=device, ipset=FakeIpset(in_use=iptables_references(iptables)),
                        iptables=iptables, sysctls=FakeSysctls({s.key: "0" for s in IPVS_SYSCTLS}))
    rejections = Rejections()
    client = SimpleNamespace(configuration=SimpleNamespace(host=f"https://{API_SERVER}:6443"))
    proxy = ServiceProxy(api_client=client, backend=backend, registry=Registry(),
                         settings=ProxySettings(node_name="node-a", cluster_cidr="10.244.0.0/16",
                                                limits=limits(**policy)),
                         local_addresses=FakeLocalAddresses({"eth0": (NODE_ADDRESS,)}),
                         rejections=rejections.scope("proxy"))
    return proxy, device, rejections


def edge(*external_ips: str, lb_ips: tuple[str, ...] = ()) -> dict:
    status = {"loadBalancer": {"ingress": [{"ip": ip} for ip in lb_ips]}} if lb_ips else None
    return service("edge", namespace="tenant", cluster_ip="10.96.0.20", kind="LoadBalancer" if lb_ips else "ClusterIP",
                   status=status, externalIPs=list(external_ips))


def sync(proxy, *objects: dict, slices: tuple[dict, ...] = ()):
    for obj in objects:
        proxy.services.on_add(obj)
    for obj in slices:
        proxy.slices.on_add(obj)
    proxy._sync(SyncKind.FULL)
    return proxy.catalog.state()


def test_an_external_ip_of_the_api_server_node_or_cluster_networks_is_not_made_local_and_is_reported():
    proxy, device, rejections = make_proxy(service_cidrs=("10.96.0.0/16",))
    state = sync(proxy, edge(API_SERVER, NODE_ADDRESS, "10.244.3.4", "10.96.5.5", "127.0.0.1", GOOD))
    assert state.services[EDGE].external_ips == (GOOD,)
    assert device.addresses() == {"10.96.0.20", GOOD}, "no hijacked address is local on the node"
    [record] = rejections.snapshot()
    assert (record.ref.key, record.reason) == ("tenant/edge", "forbidden-address")
    for address, why in ((API_SERVER, "API server"), (NODE_ADDRESS, "this node"), ("10.244.3.4", "pod network"),
                         ("10.96.5.5", "Service network"), ("127.0.0.1", "unicast")):
        assert f"external IP {address}: " in record.detail and why in record.detail
    fixed = edge(GOOD)
    proxy.services.on_update(edge(API_SERVER, GOOD), fixed)
    proxy._sync(SyncKind.PARTIAL)
    assert rejections.snapshot() == [], "a fixed Service is accepted again"


def test_load_balancer_ips_are_screened_too_and_their_source_ranges_go_with_them():
    proxy, device, rejections = make_proxy()
    obj = edge(lb_ips=(API_SERVER, "198.51.100.9"))
    state = sync(proxy, obj)
    assert state.services[EDGE].load_balancer_ips == ("198.51.100.9",)
    assert API_SERVER not in device.addresses()
    assert "load-balancer IP 192.168.1.2: the API server's address" in rejections.snapshot()[0].detail


def test_the_api_servers_published_in_default_kubernetes_are_refused_even_when_they_come_later():
    proxy, device, rejections = make_proxy()
    apiserver = "172.18.0.2"
    state = sync(proxy, edge(apiserver, GOOD))   # not known yet: an ordinary address
    assert state.services[EDGE].external_ips == (apiserver, GOOD)
    kubernetes = endpoint_slice("kubernetes", "kubernetes", [endpoint(apiserver, node=None)],
                                ports=[{"name": "https", "port": 6443, "protocol": "TCP"}])
    state = sync(proxy, slices=(kubernetes,))
    assert state.services[EDGE].external_ips == (GOOD,)
    assert apiserver not in device.addresses()
    assert rejections.snapshot()[0].reason == "forbidden-address"


def test_an_address_the_node_gains_is_refused_from_the_next_full_sync():
    proxy, device, _ = make_proxy()
    assert sync(proxy, edge("192.168.1.11", GOOD)).services[EDGE].external_ips == ("192.168.1.11", GOOD)
    proxy._local_addresses.add("eth0", "192.168.1.11")
    proxy._sync(SyncKind.FULL)
    assert proxy.catalog.state().services[EDGE].external_ips == (GOOD,)


def test_deny_external_ips_refuses_every_external_ip_but_keeps_the_service_and_its_load_balancer_ip():
    proxy, _, rejections = make_proxy(deny_external_ips=True)
    state = sync(proxy, edge(GOOD, lb_ips=("198.51.100.9",)))
    port = state.services[EDGE]
    assert (port.external_ips, port.load_balancer_ips, port.cluster_ip) == ((), ("198.51.100.9",), "10.96.0.20")
    assert "--deny-external-ips" in rejections.snapshot()[0].detail


def test_the_flags():
    from netagent.cli import build_parser
    from proxy.external_ips import ExternalIpPolicy
    from proxy.limits import limits_from_args
    args = build_parser().parse_args(["run", "--deny-external-ips", "--service-cidr", "10.96.0.0/12",
                                      "--service-cidr", "fd00:96::/108"])
    assert limits_from_args(args).external_ips == ExternalIpPolicy(deny_external_ips=True,
                                                                  service_cidrs=("10.96.0.0/12", "fd00:96::/108"))
    assert limits_from_args(build_parser().parse_args(["run"])).external_ips == ExternalIpPolicy()
