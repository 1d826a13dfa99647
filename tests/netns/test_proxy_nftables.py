"""The nftables service proxy on the real kernel, with real packets: test_proxy_iptables.py's
lab (a node between three endpoint namespaces, a pod and an outside client), its probes and
its assertions, with the nft backend in the node namespace; plus what only nft has: the table
adopted by a restarted agent with zero writes, drift repaired by a full sync, coexistence with
other users' nft and iptables-nft rules, and load-balancer source ranges.

By family (`BOTH`): every way in, refusal counted, partial syncs, adoption with zero writes and
drift repair, source ranges, hairpin and cleanup run again over IPv6 in `ip6 netagent`, on the
same (dual-stack, DAD off) lab; and the golden
state's ip6 and ip batches are fed to libnftables and to FakeNft, whose listings must agree."""
import json
from collections.abc import Callable
from dataclasses import dataclass

import pytest

from netagent.infra.flows import Verdict
from netagent.kernel.families import IpFamily
from netagent.kernel.iptables.backend import IptablesBackend
from netagent.kernel.nftables.fake import FakeNft
from netagent.kernel.nftables.runner import NftRunner
from proxy.backend import ProxyMode
from proxy.factory import programmed_mode
from proxy.model import Endpoint, NodeContext, Protocol, ProxyState, ServicePort, TrafficPolicy
from proxy.nftables import NftablesProxy
from proxy.nftables import names as N
from tests.netns.flow_capture import flow_records, wait_for
from tests.netns.test_nft_parity import relevant
from tests.netns.test_proxy_iptables import (DNS, ENDPOINT_IPS, ENDPOINT_IPS6, NODE_OF, NODE_OUTSIDE, NODE_OUTSIDE6,
                                             OUTSIDE, OUTSIDE6, POD, POD6, SERVER_PORT, SPREAD, WEB, Lab, endpoints,
                                             name, seen_sources, state, who)
from tests.unit.proxy.nftables.test_proxy_nftables_family import rich_state


@dataclass(frozen=True)
class Addresses:
    """One family's addresses in the lab: the same roles, links and services in each."""
    family: IpFamily
    pod: str
    outside: str
    node_outside: str
    endpoint_ips: dict[str, str]
    node_sides: dict[str, str]       # the node's address on each endpoint's link: what masquerade shows
    service: Callable[[int], str]    # cluster IPs
    balancer: Callable[[int], str]   # load-balancer IPs, routed by `out` to the node
    balancer_prefix: str
    cluster_cidr: str
    out_range: str                   # a source range holding `out`
    other_ranges: tuple[str, ...]    # source ranges that do not

    def endpoints(self, *roles: str) -> tuple[Endpoint, ...]:
        return tuple(Endpoint(self.endpoint_ips[role], SERVER_PORT, node_name=NODE_OF[role]) for role in roles)

    def state(self, *entries: tuple[ServicePort, tuple[Endpoint, ...]]) -> ProxyState:
        node = NodeContext(name="node", cluster_cidr=self.cluster_cidr, family=self.family)
        return ProxyState(node, {s.name: s for s, _ in entries}, {s.name: e for s, e in entries})

    def web(self) -> ServicePort:
        return ServicePort(name("web"), Protocol.TCP, 80, self.service(10), node_port=30080)

    def dns(self) -> ServicePort:
        return ServicePort(name("dns"), Protocol.UDP, 53, self.service(53))

    def shown(self, address: str, port: int) -> str:
        """An entry point as `netagent status services` spells it."""
        return f"{address}:{port}" if self.family is IpFamily.V4 else f"[{address}]:{port}"


ADDRESSES = {
    IpFamily.V4: Addresses(IpFamily.V4, POD, OUTSIDE, NODE_OUTSIDE, ENDPOINT_IPS,
                           {role: ip.rsplit(".", 1)[0] + ".1" for role, ip in ENDPOINT_IPS.items()},
                           "10.96.0.{}".format, "203.0.113.{}".format, "203.0.113.0/24", "10.244.0.0/16",
                           "192.168.77.0/24", ("10.0.0.0/8", "172.16.0.9/32")),
    IpFamily.V6: Addresses(IpFamily.V6, POD6, OUTSIDE6, NODE_OUTSIDE6, ENDPOINT_IPS6,
                           {role: ip.rsplit(":", 1)[0] + ":1" for role, ip in ENDPOINT_IPS6.items()},
                           "fd00:10:96::{}".format, "2001:db8:113::{}".format, "2001:db8:113::/64",
                           "fd00:10:244::/56", "fd00:77::/64", ("2001:db8::/32", "fd00:10:244:1::9/128")),
}
BOTH = pytest.mark.parametrize("family", list(IpFamily), ids=lambda family: family.label)
assert WEB == ADDRESSES[IpFamily.V4].web() and DNS == ADDRESSES[IpFamily.V4].dns()


@pytest.fixture
def family() -> IpFamily:
    """The family of a test not parameterised by family."""
    return IpFamily.V4


@pytest.fixture
def lab():
    with Lab() as built:   # dual-stack: every link has both families
        yield built


@pytest.fixture
def nft(lab):
    runner = NftRunner(lab.names["node"])
    yield runner
    runner.close()


@pytest.fixture
def proxy(nft, family):
    return NftablesProxy(nft=nft, family=family)


def rejected(lab, family: IpFamily) -> int:
    """Packets our REJECT-NEW chain has refused so far (its rules' counters)."""
    listing = json.loads(lab.run("node", "nft", "-j", "list", "chain", family.nft, N.TABLE, N.REJECT).stdout)
    return sum(expr["counter"]["packets"] for entry in listing["nftables"] if "rule" in entry
               for expr in entry["rule"]["expr"] if "counter" in expr)


ALL = {"ep1", "ep2", "ep3"}


@BOTH
@pytest.mark.parametrize("client, way, port, protocol", [
    ("pod", "cluster", 80, "tcp"),       # a pod to a cluster IP keeps its address
    ("out", "nodeport", 30080, "tcp"),   # off-cluster to a node port: masqueraded
    ("pod", "dns", 53, "udp"),
])
def test_every_endpoint_answers_each_way_in(lab, proxy, family, client, way, port, protocol):
    a = ADDRESSES[family]
    web, dns = a.web(), a.dns()
    proxy.sync(a.state((web, a.endpoints("ep1", "ep2", "ep3")), (dns, a.endpoints("ep1", "ep2", "ep3"))),
               changed=None)
    address = {"cluster": web.cluster_ip, "nodeport": a.node_outside, "dns": dns.cluster_ip}[way]
    answers = lab.answers(client, address, port, count=SPREAD, protocol=protocol)
    masqueraded = set(a.node_sides.values())
    assert who(answers) == ALL and seen_sources(answers) == (masqueraded if client == "out" else {a.pod})
    assert {(entry.kind, entry.address, len(entry.backends)) for entry in proxy.programmed()} == {
        ("ClusterIP", a.shown(web.cluster_ip, 80) + "/TCP", 3), ("NodePort", "*:30080/TCP", 3),
        ("ClusterIP", a.shown(dns.cluster_ip, 53) + "/UDP", 3)}


def test_external_local_keeps_the_client_address_and_affinity_pins(lab, proxy):
    local_web = ServicePort(name("web"), Protocol.TCP, 80, "10.96.0.10", node_port=30080,
                            external_policy=TrafficPolicy.LOCAL)
    sticky = ServicePort(name("sticky"), Protocol.TCP, 80, "10.96.0.11", affinity_timeout=60)
    proxy.sync(state((local_web, endpoints("ep1", "ep2", "ep3")), (sticky, endpoints("ep1", "ep2", "ep3"))),
               changed=None)

    from_outside = lab.answers("out", NODE_OUTSIDE, 30080, count=SPREAD)
    assert who(from_outside) == {"ep1", "ep2"} and seen_sources(from_outside) == {OUTSIDE}
    from_pod = lab.answers("pod", NODE_OUTSIDE, 30080, count=SPREAD)   # a pod: served like cluster-IP traffic
    assert who(from_pod) == {"ep1", "ep2", "ep3"}
    pinned = lab.answers("pod", "10.96.0.11", 80, count=12)
    assert len(who(pinned)) == 1
    spread = lab.answers("pod", "10.96.0.10", 80, count=SPREAD)   # the same client, no affinity: spread
    assert who(spread) == {"ep1", "ep2", "ep3"}


@BOTH
def test_no_endpoints_refuses_at_once_and_partial_syncs_follow_endpoint_changes(lab, proxy, family):
    a = ADDRESSES[family]
    web, dns = a.web(), a.dns()
    assert lab.answers("pod", web.cluster_ip, 80, timeout=0.5) == ["timeout"]   # control: nothing refuses yet
    proxy.sync(a.state((web, ()), (dns, ())), changed=None)
    probes = (("pod", web.cluster_ip, 80, "tcp"), ("out", a.node_outside, 30080, "tcp"), ("pod", dns.cluster_ip, 53, "udp"))
    with flow_records(lab.names["node"]) as ring:
        for role, host, port, protocol in probes:
            # refused, not timed out: only our reject answers (the control above), the first packet
            before = rejected(lab, family)
            assert lab.answers(role, host, port, protocol=protocol) == ["refused"]
            assert rejected(lab, family) == before + 1
        logged = wait_for(ring, count=len(probes))   # each refusal was logged first: dropped for no endpoints
    assert {(flow.verdict, flow.reason, flow.destination, flow.destination_port, flow.protocol) for flow in logged} == {
        (Verdict.DROPPED, "no-endpoints", host, port, protocol) for _, host, port, protocol in probes}

    one = a.state((web, a.endpoints("ep1")), (dns, ()))
    assert proxy.sync(one, changed=frozenset({web.name})).scope.value == "partial"
    assert who(lab.answers("pod", web.cluster_ip, 80, count=5)) == {"ep1"}
    moved = a.state((web, a.endpoints("ep2", "ep3")), (dns, ()))
    proxy.sync(moved, changed=frozenset({web.name}))
    assert who(lab.answers("pod", web.cluster_ip, 80, count=SPREAD)) == {"ep2", "ep3"}
    applies = proxy.applies
    assert proxy.sync(moved, changed=None).detail.count(" 0 nft writes") == 1   # partial == full
    assert proxy.applies == applies


@BOTH
def test_a_restarted_agent_adopts_its_table_with_no_write_and_a_full_sync_repairs_drift(lab, nft, proxy, family):
    a = ADDRESSES[family]
    web, dns = a.web(), a.dns()
    desired = a.state((web, a.endpoints("ep1", "ep2", "ep3")), (dns, a.endpoints("ep1")))
    proxy.sync(desired, changed=None)
    restarted = NftablesProxy(nft=nft, family=family)
    restarted.sync(desired, changed=None)
    assert restarted.applies == 0

    lab.run("node", "nft", "delete", "element", family.nft, N.TABLE, "SERVICE-IPS", f"{{ {web.cluster_ip} . tcp . 80 }}")
    lab.run("node", "nft", "flush", "chain", family.nft, N.TABLE, N.POSTROUTING)
    assert lab.answers("pod", web.cluster_ip, 80, timeout=0.5) == ["timeout"]   # the drift is real
    restarted.sync(desired, changed=None)
    assert restarted.applies == 1
    assert who(lab.answers("pod", web.cluster_ip, 80, count=SPREAD)) == {"ep1", "ep2", "ep3"}
    assert seen_sources(lab.answers("out", a.node_outside, 30080, count=3)) <= set(a.node_sides.values())
    restarted.sync(desired, changed=None)
    assert restarted.applies == 1


@BOTH
def test_source_ranges_admit_only_the_listed_clients(lab, proxy, family):
    a = ADDRESSES[family]
    lab.run("out", "ip", "route", "add", a.balancer_prefix, "via", a.node_outside)
    open_lb = ServicePort(name("open"), Protocol.TCP, 80, a.service(20), load_balancer_ips=(a.balancer(10),),
                          load_balancer_source_ranges=(a.out_range,))
    closed_lb = ServicePort(name("closed"), Protocol.TCP, 80, a.service(21), load_balancer_ips=(a.balancer(11),),
                            load_balancer_source_ranges=a.other_ranges)
    proxy.sync(a.state((open_lb, a.endpoints("ep1")), (closed_lb, a.endpoints("ep1"))), changed=None)
    assert who(lab.answers("out", a.balancer(10), 80, count=3)) == {"ep1"}
    assert lab.answers("out", a.balancer(11), 80, timeout=1.0) == ["timeout"]
    assert who(lab.answers("pod", a.service(21), 80, count=3)) == {"ep1"}     # the cluster IP is not fenced


@BOTH
def test_hairpin_is_masqueraded_and_cleanup_leaves_others_alone(lab, nft, proxy, family):
    a = ADDRESSES[family]
    lab.run("node", "nft", "add table ip other; add chain ip other post { type nat hook postrouting priority 100; }; "
                           "add rule ip other post counter")
    lab.run("node", "iptables-nft", "-t", "nat", "-A", "POSTROUTING", "-d", "198.51.100.1", "-j", "RETURN")
    before = lab.run("node", "nft", "list", "ruleset").stdout
    lonely = ServicePort(name("lonely"), Protocol.TCP, 80, a.service(12))
    proxy.sync(a.state((lonely, a.endpoints("ep1"))), changed=None)
    assert lab.answers("ep1", a.service(12), 80) == [f"ep1 {a.node_sides['ep1']}"]   # itself, via the node's address

    assert programmed_mode(iptables_backend=IptablesBackend.NFT, netns=lab.names["node"]) is ProxyMode.NFTABLES
    proxy.cleanup()
    proxy.cleanup()
    assert ((family.nft, N.TABLE) not in nft.tables()) and ("ip", "other") in nft.tables()
    assert programmed_mode(iptables_backend=IptablesBackend.NFT, netns=lab.names["node"]) is None
    after = lab.run("node", "nft", "list", "ruleset").stdout
    assert _without_counters(after) == _without_counters(before)
    assert lab.answers("pod", a.service(12), 80, timeout=0.5) == ["timeout"]


@BOTH
def test_fake_nft_lists_the_table_as_libnftables_does(netns, family):
    """The golden state's batch (tests/unit/golden/proxy_nftables/) applied to FakeNft and to the
    kernel lists the same, and a backend adopts the kernel's table with zero writes."""
    fake, runner = FakeNft(), NftRunner(netns)
    try:
        NftablesProxy(nft=fake, family=family).sync(rich_state(family), changed=None)
        (batch,) = fake.batches
        runner.apply(batch)
        on_kernel = relevant(runner.list_table(family.nft, N.TABLE))
        assert relevant(fake.list_table(family.nft, N.TABLE)) == on_kernel
        assert on_kernel["sets"]["ENDPOINTS-TCP"]["elements"]   # the comparison compared something
        adopter = NftablesProxy(nft=runner, family=family)
        adopter.sync(rich_state(family), changed=None)
        assert adopter.applies == 0
        assert sorted(map(repr, adopter.programmed())) == sorted(
            map(repr, NftablesProxy(nft=fake, family=family).programmed()))
    finally:
        runner.close()


def test_a_zoned_source_range_costs_its_port_not_the_ipv6_transaction(netns):
    """Through libnftables: the IPv6 golden state plus a load balancer whose source ranges carry
    IPv6 zones with a newline and `flush ruleset` (what a lax server lets through) is written in
    one transaction the kernel takes, that port left out and reported, a table of others kept."""
    from tests.unit.proxy.nftables.test_proxy_nftables_family import hostile_zone_state
    runner = NftRunner(netns)
    try:
        runner.apply("add table ip6 other\n")
        proxy = NftablesProxy(nft=runner, family=IpFamily.V6)
        report = proxy.sync(hostile_zone_state(), changed=None)
        assert [name.name for name in report.unprogrammed] == ["zoned"]
        assert len(proxy.programmed()) == 11 and ("ip6", "other") in runner.tables()
        allowed = relevant(runner.list_table("ip6", N.TABLE))["sets"][N.FIREWALL_ALLOW]["elements"]
        assert allowed and "2001:db8::20" not in json.dumps(allowed)
    finally:
        runner.close()


def _without_counters(ruleset: str) -> str:
    import re
    return re.sub(r"counter packets \d+ bytes \d+", "counter", ruleset)


UDP_FROM_ONE_PORT = r"""
import socket, sys
client = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
client.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
client.bind(("0.0.0.0", 40053)); client.settimeout(15)
client.sendto(b"hello", (sys.argv[1], int(sys.argv[2])))
print(client.recv(64).decode().split()[0])
"""


def test_udp_flows_to_a_gone_endpoint_are_deleted_by_the_conntrack_cleanup(lab, proxy):  # noqa: F811
    import sys
    from netagent.kernel import namespaces
    from proxy.conntrack import ConntrackCommand, stale_flows
    before = state((DNS, endpoints("ep1")))
    proxy.sync(before, changed=None)

    def ask() -> str:
        return lab.run("pod", sys.executable, "-c", UDP_FROM_ONE_PORT, "10.96.0.53", "53").stdout.strip()
    assert ask() == "ep1"
    after = state((DNS, endpoints("ep2")))
    proxy.sync(after, changed=frozenset({DNS.name}))
    assert ask() == "ep1"   # the flow's conntrack entry still says ep1 (it still serves, in this lab)
    deleted = ConntrackCommand(exec_prefix=namespaces.exec_prefix(lab.names["node"])).delete_all(
        stale_flows(before, after, frozenset({DNS.name})))
    assert deleted >= 1
    assert ask() == "ep2"
