"""IpvsProxy against the fakes: full and partial syncs write only differences, a restart adopts
with zero writes, stale and drifted state is repaired, endpoints drain before deletion, only our
virtual servers are ever removed, and cleanup removes everything of ours in a working order
(the fake ipset refuses to destroy a set an iptables rule still matches)."""
import dataclasses

import pytest

from netagent.infra.fake_clock import FakeClock
from netagent.infra.sync_runner import SyncKind
from netagent.kernel.fake_sysctl import FakeSysctls
from netagent.kernel.ipset import FakeIpset, IpsetError, iptables_references
from netagent.kernel.iptables.fake import FakeIptables
from proxy.backend import ProgrammedService
from proxy.ipvs.fake_device import FakeAddressDevice
from proxy.ipvs.fake_table import FakeIpvsTable
from proxy.ipvs.proxy import IpvsProxy
from proxy.ipvs.render import IpvsSettings
from proxy.ipvs.rules import IPVS_SETS
from proxy.ipvs.sysctls import IPVS_SYSCTLS
from proxy.ipvs.table import Destination, IpvsUnavailable, RealServer, VirtualServer, VirtualServerKey
from proxy.model import Endpoint, NodeContext, Protocol, ProxyState, ServicePort, ServicePortName, TrafficPolicy

NODE = NodeContext(name="node-1", cluster_cidr="10.244.0.0/16", local_addresses=("192.168.1.10",))
WEB = ServicePortName("default", "web", "http")
DNS = ServicePortName("kube-system", "dns", "dns")
DNS_TCP = ServicePortName("kube-system", "dns", "dns-tcp")
WEB_KEY = VirtualServerKey("10.96.0.10", Protocol.TCP, 80)
WEB_NODEPORT_KEY = VirtualServerKey("192.168.1.10", Protocol.TCP, 30080)
DNS_KEY = VirtualServerKey("10.96.0.53", Protocol.UDP, 53)


@dataclasses.dataclass
class Kernel:
    table: FakeIpvsTable
    device: FakeAddressDevice
    ipset: FakeIpset
    iptables: FakeIptables
    sysctls: FakeSysctls

    def writes(self) -> int:
        return (len(self.table.writes) + len(self.device.writes) + len(self.ipset.writes)
                + len(self.iptables.restores) + len(self.sysctls.writes))

    def proxy(self, clock=None, **settings) -> IpvsProxy:
        return IpvsProxy(table=self.table, device=self.device, ipset=self.ipset, iptables=self.iptables,
                         sysctls=self.sysctls, settings=IpvsSettings(**settings), clock=clock or FakeClock())

    def reals(self, key) -> dict[str, int]:
        return {str(r.destination): r.weight for r in self.table.real_servers(key)}


@pytest.fixture
def kernel():
    iptables = FakeIptables()
    return Kernel(FakeIpvsTable(), FakeAddressDevice(), FakeIpset(in_use=iptables_references(iptables)),
                  iptables, FakeSysctls({s.key: "0" for s in IPVS_SYSCTLS}))


def web(*ips, node_port=30080, **changes):
    return ServicePort(WEB, Protocol.TCP, 80, "10.96.0.10", node_port=node_port, **changes)


def eps(*ips, port=8080, **conditions):
    return tuple(Endpoint(ip, port, **conditions) for ip in ips)


def state(services=(), endpoints=None, node=NODE):
    return ProxyState(node, services={s.name: s for s in services}, endpoints=endpoints or {})


BASE = state([web(), ServicePort(DNS, Protocol.UDP, 53, "10.96.0.53"), ServicePort(DNS_TCP, Protocol.TCP, 53, "10.96.0.53")],
             {WEB: eps("10.244.1.5", "10.244.2.6"), DNS: eps("10.244.1.9", port=53), DNS_TCP: eps("10.244.1.9", port=53)})


def test_full_sync_programs_everything(kernel):
    report = kernel.proxy().sync(BASE, changed=None)
    assert report.scope is SyncKind.FULL and report.services_written == 3 and report.rules == 6
    assert {str(s.key) for s in kernel.table.virtual_servers()} == {
        "10.96.0.10:80/TCP", "192.168.1.10:30080/TCP", "10.96.0.53:53/UDP", "10.96.0.53:53/TCP"}
    assert kernel.reals(WEB_KEY) == kernel.reals(WEB_NODEPORT_KEY) == {"10.244.1.5:8080": 1, "10.244.2.6:8080": 1}
    assert kernel.device.addresses() == {"10.96.0.10", "10.96.0.53"}
    assert kernel.ipset.members("NETAGENT-IPVS-CLUSTER-IP") == {"10.96.0.10,tcp:80", "10.96.0.53,udp:53",
                                                                 "10.96.0.53,tcp:53"}
    assert kernel.ipset.members("NETAGENT-IPVS-NODEPORT") == {"192.168.1.10,tcp:30080"}
    assert set(kernel.ipset.list_names()) == {spec.name for spec in IPVS_SETS}
    assert kernel.iptables.list_chains("nat") == {"NETAGENT-IPVS-SVCS", "NETAGENT-IPVS-POSTRTG"}
    assert kernel.iptables.list_chains("filter") == {"NETAGENT-IPVS-FILTER", "NETAGENT-IPVS-FORWARD"}
    for parent in ("INPUT", "OUTPUT", "FORWARD"):
        assert "NETAGENT-IPVS-FILTER" in kernel.iptables.save("filter").split(f"-A {parent} ")[1]
    assert {key: kernel.sysctls.values[key] for key in (s.key for s in IPVS_SYSCTLS)} == {
        "net.ipv4.vs.conntrack": "1", "net.ipv4.vs.expire_nodest_conn": "1",
        "net.ipv4.vs.expire_quiescent_template": "1", "net.ipv4.ip_forward": "1"}


def test_second_sync_and_a_restarted_agent_write_nothing(kernel):
    kernel.proxy().sync(BASE, changed=None)
    before = kernel.writes()
    kernel.proxy().sync(BASE, changed=None)
    restarted = kernel.proxy()
    report = restarted.sync(BASE, changed=None)
    restarted.sync(BASE, changed=frozenset())
    restarted.sync(BASE, changed=frozenset({WEB, DNS}))
    assert kernel.writes() == before, "adoption must not write"
    assert report.services_written == 0


def test_partial_sync_writes_only_the_changed_endpoint(kernel):
    proxy = kernel.proxy()
    proxy.sync(BASE, changed=None)
    table_writes, set_writes = len(kernel.table.writes), len(kernel.ipset.writes)
    changed = state(BASE.services.values(), {**BASE.endpoints, WEB: eps("10.244.1.5", "10.244.2.6", "10.244.3.7")})
    report = proxy.sync(changed, changed=changed.changed_since(BASE))
    assert report.scope is SyncKind.PARTIAL and report.services_written == 1
    new_writes = kernel.table.writes[table_writes:]
    assert sorted((w.operation, str(w.key), str(w.destination)) for w in new_writes) == [
        ("add-rs", "10.96.0.10:80/TCP", "10.244.3.7:8080"), ("add-rs", "192.168.1.10:30080/TCP", "10.244.3.7:8080")]
    assert [w.added for w in kernel.ipset.writes[set_writes:]] == [("10.244.3.7,tcp:8080,10.244.3.7",)]
    assert kernel.reals(WEB_KEY)["10.244.3.7:8080"] == 1


def test_partial_sync_removes_a_service_but_keeps_what_its_sibling_shares(kernel):
    proxy = kernel.proxy()
    proxy.sync(BASE, changed=None)
    without_udp = state([web(), BASE.services[DNS_TCP]], {WEB: BASE.endpoints[WEB], DNS_TCP: BASE.endpoints[DNS_TCP]})
    proxy.sync(without_udp, changed=without_udp.changed_since(BASE))
    assert kernel.table.virtual_server(DNS_KEY) is None
    assert kernel.device.addresses() == {"10.96.0.10", "10.96.0.53"}, "the TCP port still needs the address"
    assert "10.96.0.53,udp:53" not in kernel.ipset.members("NETAGENT-IPVS-CLUSTER-IP")
    assert "10.244.1.9,tcp:53,10.244.1.9" in kernel.ipset.members("NETAGENT-IPVS-HAIRPIN")
    only_web = state([web()], {WEB: BASE.endpoints[WEB]})
    proxy.sync(only_web, changed=only_web.changed_since(without_udp))
    assert kernel.device.addresses() == {"10.96.0.10"}
    assert kernel.ipset.members("NETAGENT-IPVS-HAIRPIN") == {"10.244.1.5,tcp:8080,10.244.1.5",
                                                             "10.244.2.6,tcp:8080,10.244.2.6"}
    before = kernel.writes()
    kernel.proxy().sync(only_web, changed=None)
    assert kernel.writes() == before, "partial syncs must reach the state a full sync would"


def test_a_service_without_endpoints_is_listed_for_rejection_and_leaves_when_one_appears(kernel):
    proxy = kernel.proxy()
    empty = state([web()], {WEB: ()})
    proxy.sync(empty, changed=None)
    assert kernel.ipset.members("NETAGENT-IPVS-NO-EP") == {"10.96.0.10,tcp:80", "192.168.1.10,tcp:30080"}
    assert kernel.reals(WEB_KEY) == {}
    ready = state([web()], {WEB: eps("10.244.1.5")})
    proxy.sync(ready, changed=ready.changed_since(empty))
    assert kernel.ipset.members("NETAGENT-IPVS-NO-EP") == frozenset()


def test_an_endpoint_that_goes_drains_at_weight_zero_until_idle(kernel):
    clock = FakeClock()
    proxy = kernel.proxy(clock)
    proxy.sync(BASE, changed=None)
    kernel.table.set_connections(WEB_KEY, Destination("10.244.2.6", 8080), active=1)
    gone = state(BASE.services.values(), {**BASE.endpoints, WEB: eps("10.244.1.5")})
    proxy.sync(gone, changed=gone.changed_since(BASE))
    assert kernel.reals(WEB_KEY) == {"10.244.1.5:8080": 1, "10.244.2.6:8080": 0}
    assert kernel.reals(WEB_NODEPORT_KEY) == {"10.244.1.5:8080": 1}, "no connections there: deleted at once"
    assert proxy.drain_deadline() == clock.now() + 15
    clock.advance(5)
    assert proxy.reap_drained() == 0 and kernel.reals(WEB_KEY)["10.244.2.6:8080"] == 0
    kernel.table.set_connections(WEB_KEY, Destination("10.244.2.6", 8080), active=0, inactive=0)
    assert proxy.reap_drained() == 1
    assert kernel.reals(WEB_KEY) == {"10.244.1.5:8080": 1} and proxy.drain_deadline() is None


def test_a_drain_ends_at_the_timeout_even_with_connections(kernel):
    clock = FakeClock()
    proxy = kernel.proxy(clock, graceful_timeout=15)
    proxy.sync(BASE, changed=None)
    kernel.table.set_connections(WEB_KEY, Destination("10.244.2.6", 8080), active=3, inactive=2)
    terminating = state(BASE.services.values(), {**BASE.endpoints, WEB: eps("10.244.1.5") + eps(
        "10.244.2.6", ready=False, serving=True, terminating=True)})
    proxy.sync(terminating, changed=terminating.changed_since(BASE))
    assert kernel.reals(WEB_KEY)["10.244.2.6:8080"] == 0
    clock.advance(14.9)
    proxy.sync(terminating, changed=frozenset())
    assert kernel.reals(WEB_KEY)["10.244.2.6:8080"] == 0
    clock.advance(0.1)
    proxy.sync(terminating, changed=frozenset())
    assert "10.244.2.6:8080" not in kernel.reals(WEB_KEY)


def test_an_endpoint_that_comes_back_while_draining_gets_weight_one(kernel):
    proxy = kernel.proxy()
    proxy.sync(BASE, changed=None)
    kernel.table.set_connections(WEB_KEY, Destination("10.244.2.6", 8080), active=1)
    gone = state(BASE.services.values(), {**BASE.endpoints, WEB: eps("10.244.1.5")})
    proxy.sync(gone, changed=gone.changed_since(BASE))
    proxy.sync(BASE, changed=BASE.changed_since(gone))
    assert kernel.reals(WEB_KEY) == {"10.244.1.5:8080": 1, "10.244.2.6:8080": 1}
    assert proxy.drain_deadline() is None


def test_udp_real_servers_are_deleted_at_once(kernel):
    proxy = kernel.proxy()
    proxy.sync(BASE, changed=None)
    kernel.table.set_connections(DNS_KEY, Destination("10.244.1.9", 53), active=0, inactive=5)
    moved = state(BASE.services.values(), {**BASE.endpoints, DNS: eps("10.244.1.10", port=53)})
    proxy.sync(moved, changed=moved.changed_since(BASE))
    assert kernel.reals(DNS_KEY) == {"10.244.1.10:53": 1}


def test_restart_after_a_nodeport_service_was_deleted_removes_only_ours(kernel):
    kernel.proxy().sync(BASE, changed=None)
    foreign = [VirtualServer(VirtualServerKey("192.168.1.10", Protocol.TCP, 8443)),
               VirtualServer(VirtualServerKey("10.1.2.3", Protocol.TCP, 80))]
    for server in foreign:
        kernel.table.add_virtual_server(server)
    without_web = state([BASE.services[DNS], BASE.services[DNS_TCP]], {DNS: BASE.endpoints[DNS], DNS_TCP: BASE.endpoints[DNS_TCP]})
    kernel.proxy().sync(without_web, changed=None)
    assert {str(s.key) for s in kernel.table.virtual_servers()} == {
        "10.96.0.53:53/UDP", "10.96.0.53:53/TCP", "192.168.1.10:8443/TCP", "10.1.2.3:80/TCP"}
    assert kernel.device.addresses() == {"10.96.0.53"}
    assert kernel.ipset.members("NETAGENT-IPVS-NODEPORT") == frozenset()


def test_full_sync_repairs_drift(kernel):
    proxy = kernel.proxy()
    proxy.sync(BASE, changed=None)
    kernel.table.delete_real_server(WEB_KEY, Destination("10.244.1.5", 8080))
    kernel.table.update_real_server(WEB_NODEPORT_KEY, RealServer(Destination("10.244.1.5", 8080), 7))
    kernel.table.update_virtual_server(VirtualServer(DNS_KEY, scheduler="sh"))
    kernel.table.delete_virtual_server(VirtualServerKey("10.96.0.53", Protocol.TCP, 53))
    kernel.device.remove_address("10.96.0.10")
    kernel.ipset.update("NETAGENT-IPVS-CLUSTER-IP", remove=["10.96.0.10,tcp:80"], add=["10.9.9.9,tcp:1"])
    kernel.iptables.restore("*nat\n-F NETAGENT-IPVS-SVCS\nCOMMIT\n")
    kernel.sysctls.values["net.ipv4.vs.conntrack"] = "0"
    proxy.sync(BASE, changed=None)
    before = kernel.writes()
    kernel.proxy().sync(BASE, changed=None)
    assert kernel.writes() == before, "the repaired state is the planned state"
    assert kernel.reals(WEB_KEY) == kernel.reals(WEB_NODEPORT_KEY) == {"10.244.1.5:8080": 1, "10.244.2.6:8080": 1}
    assert kernel.table.virtual_server(DNS_KEY).scheduler == "rr"


def test_a_failed_partial_sync_makes_the_next_one_full(kernel):
    proxy = kernel.proxy()
    proxy.sync(BASE, changed=None)
    kernel.ipset.sets.pop("NETAGENT-IPVS-HAIRPIN")
    changed = state(BASE.services.values(), {**BASE.endpoints, WEB: eps("10.244.1.5", "10.244.3.7")})
    with pytest.raises(IpsetError):
        proxy.sync(changed, changed=changed.changed_since(BASE))
    report = proxy.sync(changed, changed=frozenset())
    assert report.scope is SyncKind.FULL
    assert "10.244.3.7,tcp:8080,10.244.3.7" in kernel.ipset.members("NETAGENT-IPVS-HAIRPIN")


def test_a_changed_node_context_makes_a_full_sync(kernel):
    proxy = kernel.proxy()
    proxy.sync(BASE, changed=None)
    moved = dataclasses.replace(NODE, local_addresses=("192.168.1.11",))
    report = proxy.sync(state(BASE.services.values(), BASE.endpoints, node=moved), changed=frozenset())
    assert report.scope is SyncKind.FULL
    assert kernel.table.virtual_server(WEB_NODEPORT_KEY) is None
    assert kernel.table.virtual_server(VirtualServerKey("192.168.1.11", Protocol.TCP, 30080)) is not None


def test_local_policy_nodeport_is_ours_too(kernel):
    local = state([web(external_policy=TrafficPolicy.LOCAL)],
                  {WEB: eps("10.244.1.5", node_name="node-1") + eps("10.244.2.6", node_name="node-2")})
    kernel.proxy().sync(local, changed=None)
    assert kernel.reals(WEB_NODEPORT_KEY) == {"10.244.1.5:8080": 1}
    assert kernel.ipset.members("NETAGENT-IPVS-NODEPORT-LOCAL") == {"192.168.1.10,tcp:30080"}
    kernel.proxy().sync(state(), changed=None)
    assert kernel.table.virtual_servers() == []


def test_programmed_reads_the_kernel(kernel):
    proxy = kernel.proxy()
    proxy.sync(BASE, changed=None)
    kernel.table.set_connections(WEB_KEY, Destination("10.244.2.6", 8080), active=2)
    gone = state(BASE.services.values(), {**BASE.endpoints, WEB: eps("10.244.1.5")})
    proxy.sync(gone, changed=gone.changed_since(BASE))
    kernel.table.add_virtual_server(VirtualServer(VirtualServerKey("10.1.2.3", Protocol.TCP, 80)))
    listed = {p.address: p for p in proxy.programmed()}
    assert set(listed) == {"10.96.0.10:80/TCP", "192.168.1.10:30080/TCP", "10.96.0.53:53/UDP", "10.96.0.53:53/TCP"}
    assert listed["10.96.0.10:80/TCP"] == ProgrammedService(
        "default/web:http", "10.96.0.10:80/TCP", "ClusterIP", ("10.244.1.5:8080", "10.244.2.6:8080 (weight 0, 2 connections)"))
    assert listed["192.168.1.10:30080/TCP"].kind == "NodePort"
    fresh = {p.address: p for p in kernel.proxy().programmed()}
    assert fresh["10.96.0.10:80/TCP"].name == "(not in the current plan)"
    assert fresh["10.96.0.10:80/TCP"].backends == listed["10.96.0.10:80/TCP"].backends


def test_cleanup_removes_all_of_ours_and_nothing_else(kernel):
    kernel.iptables.restore("*nat\n:KUBE-SERVICES - [0:0]\n-A PREROUTING -j KUBE-SERVICES\nCOMMIT\n")
    foreign = VirtualServer(VirtualServerKey("192.168.1.10", Protocol.TCP, 8443))
    kernel.table.add_virtual_server(foreign)
    proxy = kernel.proxy()
    proxy.sync(BASE, changed=None)
    with pytest.raises(IpsetError, match="in use"):
        kernel.ipset.destroy("NETAGENT-IPVS-CLUSTER-IP")
    kernel.proxy().cleanup()
    assert kernel.table.virtual_servers() == [foreign]
    assert not kernel.device.exists()
    assert kernel.ipset.list_names() == []
    assert kernel.iptables.list_chains("nat", prefix="NETAGENT-") == set()
    assert kernel.iptables.list_chains("filter", prefix="NETAGENT-") == set()
    assert "KUBE-SERVICES" in kernel.iptables.save("nat")
    before = kernel.writes()
    proxy.cleanup()
    assert kernel.writes() == before, "cleanup is idempotent"
    proxy.sync(BASE, changed=frozenset({WEB}))
    assert len(kernel.table.virtual_servers()) == 5, "after cleanup the next sync is a full one"


def test_cleanup_without_ipvs_in_the_kernel(kernel):
    class NoIpvs(FakeIpvsTable):
        def virtual_servers(self):
            raise IpvsUnavailable("no ip_vs")

    kernel.table = NoIpvs()
    kernel.proxy().cleanup()
    assert kernel.writes() == 0
