"""IpvsProxy for IPv6 and dual-stack against the fakes: an IPv6 state renders AF_INET6 virtual
servers, /128 device addresses, `inet6` sets under NETAGENT-IPVS6-* and the chains in
ip6tables; two proxies (one per family) sharing one IPVS table, one device and one namespace's
ipsets never remove each other's virtual servers, addresses or sets, in sync or cleanup."""
import errno

import pytest

from netagent.infra.fake_clock import FakeClock
from netagent.kernel.families import IpFamily
from netagent.kernel.fake_sysctl import FakeSysctls
from netagent.kernel.ipset import FakeIpset
from netagent.kernel.iptables.fake import FakeIptables
from proxy.ipvs.fake_device import FakeAddressDevice
from proxy.ipvs.fake_table import FakeIpvsTable
from proxy.ipvs.proxy import IpvsProxy
from proxy.ipvs.rules import IPVS_SETS, family_set, render_ipvs_chains, set_prefix
from proxy.ipvs.sysctls import ipvs_sysctls
from proxy.ipvs.table import Destination, IpvsError, RealServer, VirtualServer, VirtualServerKey
from proxy.model import Endpoint, NodeContext, Protocol, ProxyState, ServicePort, ServicePortName

V4, V6 = IpFamily.V4, IpFamily.V6
WEB = ServicePortName("default", "web", "http")
DNS = ServicePortName("kube-system", "dns", "dns")
NODES = {V4: NodeContext(name="node-1", cluster_cidr="10.244.0.0/16", local_addresses=("192.168.1.10",)),
         V6: NodeContext(name="node-1", cluster_cidr="fd00:10:244::/56", local_addresses=("fd00:1::10",),
                         family=V6)}
CLUSTER_IPS = {V4: ("10.96.0.10", "10.96.0.53"), V6: ("fd00:10:96::a", "fd00:10:96::35")}
PODS = {V4: ("10.244.1.5", "10.244.2.6"), V6: ("fd00:10:244:1::5", "fd00:10:244:2::6")}


def state(family, *, web=True):
    web_ip, dns_ip = CLUSTER_IPS[family]
    services = [ServicePort(DNS, Protocol.UDP, 53, dns_ip)]
    endpoints = {DNS: (Endpoint(PODS[family][0], 53),)}
    if web:
        services.append(ServicePort(WEB, Protocol.TCP, 80, web_ip, node_port=30080))
        endpoints[WEB] = tuple(Endpoint(ip, 8080) for ip in PODS[family])
    return ProxyState(NODES[family], services={s.name: s for s in services}, endpoints=endpoints)


class Node:
    """One node's kernel: one IPVS table, one device, one ipset namespace; iptables per family."""

    def __init__(self):
        self.table = FakeIpvsTable()
        self.device = FakeAddressDevice()
        self.ipset = FakeIpset(in_use=self._in_use)
        self.iptables = {f: FakeIptables(family=f) for f in (V4, V6)}
        self.sysctls = FakeSysctls({s.key: "0" for f in (V4, V6) for s in ipvs_sysctls(f)})

    def _in_use(self, name):
        words = " ".join(i.save() for i in self.iptables.values()).split()
        return any(w == "--match-set" and following == name for w, following in zip(words, words[1:]))

    def proxy(self, family):
        return IpvsProxy(table=self.table, device=self.device, ipset=self.ipset, iptables=self.iptables[family],
                         sysctls=self.sysctls, clock=FakeClock(), family=family)

    def keys(self, family):
        return {str(s.key) for s in self.table.virtual_servers() if s.key.family is family}


@pytest.fixture
def node():
    return Node()


def test_an_ipv6_state_programs_ipv6_virtual_servers_addresses_sets_and_ip6tables(node):
    node.proxy(V6).sync(state(V6), changed=None)
    assert node.keys(V6) == {"[fd00:10:96::a]:80/TCP", "[fd00:1::10]:30080/TCP", "[fd00:10:96::35]:53/UDP"}
    assert node.keys(V4) == set()
    web = VirtualServerKey("fd00:10:96::a", Protocol.TCP, 80)
    assert {str(r.destination) for r in node.table.real_servers(web)} == {
        "[fd00:10:244:1::5]:8080", "[fd00:10:244:2::6]:8080"}
    assert node.device.addresses(family=V6) == {"fd00:10:96::a", "fd00:10:96::35"}
    assert node.device.addresses(family=V4) == set()
    assert set(node.ipset.list_names()) == {f"NETAGENT-IPVS6-{s.name.removeprefix('NETAGENT-IPVS-')}"
                                            for s in IPVS_SETS}
    assert {c.family for c in node.ipset.snapshot().values()} == {"inet6"}
    assert node.ipset.members("NETAGENT-IPVS6-CLUSTER-IP") == {"fd00:10:96::a,tcp:80", "fd00:10:96::35,udp:53"}
    assert node.ipset.members("NETAGENT-IPVS6-NODEPORT") == {"fd00:1::10,tcp:30080"}
    rules = node.iptables[V6].save()
    assert "--match-set NETAGENT-IPVS6-CLUSTER-IP dst,dst" in rules and "NETAGENT-IPVS-CLUSTER-IP" not in rules
    assert "! -s fd00:10:244::/56" in rules and "icmp6-port-unreachable" in rules
    assert "NETAGENT" not in node.iptables[V4].save()
    assert node.sysctls.values["net.ipv6.conf.all.forwarding"] == "1"
    assert node.sysctls.values["net.ipv4.ip_forward"] == "0", "the IPv6 backend leaves IPv4 forwarding alone"
    assert node.sysctls.values["net.ipv4.vs.conntrack"] == "1", "the IPVS settings govern both families"
    before = len(node.table.writes) + len(node.device.writes) + len(node.ipset.writes)
    node.proxy(V6).sync(state(V6), changed=None)   # a restarted agent adopts what it finds
    assert len(node.table.writes) + len(node.device.writes) + len(node.ipset.writes) == before


def test_a_partial_ipv6_sync_removes_a_service_and_its_address(node):
    proxy = node.proxy(V6)
    proxy.sync(state(V6), changed=None)
    proxy.sync(state(V6, web=False), changed=frozenset({WEB}))
    assert node.keys(V6) == {"[fd00:10:96::35]:53/UDP"}
    assert node.device.addresses(family=V6) == {"fd00:10:96::35"}
    assert node.ipset.members("NETAGENT-IPVS6-NODEPORT") == set()


def test_dual_stack_proxies_never_remove_each_others_state(node):
    v4, v6 = node.proxy(V4), node.proxy(V6)
    v4.sync(state(V4), changed=None)
    v6.sync(state(V6), changed=None)
    v4.sync(state(V4, web=False), changed=None)   # a full sync of IPv4 with fewer services
    assert node.keys(V6) == {"[fd00:10:96::a]:80/TCP", "[fd00:1::10]:30080/TCP", "[fd00:10:96::35]:53/UDP"}
    assert node.keys(V4) == {"10.96.0.53:53/UDP"}
    assert node.device.addresses(family=V6) == {"fd00:10:96::a", "fd00:10:96::35"}
    assert node.device.addresses(family=V4) == {"10.96.0.53"}
    assert node.ipset.members("NETAGENT-IPVS6-CLUSTER-IP") == {"fd00:10:96::a,tcp:80", "fd00:10:96::35,udp:53"}
    assert [s.name for s in v4.programmed()] == [str(DNS)]
    assert len(v6.programmed()) == 3

    v4.cleanup()
    assert node.keys(V4) == set() and len(node.keys(V6)) == 3
    assert node.device.exists() and node.device.addresses(family=V6) == {"fd00:10:96::a", "fd00:10:96::35"}
    assert node.device.addresses(family=V4) == set()
    assert set(node.ipset.list_names()) == {family_set(s, V6).name for s in IPVS_SETS}
    assert "NETAGENT" not in node.iptables[V4].save() and "NETAGENT-IPVS-SVCS" in node.iptables[V6].save()
    writes = len(node.table.writes) + len(node.device.writes) + len(node.ipset.writes)
    v6.sync(state(V6), changed=None)
    assert len(node.table.writes) + len(node.device.writes) + len(node.ipset.writes) == writes, "IPv6 in sync"

    v6.cleanup()
    assert node.table.virtual_servers() == [] and not node.device.exists() and not node.ipset.list_names()
    assert "NETAGENT" not in node.iptables[V6].save()


def test_cleanup_of_the_last_family_deletes_the_device_and_of_the_first_keeps_it(node):
    node.proxy(V6).sync(state(V6), changed=None)
    node.proxy(V4).cleanup()   # nothing of IPv4: the IPv6 state stays whole
    assert node.device.exists() and len(node.keys(V6)) == 3 and node.ipset.list_names()
    node.proxy(V6).cleanup()
    assert not node.device.exists()


def test_each_familys_sets_have_their_own_names_and_prefix():
    for spec in IPVS_SETS:
        v6 = family_set(spec, V6)
        assert v6.family == "inet6" and v6.type is spec.type and len(v6.name) <= 31
        assert v6.name.startswith(set_prefix(V6)) and not v6.name.startswith(set_prefix(V4))
        assert family_set(spec, V4) is spec


def test_chains_refuse_a_cluster_cidr_of_the_other_family():
    with pytest.raises(ValueError, match="not IPv6"):
        render_ipvs_chains(cluster_cidr="10.244.0.0/16", family=V6)
    assert render_ipvs_chains(cluster_cidr="10.244.0.0/16") == render_ipvs_chains(
        cluster_cidr="10.244.0.0/16", family=V4, hairpin_set="NETAGENT-IPVS-HAIRPIN")


def test_a_state_of_the_other_family_is_refused(node):
    with pytest.raises(ValueError, match="IPv4 ProxyState handed to the IPv6 IPVS proxy"):
        node.proxy(V6).sync(state(V4), changed=None)


def test_the_fake_table_refuses_what_the_kernel_refuses_across_families():
    table = FakeIpvsTable()
    key = VirtualServerKey("fd00:10:96::a", Protocol.TCP, 80)
    table.add_virtual_server(VirtualServer(key))
    with pytest.raises(IpvsError) as refused:
        table.add_real_server(key, RealServer(Destination("10.244.1.5", 8080)))
    assert refused.value.code == errno.EAFNOSUPPORT
    with pytest.raises(IpvsError, match="canonical"):
        table.add_virtual_server(VirtualServer(VirtualServerKey("fd00:10:96:0::b", Protocol.TCP, 80)))
    table.add_real_server(key, RealServer(Destination("fd00:10:244:1::5", 8080)))
    assert [str(r.destination) for r in table.real_servers(key)] == ["[fd00:10:244:1::5]:8080"]
