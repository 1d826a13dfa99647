"""Node routing per IP family (issue 22): cluster CIDRs and leases per family, the IPv6
announcement read alone (hostile values cost only IPv6), one plan per family (host-gw, vxlan over
`na-vxlan6`, ipip over `na-ipip6`, auto; bgp refuses IPv6), the agent's start on a dual-stack and
on an IPv6-only node over the fakes, per-family masquerade, and the conflist's range set per family.
"""
from __future__ import annotations

import dataclasses
import json
from ipaddress import IPv4Address, IPv6Address, ip_interface, ip_network

import pytest

from netagent.cniserver import install
from netagent.infra.metrics import Registry
from netagent.infra.rejections import Rejections
from netagent.infra.sync_runner import SyncKind
from netagent.kernel.families import IpFamily
from netagent.kernel.fake_sysctl import FakeSysctls
from netagent.kernel.iptables.fake import FakeIptables
from netagent.kernel.nftables.fake import FakeNft
from netagent.kernel.pod_attachment import PodAttachment
from netagent.kernel.sysctl import IP_FORWARD, IPV6_FORWARD
from netagent.noderoutes import node_objects as nodes
from netagent.noderoutes.agent import AgentSettings, AgentStartError, NodeAgent, parse_cluster_cidrs
from netagent.noderoutes.fake_api import FakeNodeApi
from netagent.noderoutes.host import HostAccess, Lease, Masquerade
from netagent.noderoutes.masquerade_nft import masquerade_table, render_masquerade_nft
from netagent.noderoutes.routing.fake_kernel import FakeKernel
from netagent.noderoutes.routing.model import DeviceChange, LocalNode, Mode, Peer, PeerBounds, Route, RoutingSettings
from netagent.noderoutes.routing.plan import describe, describe_plan, device_drift, render_plan
from netagent.noderoutes.routing.routes import remove_owned_routing
from netagent.noderoutes.routing.vxlan import vtep_mac
from netagent.noderoutes.underlay import InterfaceInfo, UnderlayError, UnderlaySnapshot, choose_underlay

CLUSTER4, CLUSTER6 = ip_network("10.244.0.0/16"), ip_network("fd00:10:244::/56")
SERVICES4, SERVICES6 = ip_network("10.96.0.0/16"), ip_network("fd00:10:96::/112")
UNDERLAY6 = ip_network("2001:db8:16::/64")


# ---------------------------------------------------------------- flags and leases

def test_cluster_cidr_is_given_at_most_once_per_family():
    assert parse_cluster_cidrs(["fd00:10:244::/56", "10.244.0.0/16"]) == (CLUSTER4, CLUSTER6)
    assert parse_cluster_cidrs(["fd00:10:244::/56"]) == (CLUSTER6,)
    with pytest.raises(AgentStartError, match="once per IP family; IPv4 has 2"):
        parse_cluster_cidrs(["10.244.0.0/16", "10.245.0.0/16"])
    with pytest.raises(AgentStartError, match="IPv6 has 2"):
        parse_cluster_cidrs(["fd00:1::/56", "fd00:2::/56", "10.244.0.0/16"])


def test_the_lease_holds_one_pod_cidr_per_family_inside_its_own_familys_cluster_cidr():
    def lease(*cidrs):
        return nodes.node_pod_cidrs({"metadata": {"name": "n"}, "spec": {"podCIDRs": list(cidrs)}},
                                    cluster_cidrs=[CLUSTER4, CLUSTER6])
    assert lease("10.244.1.0/24", "fd00:10:244:1::/64") == (ip_network("10.244.1.0/24"),
                                                             ip_network("fd00:10:244:1::/64"))
    assert lease("fd00:10:244:1::/64") == (ip_network("fd00:10:244:1::/64"),)  # IPv6-only
    with pytest.raises(nodes.LeaseError, match="two IPv4 CIDRs"):
        lease("10.244.1.0/24", "10.244.2.0/24")
    with pytest.raises(nodes.LeaseError, match="outside the cluster CIDR fd00:10:244::/56"):
        lease("10.244.1.0/24", "fd00:99::/64")


# ---------------------------------------------------------------- the IPv6 announcement, hostile

def peer_node(notes: dict, cidrs=("10.244.2.0/24", "fd00:10:244:2::/64")) -> dict:
    return {"metadata": {"name": "node-2", "annotations": notes}, "spec": {"podCIDRs": list(cidrs)}}


GOOD4 = {nodes.PUBLIC_IP: "198.18.16.12"}


@pytest.mark.parametrize("value, why", [
    (["2001:db8::2"], "is a list, not a string"),
    (12, "is a int, not a string"),
    ("2001:db8::" + "1" * 100, "characters (at most 64)"),
    ("not an address", "is not an IPv6 address"),
    ("198.18.16.12", "is not an IPv6 address"),
    ("fe80::1", "not a global unicast"),
    ("fe80::1%eth0", "not a global unicast"),
    ("2001:db8::1%eth0", "not a global unicast"),
    ("::ffff:198.18.16.12", "not a global unicast"),
    ("::", "not a global unicast"),
    ("::1", "not a global unicast"),
    ("ff02::1", "not a global unicast"),
])
def test_a_hostile_public_ipv6_makes_only_ipv6_unroutable(value, why):
    peer = nodes.read_peer(peer_node({**GOOD4, nodes.PUBLIC_IPV6: value}))
    assert isinstance(peer, Peer) and peer.public_ip == IPv4Address("198.18.16.12")
    assert why in peer.ipv6_problem and peer.public_ipv6 is None
    assert isinstance(peer.in_family(IpFamily.V4), Peer)
    refused = peer.in_family(IpFamily.V6)
    assert not isinstance(refused, Peer) and refused.family is IpFamily.V6 and refused.detail.startswith("IPv6: ")


def test_an_ipv6_only_node_announces_public_ipv6_alone():
    notes = nodes.render_announcement(backend_type="vxlan", public_ip=IPv6Address("2001:db8:16::12"),
                                      backend_data={"vtepMAC6": vtep_mac("node-2", IpFamily.V6)})
    assert nodes.PUBLIC_IP not in notes and notes[nodes.PUBLIC_IPV6] == "2001:db8:16::12"
    peer = nodes.read_peer(peer_node(notes, cidrs=("fd00:10:244:2::/64",)))
    assert isinstance(peer, Peer)
    projected = peer.in_family(IpFamily.V6)
    assert isinstance(projected, Peer) and projected.public_ip == IPv6Address("2001:db8:16::12")
    assert projected.vtep_mac == vtep_mac("node-2", IpFamily.V6)
    bad = nodes.read_peer(peer_node({nodes.PUBLIC_IPV6: "fe80::2"}, cidrs=("fd00:10:244:2::/64",)))
    assert isinstance(bad, nodes.Unusable) and "not a global unicast" in bad.detail


def test_an_ipv4_announcement_stays_as_it_was():
    assert nodes.render_announcement(backend_type="vxlan", public_ip="198.18.16.11", backend_data={}) == {
        nodes.BACKEND_TYPE: "vxlan", nodes.PUBLIC_IP: "198.18.16.11", nodes.BACKEND_DATA: "{}"}


# ---------------------------------------------------------------- one plan per family

LOCAL6 = LocalNode(name="node-1", vtep_mac=vtep_mac("node-1", IpFamily.V6), public_ip=IPv6Address("2001:db8:16::11"), underlay_ifname="eth0",
                   underlay_network=UNDERLAY6, underlay_mtu=1500,
                   pod_cidrs=(ip_network("10.244.1.0/24"), ip_network("fd00:10:244:1::/64")))
BOUNDS = PeerBounds(cluster_cidrs=(CLUSTER4, CLUSTER6),
                    reserved=((ip_network("fd00:10:244:ff::/64"), "the service range"),))


def dual_peer(index: int, public6: str | None, cidr6: str | None = None) -> Peer:
    return Peer(name=f"node-{index}", public_ip=IPv4Address(f"198.18.16.{10 + index}"),
                public_ipv6=IPv6Address(public6) if public6 else None,
                pod_cidrs=(ip_network(f"10.244.{index}.0/24"), ip_network(cidr6 or f"fd00:10:244:{index}::/64")),
                vtep_mac=vtep_mac(f"node-{index}"), vtep_mac6=vtep_mac(f"node-{index}", IpFamily.V6))


PEERS = [dual_peer(2, "2001:db8:16::12"), dual_peer(3, "2001:db8:99::13"), dual_peer(4, None),
         dual_peer(5, "2001:db8:16::15", "fd00:99::/64"), dual_peer(6, "2001:db8:16::16", "fd00:10:244:ff::/80"),
         dual_peer(7, "2001:db8:16::17", "fd00:10:244:2::/64")]


def test_the_ipv6_plan_of_each_mode():
    vxlan = describe_plan(render_plan(LOCAL6, PEERS, RoutingSettings(mode=Mode.VXLAN), bounds=BOUNDS))
    mac1, mac2 = vtep_mac("node-1", IpFamily.V6), vtep_mac("node-2", IpFamily.V6)
    assert vxlan.splitlines()[:5] == [
        f"link na-vxlan6 type vxlan id 1 dstport 4789 local 2001:db8:16::11 dev eth0 nolearning address {mac1} "
        f"mtu 1430 up, addr fd00:10:244:1::/128, tx-checksum-ip-generic off",
        "peer node-2 vxlan",
        f"  neigh fd00:10:244:2:: lladdr {mac2} dev na-vxlan6 permanent",
        f"  fdb {mac2} dst 2001:db8:16::12 dev na-vxlan6 self permanent",
        "  route fd00:10:244:2::/64 via fd00:10:244:2:: dev na-vxlan6 onlink"]
    assert "pending node-4: no IPv6 public IP announced (netagent.io/public-ipv6)" in vxlan
    assert "refused node-5: pod CIDR fd00:99::/64 is outside the cluster CIDR (fd00:10:244::/56" in vxlan
    assert "refused node-6: pod CIDR fd00:10:244:ff::/80 overlaps the service range fd00:10:244:ff::/64" in vxlan
    assert "refused node-7: pod CIDR fd00:10:244:2::/64 overlaps one held by node-2" in vxlan
    assert "10.244." not in vxlan and "ignored" not in vxlan  # IPv4 is the other planner's
    host_gw = render_plan(LOCAL6, PEERS[:2], RoutingSettings(mode=Mode.HOST_GW), bounds=BOUNDS)
    assert [str(r.gateway) for r in host_gw.peers["node-2"].routes] == ["2001:db8:16::12"]
    assert "not on this node's underlay subnet 2001:db8:16::/64" in host_gw.refused["node-3"].reason
    auto = render_plan(LOCAL6, PEERS[:2], RoutingSettings(mode=Mode.AUTO), bounds=BOUNDS)
    assert (auto.peers["node-2"].mode, auto.peers["node-3"].mode) == (Mode.HOST_GW, Mode.VXLAN)
    assert auto.peers["node-3"].fdb[0].dst == IPv6Address("2001:db8:99::13")


def test_the_ipv6_ipip_plan_is_an_external_ip6tnl_and_an_encap_route_to_each_peers_public_ipv6():
    ipip = describe_plan(render_plan(LOCAL6, PEERS[:2], RoutingSettings(mode=Mode.IPIP), bounds=BOUNDS))
    assert ipip.splitlines() == [
        "link na-ipip6 type ip6tnl external mode ip6ip6 mtu 1460 up, addr fd00:10:244:1::/128",
        "peer node-2 ipip", "  route fd00:10:244:2::/64 encap ip6 dst 2001:db8:16::12 dev na-ipip6",
        "peer node-3 ipip", "  route fd00:10:244:3::/64 encap ip6 dst 2001:db8:99::13 dev na-ipip6"]
    auto = render_plan(LOCAL6, PEERS[:2], RoutingSettings(mode=Mode.AUTO, auto_encap=Mode.IPIP), bounds=BOUNDS)
    assert [d.ifname for d in auto.devices] == ["na-ipip6"]
    assert (auto.peers["node-2"].mode, auto.peers["node-3"].mode) == (Mode.HOST_GW, Mode.IPIP)
    assert describe(auto.peers["node-3"].routes[0]) == "route fd00:10:244:3::/64 encap ip6 dst 2001:db8:99::13 dev na-ipip6"


def test_the_fake_kernel_makes_an_ip6tnl_device_and_repairs_or_recreates_it():
    kernel = FakeKernel()
    (device,) = render_plan(LOCAL6, (), RoutingSettings(mode=Mode.IPIP), bounds=BOUNDS).devices
    assert kernel.ensure_ipip(device) is DeviceChange.EMPTIED
    link = kernel.links["na-ipip6"]
    assert (link.kind, link.external, link.proto, link.mtu, link.up) == ("ip6tnl", True, 41, 1460, True)
    assert link.addresses == {ip_interface("fd00:10:244:1::/128")}
    assert kernel.ensure_ipip(device) is DeviceChange.UNCHANGED
    kernel.links["na-ipip6"] = dataclasses.replace(link, proto=0)  # mode any: would carry IPv4 too
    assert device_drift(device, kernel.links["na-ipip6"]).recreate == "mode (proto) is 0, want 41"
    assert kernel.ensure_ipip(device) is DeviceChange.EMPTIED and kernel.links["na-ipip6"].proto == 41
    kernel.links["na-ipip6"] = dataclasses.replace(kernel.links["na-ipip6"], external=False)  # someone's NBMA one
    assert device_drift(device, kernel.links["na-ipip6"]).recreate == "external is False, want True"
    assert kernel.ensure_ipip(device) is DeviceChange.EMPTIED and kernel.links["na-ipip6"].external
    kernel.links["na-ipip6"] = dataclasses.replace(kernel.links["na-ipip6"], mtu=1500)
    assert kernel.ensure_ipip(device) is DeviceChange.REPAIRED and kernel.links["na-ipip6"].mtu == 1460


# ---------------------------------------------------------------- the underlay per family

def snapshot(*addresses6: str, v4: bool = True) -> UnderlaySnapshot:
    from ipaddress import ip_interface
    eth0 = InterfaceInfo(name="eth0", index=2, mtu=1500,
                         addresses=(ip_interface("198.18.16.11/20"),) if v4 else (),
                         addresses6=tuple(ip_interface(a) for a in addresses6))
    return UnderlaySnapshot(interfaces=(eth0,), default_route_ifindexes=(2,) if v4 else (),
                            default_route6_ifindexes=(2,))


def test_the_underlay_holds_an_address_of_every_family():
    dual = choose_underlay(snapshot("2001:db8:16::11/64"), families=(IpFamily.V6, IpFamily.V4))
    assert (dual.public_ip, dual.public_ipv6, dual.network6) == (
        IPv4Address("198.18.16.11"), IPv6Address("2001:db8:16::11"), UNDERLAY6)
    only6 = choose_underlay(snapshot("2001:db8:16::11/64", v4=False), families=(IpFamily.V6,))
    assert (only6.public_ip, only6.public_ipv6, only6.reason) == (
        IPv6Address("2001:db8:16::11"), None, "the interface of the default route")
    with pytest.raises(UnderlayError, match="no global IPv6 address"):
        choose_underlay(snapshot(), iface="eth0", families=(IpFamily.V4, IpFamily.V6))
    overridden = choose_underlay(snapshot("2001:db8:16::11/64"), families=(IpFamily.V4, IpFamily.V6),
                                 public_ip_override="2001:db8:77::1")
    assert (overridden.public_ip, overridden.public_ipv6, overridden.behind_nat) == (
        IPv4Address("198.18.16.11"), IPv6Address("2001:db8:77::1"), True)


# ---------------------------------------------------------------- the agent, dual-stack and IPv6-only

def own_node(cidrs: tuple) -> dict:
    return {"metadata": {"name": "node-1", "uid": "u1", "creationTimestamp": "2026-01-01T00:00:00Z"},
            "spec": {"podCIDRs": list(cidrs)}}


def world(*, cluster: tuple, cidrs: tuple, mode: Mode = Mode.VXLAN, v4: bool = True, nft: bool = False,
          masquerade: Masquerade = Masquerade.ON):
    kernel = FakeKernel()
    kernel.add_link("lo", kind="loopback", addresses=("127.0.0.1/8",), mtu=65536)
    kernel.add_link("eth0", addresses=(("198.18.16.11/20",) if v4 else ()) + ("2001:db8:16::11/64", "fe80::11/64"))
    if v4:
        kernel.add_foreign_route(Route(dst=ip_network("0.0.0.0/0"), gateway=IPv4Address("198.18.16.1"),
                                       ifname="eth0", onlink=False))
    kernel.add_foreign_route(Route(dst=ip_network("::/0"), gateway=IPv6Address("2001:db8:16::1"), ifname="eth0",
                                   onlink=False))
    api = FakeNodeApi()
    api.put(own_node(cidrs), key="node-1")
    iptables, iptables6 = FakeIptables(), FakeIptables(family=IpFamily.V6)
    fake_nft = FakeNft() if nft else None
    leases: list[Lease] = []
    settings = AgentSettings(node_name="node-1", cluster_cidrs=cluster, service_cidrs=(SERVICES4, SERVICES6),
                             routing=RoutingSettings(mode=mode), masquerade=masquerade, lease_timeout=0.0,
                             resync_interval=3600.0)
    host = HostAccess(kernel=kernel, sysctls=FakeSysctls({IP_FORWARD.key: "0", IPV6_FORWARD.key: "0"}),
                      iptables={IpFamily.V4: iptables, IpFamily.V6: iptables6}, nft=fake_nft, kernel_release="6.12.0")
    agent = NodeAgent(settings, api=api, host=host, registry=Registry(), rejections=Rejections().scope("noderoutes"),
                      on_lease=leases.append)
    return agent, api, kernel, leases, (iptables, iptables6, fake_nft)


def announced(api: FakeNodeApi, index: int, *, v4: bool = True) -> dict:
    name = f"node-{index}"
    data = {"vtepMAC6": vtep_mac(name, IpFamily.V6)}
    if v4:
        data["vtepMAC"] = vtep_mac(name)
    notes = nodes.render_announcement(backend_type="vxlan", public_ip=f"198.18.16.{10 + index}" if v4 else None,
                                      public_ipv6=f"2001:db8:16::{10 + index}", backend_data=data)
    cidrs = ([f"10.244.{index}.0/24"] if v4 else []) + [f"fd00:10:244:{index}::/64"]
    obj = {"metadata": {"name": name, "uid": f"u{index}", "creationTimestamp": "2026-01-02T00:00:00Z",
                        "annotations": notes}, "spec": {"podCIDRs": cidrs}}
    api.put(obj, key=name)
    return obj


def test_a_dual_stack_agent_routes_announces_masquerades_and_leases_both_families():
    agent, api, kernel, leases, (iptables, iptables6, _) = world(
        cluster=(CLUSTER4, CLUSTER6), cidrs=("10.244.1.0/24", "fd00:10:244:1::/64"))
    agent.prepare()
    notes = nodes.node_annotations(api.store.get("node-1"))
    assert notes[nodes.PUBLIC_IP] == "198.18.16.11" and notes[nodes.PUBLIC_IPV6] == "2001:db8:16::11"
    # random per node (issue 29, item 11), announced as the devices hold them
    assert json.loads(notes[nodes.BACKEND_DATA]) == {"vtepMAC": kernel.links["na-vxlan"].mac,
                                                     "vtepMAC6": kernel.links["na-vxlan6"].mac}
    assert kernel.links["na-vxlan"].mac not in (vtep_mac("node-1"), kernel.links["na-vxlan6"].mac)
    assert set(kernel.links_with_prefix("na-")) == {"na-vxlan", "na-vxlan6"}
    assert (kernel.links["na-vxlan"].mtu, kernel.links["na-vxlan6"].mtu) == (1450, 1430)
    assert agent.host.sysctls.read(IP_FORWARD.key) == "1" and agent.host.sysctls.read(IPV6_FORWARD.key) == "1"
    assert leases == [Lease(node_name="node-1", pod_cidrs=(ip_network("10.244.1.0/24"),
                                                           ip_network("fd00:10:244:1::/64")), mtu=1430)]
    announced(api, 2)
    agent._sync(SyncKind.FULL)
    assert {str(r.dst): (str(r.gateway), r.ifname) for r in kernel.dump_routes(IpFamily.V6)} == {
        "fd00:10:244:2::/64": ("fd00:10:244:2::", "na-vxlan6")}
    assert {str(r.dst) for r in kernel.dump_routes(IpFamily.V4)} == {"10.244.2.0/24"}
    assert agent.last_report is not None and agent.last_report.peers_by_mode["vxlan"] == 2
    assert "fd00:10:244::/56" in iptables6.save() and "fd00" not in iptables.save()
    assert "MASQUERADE" in iptables6.save()
    agent._sync(SyncKind.FULL)  # a second full sync adopts: no kernel write
    assert agent.last_report.added == 0 and agent.last_report.removed == 0


def test_a_peer_refused_in_ipv6_only_is_rejected_with_the_reason_and_keeps_ipv4():
    agent, api, kernel, _, _ = world(cluster=(CLUSTER4, CLUSTER6), cidrs=("10.244.1.0/24", "fd00:10:244:1::/64"))
    agent.prepare()
    obj = announced(api, 2)
    obj["metadata"]["annotations"][nodes.PUBLIC_IPV6] = "fe80::2"
    api.put(obj, key="node-2")
    agent._sync(SyncKind.FULL)
    assert {str(r.dst) for r in kernel.dump_routes(IpFamily.V4)} == {"10.244.2.0/24"}
    assert kernel.dump_routes(IpFamily.V6) == []
    (rejected,) = agent.rejections.snapshot()
    assert rejected.ref.name == "node-2" and rejected.detail.startswith("IPv6: ") and rejected.reason == "malformed"
    assert agent.last_report is not None and agent.last_report.refused["node-2"].family is IpFamily.V6


def test_an_ipv6_only_agent_in_nftables_mode():
    agent, api, kernel, leases, (_, _, nft) = world(cluster=(CLUSTER6,), cidrs=("fd00:10:244:1::/64",), v4=False,
                                                    nft=True)
    agent.prepare()
    notes = nodes.node_annotations(api.store.get("node-1"))
    assert nodes.PUBLIC_IP not in notes and notes[nodes.PUBLIC_IPV6] == "2001:db8:16::11"
    assert set(kernel.links_with_prefix("na-")) == {"na-vxlan6"}
    assert leases[0].mtu == 1430 and leases[0].pod_cidrs == (ip_network("fd00:10:244:1::/64"),)
    announced(api, 2, v4=False)
    agent._sync(SyncKind.FULL)
    assert [str(r.dst) for r in kernel.dump_routes(IpFamily.V6)] == ["fd00:10:244:2::/64"]
    assert nft is not None and nft.list_table("ip6", "netagent-masq") is not None
    assert nft.list_table("ip", "netagent-masq") is None


def test_bgp_refuses_an_ipv6_cluster_cidr_at_start():
    agent, *_ = world(cluster=(CLUSTER4, CLUSTER6), cidrs=("10.244.1.0/24", "fd00:10:244:1::/64"), mode=Mode.BGP,
                      masquerade=Masquerade.OFF)
    with pytest.raises(AgentStartError, match="route IPv4 only"):
        agent.prepare()


def test_a_dual_stack_ipip_node_gets_na_ipip_and_na_ipip6_and_routes_each_family_through_its_own():
    agent, api, kernel, leases, _ = world(cluster=(CLUSTER4, CLUSTER6), cidrs=("10.244.1.0/24", "fd00:10:244:1::/64"),
                                          mode=Mode.IPIP, masquerade=Masquerade.OFF)
    agent.prepare()
    assert kernel.links_with_prefix("na-") == {"na-ipip": "ipip", "na-ipip6": "ip6tnl"}
    assert (kernel.links["na-ipip"].mtu, kernel.links["na-ipip6"].mtu) == (1480, 1460)
    assert leases[0].mtu == 1460  # the pods' MTU: the worse of the two families' tunnels
    announced(api, 2)
    agent._sync(SyncKind.FULL)
    assert kernel.dump_routes(IpFamily.V6) == [Route(dst=ip_network("fd00:10:244:2::/64"), ifname="na-ipip6",
                                                     encap_dst=IPv6Address("2001:db8:16::12"))]
    assert {str(r.dst): (str(r.gateway), r.ifname) for r in kernel.dump_routes(IpFamily.V4)} == {
        "10.244.2.0/24": ("198.18.16.12", "na-ipip")}
    assert agent.last_report is not None and agent.last_report.peers_by_mode["ipip"] == 2
    agent._sync(SyncKind.FULL)  # a second full sync adopts: no kernel write
    assert agent.last_report.added == 0 and agent.last_report.removed == 0
    assert "device na-ipip6 (ip6tnl)" in remove_owned_routing(kernel)  # what `netagent cleanup` runs
    assert kernel.links_with_prefix("na-") == {} and kernel.dump_routes(IpFamily.V6) == []


def test_a_pod_cidr_without_a_cluster_cidr_of_its_family_is_not_routed():
    agent, api, kernel, leases, _ = world(cluster=(CLUSTER4,), cidrs=("10.244.1.0/24", "fd00:10:244:1::/64"),
                                          masquerade=Masquerade.OFF)
    agent.prepare()
    assert set(kernel.links_with_prefix("na-")) == {"na-vxlan"}
    assert nodes.PUBLIC_IPV6 not in nodes.node_annotations(api.store.get("node-1"))
    assert leases[0].mtu == 1450


# ---------------------------------------------------------------- masquerade and the conflist

def test_the_ipv6_masquerade_table_is_ip6_netagent_masq():
    batch = render_masquerade_nft(masquerade_table(cluster_cidrs=[CLUSTER6], pod_cidrs=["fd00:10:244:1::/64"],
                                                   family=IpFamily.V6))
    assert "add table ip6 netagent-masq" in batch and "type ipv6_addr" in batch
    assert "ip6 saddr @CLUSTER-CIDRS ip6 daddr != ff00::/8 masquerade fully-random" in batch
    assert " ip saddr" not in batch
    with pytest.raises(ValueError, match="is not IPv6"):
        masquerade_table(cluster_cidrs=[CLUSTER4], pod_cidrs=["10.244.1.0/24"], family=IpFamily.V6)


def test_the_conflist_has_one_range_set_per_family(tmp_path):
    path = install.write_conflist(conf_dir=str(tmp_path), name="netagent", subnets=["10.244.1.0/24",
                                                                                   "fd00:10:244:1::/64"],
                                  mode=PodAttachment.BRIDGE, bridge="na0", mtu=1430, socket_path="/run/x.sock",
                                  data_dir="/var/lib/x")
    plugin = json.loads(open(path).read())["plugins"][0]
    assert plugin["ipam"]["ranges"] == [[{"subnet": "10.244.1.0/24"}], [{"subnet": "fd00:10:244:1::/64"}]]
    assert plugin["mtu"] == 1430
    with pytest.raises(install.InstallError, match="one range set per family"):
        install.write_conflist(conf_dir=str(tmp_path), name="netagent", subnets=["10.244.1.0/24", "10.244.2.0/24"],
                               mode=PodAttachment.BRIDGE, bridge="na0", mtu=1430, socket_path="/run/x.sock",
                               data_dir="/var/lib/x")


def test_an_encap_ip6_route_message_round_trips_through_pyroute2s_own_decoder():
    """What NetlinkKernel writes for an `encap ip6` route, as the kernel's dump hands it back (the
    write and read against real kernels: tests/vm/guest/test_ipip_kernel.py)."""
    import socket

    from pyroute2.netlink.rtnl.rtmsg import LWTUNNEL_ENCAP_IP6, rtmsg

    from netagent.noderoutes.routing.kernel import _EncapRouteMsg, _ip6_encap_dst
    sent = _EncapRouteMsg()
    sent["family"], sent["dst_len"], sent["type"] = socket.AF_INET6, 64, 1
    sent["attrs"] = [("RTA_DST", "fd00:10:244:2::"), ("RTA_OIF", 7), ("RTA_ENCAP_TYPE", LWTUNNEL_ENCAP_IP6),
                     ("RTA_ENCAP", {"attrs": [("LWTUNNEL_IP6_ID", 0), ("LWTUNNEL_IP6_DST", "2001:db8:99::13")]})]
    sent.encode()
    dumped = rtmsg(sent.data)
    dumped.decode()
    assert dumped.get_attr("RTA_ENCAP_TYPE") == LWTUNNEL_ENCAP_IP6
    assert _ip6_encap_dst(dumped.get_attr("RTA_ENCAP")) == IPv6Address("2001:db8:99::13")
    assert _ip6_encap_dst("") is None and _ip6_encap_dst("00:00") is None  # nothing readable: no destination


def test_a_second_external_ip6tnl_in_the_namespace_is_a_clear_error():
    """The kernel allows one external ip6tnl per namespace: another program's makes creating
    na-ipip6 fail with EEXIST, which the agent explains instead of passing the errno on."""
    import errno
    import os

    from pyroute2.netlink.exceptions import NetlinkError

    from netagent.kernel import namespaces
    from netagent.kernel.errors import KernelError
    from netagent.noderoutes.routing.kernel import NetlinkKernel
    from netagent.noderoutes.routing.model import IpipDevice

    class RefusingLinks:
        def link(self, *args, **kwargs):
            raise NetlinkError(errno.EEXIST, "File exists")

    kernel = NetlinkKernel.__new__(NetlinkKernel)   # no IPRoute socket: the link call is the stub's
    kernel._netns_fd = os.open(namespaces.THREAD_NETNS, os.O_RDONLY | os.O_CLOEXEC)
    kernel._netns_identity = namespaces.identity(kernel._netns_fd)
    kernel._ipr, kernel._indexes = RefusingLinks(), {}
    kernel.observe = lambda ifname: None
    device = IpipDevice(ifname="na-ipip6", local=IPv6Address("fd00:1::10"), mtu=1460,
                        address=ip_interface("fd00:10:244:1::/128"))
    try:
        with pytest.raises(KernelError, match="another external ip6tnl device") as raised:
            kernel.ensure_ipip(device)
        assert raised.value.code == errno.EEXIST
    finally:
        os.close(kernel._netns_fd)
