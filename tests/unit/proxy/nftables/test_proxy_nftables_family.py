"""The nftables service proxy by family against FakeNft: the `ip6 netagent` table's text pinned
by a golden (and the `ip` one beside it, byte-identical to the IPv4-only backend's), each
family's table refusing the other family's addresses, NodePort addresses, the cluster CIDR and
source ranges taken per family, affinity chains naming IPv6 endpoints, partial == full and
adoption with zero writes in ip6 (the real kernel: tests/netns/test_proxy_nftables.py, which
also feeds the golden state to libnftables and FakeNft and compares the listings).

Update the goldens with
`UPDATE_GOLDEN=1 .venv/bin/python -m pytest tests/unit/proxy/nftables/test_proxy_nftables_family.py -q` and
review `git diff tests/unit/golden/proxy_nftables/`.
"""
from __future__ import annotations

import os
import random
from pathlib import Path
from typing import Any

import pytest

from netagent.kernel.families import IpFamily
from netagent.kernel.nftables import text
from netagent.kernel.nftables.fake import FakeNft
from proxy.model import Endpoint, NodeContext, Protocol, ProxyState, ServicePort, ServicePortName, TrafficPolicy
from proxy.nftables import NftablesProxy
from proxy.nftables import names as N
from netagent.kernel.nftables.tables import read_table
from proxy.nftables.render import NftProxySettings, fixed_chains
from proxy.nftables.spelling import spelling
from tests.unit.proxy.nftables.test_proxy_nftables import table as proxy_table

GOLDEN_DIR = Path(__file__).resolve().parents[2] / "golden" / "proxy_nftables"

# every way in and every structure of the table, in each family's addresses
ADDRESSES: dict[IpFamily, dict[str, Any]] = {
    IpFamily.V4: dict(cidr="10.244.0.0/16", endpoint="10.244.1.{}", service="10.96.0.{}", lb="203.0.113.10",
                      external="203.0.113.11", ranges=("192.168.77.0/24", "172.16.0.9/32", "fd00::/8")),
    IpFamily.V6: dict(cidr="fd00:10:244::/56", endpoint="fd00:10:244:1::{}", service="fd00:10:96::{}",
                      lb="2001:db8::10", external="2001:db8::11",
                      ranges=("2001:db8:77::/64", "2001:db8:1::9/128", "10.0.0.0/8")),
}


def sp(name: str, ip: str, **kwargs) -> ServicePort:
    kwargs.setdefault("protocol", Protocol.TCP)
    return ServicePort(ServicePortName("default", name, "p"), port=80, cluster_ip=ip, **kwargs)


def rich_state(family: IpFamily) -> ProxyState:
    """Every entry kind, both traffic policies, affinity, source ranges, UDP, no endpoints."""
    a = ADDRESSES[family]

    def eps(*ids: int, node: str = "node") -> tuple[Endpoint, ...]:
        return tuple(Endpoint(a["endpoint"].format(i), 8080, node_name=node) for i in ids)
    service = a["service"].format
    entries = [
        (sp("web", service(10), node_port=30080, external_ips=(a["external"],)), eps(2, 3, 4)),
        (sp("dns", service(53), protocol=Protocol.UDP), eps(2, 5, node="other")),
        (sp("local", service(12), node_port=30081, external_policy=TrafficPolicy.LOCAL), eps(2) + eps(7, node="other")),
        (sp("sticky", service(13), affinity_timeout=60), eps(2, 3)),
        (sp("lb", service(14), load_balancer_ips=(a["lb"],), load_balancer_source_ranges=a["ranges"]), eps(2)),
        (sp("empty", service(15), node_port=30082), ()),
    ]
    node = NodeContext(name="node", cluster_cidr=a["cidr"], family=family)
    return ProxyState(node, {s.name: s for s, _ in entries}, {s.name: e for s, e in entries})


def table(nft: FakeNft, family: IpFamily):
    return proxy_table(nft, family.nft)


@pytest.mark.parametrize("family", list(IpFamily), ids=lambda f: f.label)
def test_golden(family):
    nft = FakeNft()   # it keeps every batch applied
    report = NftablesProxy(nft=nft, family=family).sync(rich_state(family), changed=None)
    assert not report.unprogrammed and len(nft.batches) == 1
    path = GOLDEN_DIR / f"{family.label.lower()}.nft"
    if os.environ.get("UPDATE_GOLDEN"):
        path.parent.mkdir(exist_ok=True)
        path.write_text(nft.batches[0])
    assert path.exists(), f"{path} missing: run with UPDATE_GOLDEN=1 to create it"
    assert nft.batches[0] == path.read_text()


def test_the_ip6_table_is_spelled_ip6_throughout():
    batch = (GOLDEN_DIR / "ipv6.nft").read_text()
    assert batch.startswith("add table ip6 netagent\n")
    assert " ip " not in batch and "ipv4_addr" not in batch and "127.0.0.0" not in batch
    assert "dnat ip6 to [fd00:10:244:1::2]:8080" in batch            # the one-endpoint form (affinity)
    assert "fib daddr type local ip6 daddr != ::1 meta l4proto" in batch
    assert "2001:db8::10 . tcp . 80 . 2001:db8:77::/64" in batch       # IPv6 ranges only; 10/8 said nothing
    assert "10.0.0.0" not in batch


@pytest.mark.parametrize("family, other", [(IpFamily.V4, "fd00:10:96::7"), (IpFamily.V6, "10.96.0.7"),
                                           (IpFamily.V6, "::ffff:10.96.0.7")])
def test_an_address_of_the_other_family_is_left_out_and_reported(family, other):
    good = rich_state(family)
    bad = sp("bad", other)
    services = {**good.services, bad.name: bad}
    endpoints = {**good.endpoints, bad.name: ()}
    proxy = NftablesProxy(nft=FakeNft(), family=family)
    report = proxy.sync(ProxyState(good.node, services, endpoints), changed=None)
    assert set(report.unprogrammed) == {bad.name} and f"{family.nft} table" in report.unprogrammed[bad.name]
    assert len(proxy.programmed()) == 11   # the rest programmed (the rich state's 11 entry points)


@pytest.mark.parametrize("bad", ["fe80::1%eth0", "::1.2.3.4", "::ffff:10.96.0.7", "10.96.0.7", "fd00::g", ""])
def test_the_ip6_table_refuses_scoped_ipv4_embedding_and_non_ipv6_text(bad):
    with pytest.raises(text.UnsafeNftText):
        spelling(IpFamily.V6).address(bad)


def test_ipv6_addresses_are_written_as_libnftables_lists_them():
    assert spelling(IpFamily.V6).address("FD00:0:0:0::0010") == "fd00::10"
    assert spelling(IpFamily.V6).address("fd00:0:1:0:0:0:0:1") == "fd00:0:1::1"


def test_an_endpoint_of_the_other_family_leaves_its_port_out():
    good = rich_state(IpFamily.V6)
    web = next(name for name in good.services if name.name == "web")
    endpoints = {**good.endpoints, web: (Endpoint("10.244.1.2", 8080, node_name="node"),)}
    report = NftablesProxy(nft=FakeNft(), family=IpFamily.V6).sync(ProxyState(good.node, good.services, endpoints),
                                                                  changed=None)
    assert set(report.unprogrammed) == {web}


def test_node_port_addresses_and_the_cluster_cidr_are_taken_per_family():
    node = NodeContext(name="node", cluster_cidr="10.244.0.0/16", nodeport_addresses=("192.168.1.7", "2001:db8::7"),
                       family=IpFamily.V6)
    v6 = NftProxySettings(family=IpFamily.V6)
    services = fixed_chains(node, v6)[N.SERVICES][-1].statements
    assert services.startswith("ip6 daddr { 2001:db8::7 } meta l4proto")
    assert not fixed_chains(node, v6)[N.LOCAL_IP][0].statements.startswith("ip")   # no IPv6 cluster CIDR: no pod match
    only_v4 = NodeContext(name="node", nodeport_addresses=("192.168.1.7",))
    assert fixed_chains(only_v4, v6)[N.SERVICES][-1].statements.startswith("fib daddr type local ip6 daddr != ::1 ")
    assert fixed_chains(only_v4, NftProxySettings())[N.SERVICES][-1].statements.startswith("ip daddr { 192.168.1.7 } ")


def test_ipv4_source_ranges_only_fence_every_ipv6_client_out():
    lb = sp("lb", "fd00:10:96::14", load_balancer_ips=("2001:db8::10",), load_balancer_source_ranges=("10.0.0.0/8",))
    nft = FakeNft()
    NftablesProxy(nft=nft, family=IpFamily.V6).sync(
        ProxyState(NodeContext(name="node", family=IpFamily.V6), {lb.name: lb}, {lb.name: (Endpoint("fd00::2", 80),)}), changed=None)
    held = read_table("ip6", N.TABLE, nft.list_table("ip6", N.TABLE))
    assert held is not None and held.set(N.FIREWALL_ALLOW) is not None
    assert [element.key for element in held.set(N.FIREWALL_IPS).elements] == [("2001:db8::10", "tcp", "80")]
    assert held.set(N.FIREWALL_ALLOW).elements == ()


ZONED_RANGES = ("fe80::%eth0\nflush ruleset/64", "fe80::1%eth0\nflush ruleset", "fe80::1%eth0/128")


def hostile_zone_state(ranges: tuple[str, ...] = ZONED_RANGES, endpoint: str = "fd00:10:244:1::9") -> ProxyState:
    """The IPv6 rich state plus one load balancer a lax server let through: source ranges (or an
    endpoint) with IPv6 zones, a newline and a command in them."""
    good = rich_state(IpFamily.V6)
    bad = sp("zoned", "fd00:10:96::99", load_balancer_ips=("2001:db8::20",),
             load_balancer_source_ranges=("2001:db8:5::/64", *ranges))
    return ProxyState(good.node, {**good.services, bad.name: bad},
                      {**good.endpoints, bad.name: (Endpoint(endpoint, 8080, node_name="node"),)})


@pytest.mark.parametrize("ranges, endpoint", [
    ((ZONED_RANGES[0],), "fd00:10:244:1::9"),    # a network: kept its zone through collapsing
    ((ZONED_RANGES[1],), "fd00:10:244:1::9"),    # a host: collapsing dropped the zone silently
    ((), "fd00:10:244:1::9%eth0\nflush ruleset"),  # an endpoint
], ids=["zoned-network-range", "zoned-host-range", "zoned-endpoint"])
def test_an_ipv6_zone_rejects_its_service_port_and_never_reaches_the_batch(ranges, endpoint):
    """A zone anywhere (a source range, an endpoint) refuses that one port with a reason; the
    rest of the IPv6 table is written in one transaction that holds no `%` and no command."""
    nft = FakeNft()
    proxy = NftablesProxy(nft=nft, family=IpFamily.V6)
    report = proxy.sync(hostile_zone_state(ranges, endpoint), changed=None)
    (bad,) = [name for name in report.unprogrammed]
    reason = report.unprogrammed[bad]
    assert bad.name == "zoned" and "fe80::" in reason or "fd00:10:244:1::9%" in reason
    assert "\n" not in reason   # the value quoted (repr), never its raw newline
    (batch,) = nft.batches
    assert "%" not in batch and "flush" not in batch and "2001:db8::20" not in batch
    assert len(proxy.programmed()) == 11   # the rest programmed (the rich state's 11 entry points)


def test_affinity_chains_name_their_ipv6_endpoints_for_status():
    proxy = NftablesProxy(nft=FakeNft(), family=IpFamily.V6)
    proxy.sync(rich_state(IpFamily.V6), changed=None)
    sticky = [entry for entry in proxy.programmed() if entry.name == "default/sticky:p"]
    assert [(entry.address, entry.backends) for entry in sticky] == [
        ("[fd00:10:96::13]:80/TCP", ("[fd00:10:244:1::2]:8080", "[fd00:10:244:1::3]:8080"))]


def test_partial_syncs_reach_what_a_full_sync_writes_and_a_restart_adopts_with_no_write():
    rng = random.Random(22)
    full_state = rich_state(IpFamily.V6)
    names = sorted(full_state.services)
    nft = FakeNft()
    proxy = NftablesProxy(nft=nft, family=IpFamily.V6)
    previous = ProxyState(full_state.node, {}, {})
    proxy.sync(previous, changed=None)
    for _ in range(12):
        kept = [name for name in names if rng.random() < 0.6]
        current = ProxyState(full_state.node, {n: full_state.services[n] for n in kept},
                             {n: full_state.endpoints[n][:rng.randint(0, 3)] for n in kept})
        assert proxy.sync(current, changed=current.changed_since(previous)).scope.value == "partial"
        previous = current
    fresh = FakeNft()
    NftablesProxy(nft=fresh, family=IpFamily.V6).sync(previous, changed=None)
    assert table(nft, IpFamily.V6) == table(fresh, IpFamily.V6)
    adopter = NftablesProxy(nft=nft, family=IpFamily.V6)
    adopter.sync(previous, changed=None)
    assert adopter.applies == 0


def test_a_state_of_the_other_family_is_a_wiring_error():
    with pytest.raises(ValueError, match="an IPv4 ProxyState handed to the IPv6 nftables proxy"):
        NftablesProxy(nft=FakeNft(), family=IpFamily.V6).sync(rich_state(IpFamily.V4), changed=None)


def test_both_families_side_by_side_and_cleanup_removes_both():
    nft = FakeNft()
    nft.apply("add table ip6 other\n")
    v4, v6 = NftablesProxy(nft=nft), NftablesProxy(nft=nft, family=IpFamily.V6)
    v4.sync(rich_state(IpFamily.V4), changed=None)
    v6.sync(rich_state(IpFamily.V6), changed=None)
    addresses = {family: {entry.address for entry in proxy.programmed() if entry.kind != "NodePort"}
                 for family, proxy in ((IpFamily.V4, v4), (IpFamily.V6, v6))}
    assert len(addresses[IpFamily.V4]) == len(addresses[IpFamily.V6]) == 8
    assert addresses[IpFamily.V4].isdisjoint(addresses[IpFamily.V6])
    v4.sync(rich_state(IpFamily.V4), changed=None)   # neither table disturbs the other: nothing to write
    v6.sync(rich_state(IpFamily.V6), changed=None)
    assert (v4.applies, v6.applies) == (1, 1)
    v6.cleanup()
    v6.cleanup()
    assert nft.tables() == [("ip6", "other")]
