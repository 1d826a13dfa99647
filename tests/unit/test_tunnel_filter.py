"""The tunnel source filter (`noderoutes/tunnel_filter.py`): its chain per mode and family, the
manager against FakeIptables (idempotence, drift repair, no chain without a tunnel, cleanup),
and the node agent keeping it in step with the admitted peers at every sync."""
from ipaddress import IPv4Address, IPv6Address

import pytest

from netagent.infra.sync_runner import SyncKind
from netagent.kernel.families import IpFamily
from netagent.kernel.iptables.fake import FakeIptables
from netagent.kernel.iptables.restore_format import join_tokens
from netagent.noderoutes.routing.model import Mode, RoutingSettings
from netagent.noderoutes.tunnel_filter import TunnelFilter, tunnel_chain, tunnel_protocols
from tests.unit.node_agent_support import LOCAL_IP, AgentHarness, node

CHAIN = "NETAGENT-TUNNEL-IN"
ADMIT = '-m comment --comment "netagent: admitted tunnel source" -j RETURN'
DROP = '-m comment --comment "netagent: tunnel packet from a non-peer" -j DROP'


def rendered(chain) -> list[str]:
    return [join_tokens(rule) for rule in chain.rules]


@pytest.mark.parametrize("settings, family, wanted", [
    (RoutingSettings(mode=Mode.VXLAN), IpFamily.V4, ["-p udp -m udp --dport 4789"]),
    (RoutingSettings(mode=Mode.VXLAN, vxlan_port=8472), IpFamily.V6, ["-p udp -m udp --dport 8472"]),
    (RoutingSettings(mode=Mode.IPIP), IpFamily.V4, ["-p 4"]),
    (RoutingSettings(mode=Mode.IPIP), IpFamily.V6, ["-p 41"]),
    (RoutingSettings(mode=Mode.AUTO), IpFamily.V4, ["-p udp -m udp --dport 4789"]),
    (RoutingSettings(mode=Mode.AUTO, auto_encap=Mode.IPIP), IpFamily.V4, ["-p 4"]),
    (RoutingSettings(mode=Mode.HOST_GW), IpFamily.V4, []),
    (RoutingSettings(mode=Mode.BGP), IpFamily.V4, []),
], ids=["vxlan", "vxlan6-port", "ipip", "ipip6", "auto", "auto-ipip", "host-gw", "bgp"])
def test_the_dropped_protocols_follow_the_mode_and_family(settings, family, wanted):
    assert [" ".join(match) for match in tunnel_protocols(settings, family)] == \
        wanted


def test_the_chain_returns_own_and_peer_addresses_of_its_family_then_drops():
    chain = tunnel_chain(family=IpFamily.V4, protocols=tunnel_protocols(RoutingSettings(mode=Mode.VXLAN), IpFamily.V4),
                         own=(IPv4Address("192.0.2.1"),),
                         peers=[IPv4Address("192.0.2.3"), IPv4Address("192.0.2.2"), IPv4Address("192.0.2.3"),
                                IPv6Address("2001:db8::2")])
    assert (chain.table, chain.name, chain.parent) == ("filter", CHAIN, "INPUT")
    assert rendered(chain) == [f"-s 192.0.2.1/32 {ADMIT}", f"-s 192.0.2.2/32 {ADMIT}", f"-s 192.0.2.3/32 {ADMIT}",
                               f"-p udp -m udp --dport 4789 {DROP}"]


def test_ensure_writes_once_repairs_drift_and_cleans_up():
    iptables = FakeIptables()
    tunnel_filter = TunnelFilter(runner=iptables, settings=RoutingSettings(mode=Mode.VXLAN),
                                 own=(IPv4Address("192.0.2.1"),))
    tunnel_filter.update([IPv4Address("192.0.2.2")])
    assert tunnel_filter.check()
    assert tunnel_filter.ensure()
    writes = len(iptables.restores)
    assert tunnel_filter.check() == [] and tunnel_filter.ensure() == [] and len(iptables.restores) == writes
    assert iptables.table("filter").chains["INPUT"].rules[0][-1] == CHAIN  # jumped to first
    iptables.restore("*filter\n-F NETAGENT-TUNNEL-IN\nCOMMIT\n")
    assert tunnel_filter.check() and tunnel_filter.ensure() and tunnel_filter.check() == []
    tunnel_filter.update([])  # the peer left
    assert tunnel_filter.ensure()
    assert rendered(tunnel_filter.chain)[0] == f"-s 192.0.2.1/32 {ADMIT}" and len(tunnel_filter.chain.rules) == 2
    tunnel_filter.cleanup()
    filter_table = iptables.table("filter")
    assert CHAIN not in filter_table.chains and filter_table.chains["INPUT"].rules == []


def test_without_a_tunnel_no_chain_is_kept_and_a_left_one_is_removed():
    iptables = FakeIptables()
    TunnelFilter(runner=iptables, settings=RoutingSettings(mode=Mode.VXLAN), own=()).ensure()
    assert CHAIN in iptables.table("filter").chains
    host_gw = TunnelFilter(runner=iptables, settings=RoutingSettings(mode=Mode.HOST_GW), own=())
    assert host_gw.check() and host_gw.ensure()
    assert CHAIN not in iptables.table("filter").chains and host_gw.check() == [] and host_gw.ensure() == []


def admitted_sources(harness: AgentHarness) -> list[str]:
    chain = harness.iptables.table("filter").chains.get(CHAIN)
    return [] if chain is None else [rule[1] for rule in chain.rules if rule[0] == "-s"]


def test_the_agent_keeps_the_filter_in_step_with_the_admitted_peers():
    harness = AgentHarness()
    harness.put(node("node-2", 2))
    harness.put(node("node-3", 3, cidr="10.96.0.0/24"))  # refused (the Service range): not admitted
    harness.sync(SyncKind.FULL)
    assert admitted_sources(harness) == [f"{LOCAL_IP}/32", "198.18.16.12/32"]
    harness.put(node("node-4", 4))
    harness.sync()
    assert admitted_sources(harness) == [f"{LOCAL_IP}/32", "198.18.16.12/32", "198.18.16.14/32"]
    harness.delete("node-2")
    harness.sync()
    assert admitted_sources(harness) == [f"{LOCAL_IP}/32", "198.18.16.14/32"]
    harness.iptables.restore("*filter\n-F INPUT\nCOMMIT\n")  # drift: the full sync repairs the jump
    harness.sync(SyncKind.FULL)
    assert harness.iptables.table("filter").chains["INPUT"].rules[0][-1] == CHAIN


def test_the_agent_keeps_no_filter_in_host_gw_mode():
    harness = AgentHarness(mode=Mode.HOST_GW)
    harness.put(node("node-2", 2))
    harness.sync(SyncKind.FULL)
    assert CHAIN not in harness.iptables.table("filter").chains


def test_the_nft_flavour_writes_once_repairs_drift_and_follows_the_peers():
    from netagent.kernel.nftables.fake import FakeNft
    from netagent.noderoutes.tunnel_filter_nft import NftTunnelFilter, nft_tunnel_rules

    assert [s for s, _ in nft_tunnel_rules(RoutingSettings(mode=Mode.VXLAN), IpFamily.V6)] == [
        "ip6 saddr @ADMITTED return", "udp dport 4789 drop"]
    assert [s for s, _ in nft_tunnel_rules(RoutingSettings(mode=Mode.IPIP), IpFamily.V4)][1:] == [
        "meta l4proto 4 drop"]
    assert nft_tunnel_rules(RoutingSettings(mode=Mode.HOST_GW), IpFamily.V4) == ()
    nft = FakeNft()
    tunnel_filter = NftTunnelFilter(nft=nft, settings=RoutingSettings(mode=Mode.VXLAN),
                                    own=(IPv4Address("192.0.2.1"),))
    tunnel_filter.update([IPv4Address("192.0.2.2")])
    assert tunnel_filter.ensure() and tunnel_filter.check() == [] and tunnel_filter.ensure() == []
    writes = len(nft.batches)
    tunnel_filter.update([])
    assert tunnel_filter.check() and tunnel_filter.ensure() and len(nft.batches) == writes + 1
    nft.apply("delete table ip netagent-tunnel")
    assert tunnel_filter.ensure() == ["table ip netagent-tunnel missing"] and tunnel_filter.check() == []
    tunnel_filter.cleanup()
    assert nft.list_table("ip", "netagent-tunnel") is None


def test_the_agent_in_nftables_mode_writes_no_iptables_rule_for_the_filter():
    import dataclasses

    from netagent.infra.metrics import Registry
    from netagent.kernel.nftables.fake import FakeNft
    from netagent.noderoutes.agent import NodeAgent
    from tests.unit.node_agent_support import AgentWorld

    world = AgentWorld()
    world.api.put(node("node-2", 2))
    nft = FakeNft()
    agent = NodeAgent(world.agent.settings, api=world.api, host=dataclasses.replace(world.agent.host, nft=nft),
                      registry=Registry())
    agent.prepare()
    agent._sync(SyncKind.FULL)
    assert "NETAGENT" not in world.iptables.save()
    assert agent.tunnel_filters[IpFamily.V4].check() == []
    assert [str(a) for a in agent.tunnel_filters[IpFamily.V4].admitted] == [str(LOCAL_IP), "198.18.16.12"]
