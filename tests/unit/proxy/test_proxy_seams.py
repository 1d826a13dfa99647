"""The service proxy's shared ideas and kernel seams (issue 19): one entry-point model, endpoint
selection once per service port per sync, conntrack cleanup through `Conntrack` (driven here
on `FakeConntrack`), and the node's addresses through `LocalAddresses` (`FakeLocalAddresses`).

The proxy runs its real path short of the API: its recorders, `_sync`, the catalog and the
iptables backend on `FakeIptables`/`FakeIpset`.
"""
from __future__ import annotations

import pytest

import proxy.selection
from netagent.infra.metrics import Registry
from netagent.infra.sync_runner import SyncKind
from netagent.kernel.ipset import FakeIpset, iptables_references
from netagent.kernel.iptables.fake import FakeIptables
from proxy.conntrack import FlowFilter
from proxy.fake_conntrack import FakeConntrack, UdpEntry
from proxy.fake_local_addresses import FakeLocalAddresses
from proxy.iptables import IptablesProxy
from proxy.model import EntryKind, EntryPoint, NodeContext, Protocol, ServicePort, ServicePortName
from proxy.service_proxy import ProxySettings, ServiceProxy
from tests.unit.proxy.proxy_objects import endpoint, endpoint_slice, service

DNS = ServicePortName("default", "dns", "dns")
UDP_PORTS = [{"name": "dns", "port": 53, "protocol": "UDP", "nodePort": 30053}]


def dns_service() -> dict:
    return service("dns", kind="NodePort", ports=UDP_PORTS, externalIPs=["203.0.113.5"])


def dns_slice(*ips: str) -> dict:
    return endpoint_slice("dns-1", "dns", [endpoint(ip) for ip in ips],
                          ports=[{"name": "dns", "port": 5353, "protocol": "UDP"}])


def make_proxy(*, conntrack=None, local=None, **settings):
    iptables = FakeIptables()
    backend = IptablesProxy(iptables=iptables, ipset=FakeIpset(in_use=iptables_references(iptables)))
    return ServiceProxy(api_client=None, settings=ProxySettings(node_name="node-a", **settings), backend=backend,
                        registry=Registry(), conntrack=conntrack, local_addresses=local)


# ---- one entry-point model --------------------------------------------------------------------

def test_entry_points_in_one_order_with_nodeports_spelled_out_or_any():
    port = ServicePort(DNS, Protocol.UDP, 53, "10.96.0.10", node_port=30053, external_ips=("203.0.113.5",),
                       load_balancer_ips=("198.51.100.1",))
    node = NodeContext(name="node-a", local_addresses=("192.168.1.10", "172.16.0.10"))
    assert port.entry_points() == (
        EntryPoint(EntryKind.CLUSTER_IP, "10.96.0.10", 53), EntryPoint(EntryKind.EXTERNAL_IP, "203.0.113.5", 53),
        EntryPoint(EntryKind.LOAD_BALANCER, "198.51.100.1", 53), EntryPoint(EntryKind.NODE_PORT, None, 30053))
    assert [p.address for p in port.entry_points(node) if p.kind is EntryKind.NODE_PORT] == [
        "192.168.1.10", "172.16.0.10"]
    assert [p.kind.external for p in port.entry_points()] == [False, True, True, True]
    assert ServicePort(DNS, Protocol.UDP, 53, "10.96.0.11").entry_points() == (
        EntryPoint(EntryKind.CLUSTER_IP, "10.96.0.11", 53),)


# ---- selection once per port per sync ---------------------------------------------------------

def test_each_changed_port_is_selected_once_per_sync(monkeypatch):
    """Rendering, conntrack cleanup and the Local-policy metrics share one selection per port."""
    calls: list[ServicePortName] = []
    real = proxy.selection.select_endpoints

    def counting(service, endpoints, node):
        calls.append(service.name)
        return real(service, endpoints, node)
    monkeypatch.setattr(proxy.selection, "select_endpoints", counting)
    tracked = FakeConntrack()
    svc = make_proxy(conntrack=tracked)
    svc.services.on_add(dns_service())
    svc.services.on_add(service("web", cluster_ip="10.96.0.20"))
    svc.slices.on_add(dns_slice("10.244.1.5", "10.244.1.6"))
    svc._sync(SyncKind.FULL)
    assert sorted(calls) == sorted([DNS, ServicePortName("default", "web", "http")])
    calls.clear()
    svc.slices.on_update(dns_slice("10.244.1.5", "10.244.1.6"), dns_slice("10.244.1.6"))
    svc._sync(SyncKind.PARTIAL)
    assert calls == [DNS]          # the new state's, once; the previous state's was kept from the last sync
    assert tracked.deletions       # and conntrack cleanup did run on it


# ---- conntrack through the seam ---------------------------------------------------------------

def test_a_gone_udp_endpoint_loses_its_flows_and_only_those():
    rejected = UdpEntry("10.96.0.10", 53, "10.96.0.10")   # a flow from while the service rejected
    tracked = FakeConntrack((rejected,))
    svc = make_proxy(conntrack=tracked)
    svc.services.on_add(dns_service())
    svc.slices.on_add(dns_slice("10.244.1.5", "10.244.1.6"))
    svc._sync(SyncKind.FULL)
    assert tracked.deletions == [FlowFilter(port=53, address="10.96.0.10"), FlowFilter(port=53, address="203.0.113.5"),
                                 FlowFilter(port=30053)]    # the first endpoints: the rejecting flows go
    assert tracked.entries == set()
    tracked.deletions.clear()
    for entry in (UdpEntry("10.96.0.10", 53, "10.244.1.5"), UdpEntry("10.96.0.10", 53, "10.244.1.6"),
                  UdpEntry("192.168.1.10", 30053, "10.244.1.5"), UdpEntry("10.96.0.99", 53, "10.244.1.5")):
        tracked.add(destination=entry.destination, port=entry.port, reply_source=entry.reply_source)
    svc.slices.on_update(dns_slice("10.244.1.5", "10.244.1.6"), dns_slice("10.244.1.6"))
    svc._sync(SyncKind.PARTIAL)
    assert set(tracked.deletions) == {FlowFilter(port=53, address="10.96.0.10", reply_source="10.244.1.5"),
                                      FlowFilter(port=53, address="203.0.113.5", reply_source="10.244.1.5"),
                                      FlowFilter(port=30053, reply_source="10.244.1.5")}
    assert tracked.entries == {UdpEntry("10.96.0.10", 53, "10.244.1.6"), UdpEntry("10.96.0.99", 53, "10.244.1.5")}
    assert svc.metrics.conntrack_deleted.value >= 2


def test_a_failing_conntrack_costs_the_sync_nothing():
    tracked = FakeConntrack()
    tracked.fail_on.add(FlowFilter(port=53, address="10.96.0.10", reply_source="10.244.1.5"))
    svc = make_proxy(conntrack=tracked)
    svc.services.on_add(dns_service())
    svc.slices.on_add(dns_slice("10.244.1.5", "10.244.1.6"))
    svc._sync(SyncKind.FULL)
    tracked.add(destination="10.96.0.10", port=53, reply_source="10.244.1.5")
    tracked.add(destination="192.168.1.10", port=30053, reply_source="10.244.1.5")
    svc.slices.on_update(dns_slice("10.244.1.5", "10.244.1.6"), dns_slice("10.244.1.6"))
    svc._sync(SyncKind.PARTIAL)      # does not raise: the failing filter is logged, the rest still run
    assert tracked.entries == {UdpEntry("10.96.0.10", 53, "10.244.1.5")}
    tracked.fail_all = True
    svc.slices.on_update(dns_slice("10.244.1.6"), dns_slice())
    svc._sync(SyncKind.PARTIAL)
    assert svc.runner is not None and DNS in svc._programmed.services


# ---- the node's addresses through the seam ----------------------------------------------------

def test_node_addresses_leave_out_loopback_and_the_ipvs_device():
    local = FakeLocalAddresses({"lo": ("127.0.0.1",), "na-ipvs0": ("10.96.0.10",),
                                "eth0": ("192.168.1.10",), "eth1": ("172.16.0.10", "10.0.0.2")})
    assert local.ipv4() == ("10.0.0.2", "172.16.0.10", "192.168.1.10")
    local.remove("eth1", "10.0.0.2")
    with pytest.raises(FileExistsError):
        local.add("eth0", "192.168.1.10")
    assert local.ipv4() == ("172.16.0.10", "192.168.1.10")


def test_full_syncs_read_the_addresses_and_pick_nodeport_ones_partial_syncs_do_not():
    local = FakeLocalAddresses({"eth0": ("192.168.1.10",), "eth1": ("172.16.0.10",)})
    svc = make_proxy(local=local, nodeport_cidrs=("172.16.0.0/12",))
    svc.services.on_add(dns_service())
    svc._sync(SyncKind.FULL)
    assert svc.catalog.node.local_addresses == ("172.16.0.10", "192.168.1.10")
    assert svc.catalog.node.nodeport_addresses == ("172.16.0.10",)
    local.add("eth1", "172.16.0.11")
    svc._sync(SyncKind.PARTIAL)
    assert local.reads == 1 and svc.catalog.node.nodeport_addresses == ("172.16.0.10",)
    svc._sync(SyncKind.FULL)
    assert svc.catalog.node.nodeport_addresses == ("172.16.0.10", "172.16.0.11")
