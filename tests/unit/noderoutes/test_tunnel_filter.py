"""The tunnel source filter (`noderoutes/tunnel_filter.py`): its chain per mode and family (the
tunnel protocol first, then one set lookup), the manager against FakeIptables and FakeIpset
(idempotence, the set's members following the peers, drift repair of chain, jump and members, the
set refilled at a larger maxelem behind constant rules, no chain or set without a tunnel, cleanup
order), `netagent cleanup`'s removal of the sets, and the node agent keeping it in step with the
admitted peers at every sync."""
from ipaddress import IPv4Address, IPv6Address

import pytest

from netagent.infra.sync_runner import SyncKind
from netagent.kernel.families import IpFamily
from netagent.kernel.ipset.fake import FakeIpset, iptables_references
from netagent.kernel.ipset.model import IpsetError, IpsetSpec, IpsetType
from netagent.kernel.ipset.runner import replace_set
from netagent.kernel.iptables.fake import FakeIptables
from netagent.kernel.iptables.restore_format import join_tokens
from netagent.noderoutes.routing.model import Mode, RoutingSettings
from netagent.noderoutes.tunnel_filter import (
    TunnelFilter,
    set_capacity,
    tunnel_chain,
    tunnel_protocols,
)
from tests.unit.noderoutes.node_agent_support import LOCAL_IP, AgentHarness, node

CHAIN = "NETAGENT-TUNNEL-IN"
SET, SET6 = "NETAGENT-TUNNEL-PEERS", "NETAGENT-TUNNEL-PEERS6"
DROP = '-m comment --comment "netagent: tunnel packet from a non-peer" -j DROP'
OWN, PEER, OTHER = IPv4Address("192.0.2.1"), IPv4Address("192.0.2.2"), IPv4Address("192.0.2.3")


def rendered(chain) -> list[str]:
    return [join_tokens(rule) for rule in chain.rules]


def world(mode: Mode = Mode.VXLAN, family: IpFamily = IpFamily.V4, own=(OWN,)):
    """A filter over a FakeIptables and a FakeIpset whose sets its `--match-set` rules hold."""
    iptables = FakeIptables(family=family)
    ipset = FakeIpset(in_use=iptables_references(iptables))
    return iptables, ipset, TunnelFilter(runner=iptables, settings=RoutingSettings(mode=mode), own=own, ipset=ipset)


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


def test_the_chain_matches_the_tunnel_protocol_first_then_looks_the_family_set_up():
    chain = tunnel_chain(family=IpFamily.V4, protocols=tunnel_protocols(RoutingSettings(mode=Mode.VXLAN), IpFamily.V4))
    assert (chain.table, chain.name, chain.parent) == ("filter", CHAIN, "INPUT")
    assert rendered(chain) == [f"-p udp -m udp --dport 4789 -m set ! --match-set {SET} src {DROP}"]
    chain6 = tunnel_chain(family=IpFamily.V6, protocols=tunnel_protocols(RoutingSettings(mode=Mode.IPIP), IpFamily.V6))
    assert rendered(chain6) == [f"-p 41 -m set ! --match-set {SET6} src {DROP}"]


def test_the_set_holds_own_and_peer_addresses_of_its_family_and_follows_the_peers():
    iptables, ipset, tunnel_filter = world()
    tunnel_filter.update([OTHER, PEER, OTHER, IPv6Address("2001:db8::2")])
    assert tunnel_filter.ensure()
    assert ipset.members(SET) == {"192.0.2.1", "192.0.2.2", "192.0.2.3"}
    info = ipset.describe(SET)
    assert info is not None and (info.type, info.family, info.max_elements) == (IpsetType.HASH_IP, "inet", 1024)
    rules = iptables.table("filter").chains[CHAIN].rules
    tunnel_filter.update([PEER])  # node-3 left
    assert tunnel_filter.ensure() == [f"ipset {SET}: 1 address(es) no longer admitted"]
    tunnel_filter.update([PEER, IPv4Address("192.0.2.4")])  # node-4 joined
    assert tunnel_filter.ensure() == [f"ipset {SET}: 1 admitted address(es) missing"]
    assert ipset.members(SET) == {"192.0.2.1", "192.0.2.2", "192.0.2.4"}
    assert [w.kind for w in ipset.writes] == ["create", "update", "update", "update"]  # by member, in place
    assert ipset.writes[-1].added == ("192.0.2.4",) and ipset.writes[-2].removed == ("192.0.2.3",)
    assert iptables.table("filter").chains[CHAIN].rules == rules  # the chain did not change


def test_the_ipv6_filter_keeps_its_own_set_of_family_inet6():
    iptables, ipset, tunnel_filter = world(Mode.IPIP, IpFamily.V6, own=(IPv6Address("2001:db8::1"),))
    tunnel_filter.update([IPv6Address("2001:db8::2"), PEER])
    assert tunnel_filter.ensure() and tunnel_filter.check() == []
    assert ipset.members(SET6) == {"2001:db8::1", "2001:db8::2"} and SET not in ipset.sets
    assert ipset.describe(SET6).family == "inet6"


def test_ensure_writes_once_repairs_drift_and_cleans_up():
    iptables, ipset, tunnel_filter = world()
    tunnel_filter.update([PEER])
    assert tunnel_filter.check()
    assert tunnel_filter.ensure() == [f"ipset {SET} missing", f"filter {CHAIN}: chain missing",
                                      f"filter INPUT: no jump to {CHAIN}"]
    writes, set_writes = len(iptables.restores), len(ipset.writes)
    assert tunnel_filter.check() == [] and tunnel_filter.ensure() == []
    assert len(iptables.restores) == writes and len(ipset.writes) == set_writes
    assert iptables.table("filter").chains["INPUT"].rules[0][-1] == CHAIN  # jumped to first
    iptables.restore("*filter\n-F NETAGENT-TUNNEL-IN\nCOMMIT\n")
    assert tunnel_filter.check() and tunnel_filter.ensure() and tunnel_filter.check() == []
    assert len(ipset.writes) == set_writes  # only the chain was rewritten
    ipset.update(SET, remove=["192.0.2.2"])  # drift: a member missing
    ipset.update(SET, add=["203.0.113.9"])   # and one nobody admitted
    assert tunnel_filter.check() == [f"ipset {SET}: 1 admitted address(es) missing",
                                      f"ipset {SET}: 1 address(es) no longer admitted"]
    writes = len(iptables.restores)
    assert tunnel_filter.ensure() and tunnel_filter.check() == [] and len(iptables.restores) == writes
    assert ipset.members(SET) == {"192.0.2.1", "192.0.2.2"}
    ipset.sets.pop(SET)  # drift: the set is gone (as `ipset destroy` would refuse: rules name it)
    assert tunnel_filter.ensure() == [f"ipset {SET} missing"] and ipset.members(SET) == {"192.0.2.1", "192.0.2.2"}
    tunnel_filter.cleanup()
    filter_table = iptables.table("filter")
    assert CHAIN not in filter_table.chains and filter_table.chains["INPUT"].rules == [] and ipset.sets == {}


def test_a_partial_sync_writes_only_the_changed_members_and_reads_nothing(monkeypatch):
    """`ensure_members` (a Node change): one set write of the difference, no iptables-save, no
    ipset read; nothing at all when the members are unchanged; `ensure` when the set would outgrow
    its maxelem or nothing was written yet."""
    iptables, ipset, tunnel_filter = world()
    tunnel_filter.update([PEER])
    assert tunnel_filter.ensure_members()  # nothing written yet: the whole ensure
    reads = []
    monkeypatch.setattr(iptables, "table", lambda name: reads.append(name))
    monkeypatch.setattr(ipset, "read", lambda name: reads.append(name))
    writes = len(ipset.writes)
    assert tunnel_filter.ensure_members() == [] and len(ipset.writes) == writes
    tunnel_filter.update([PEER, OTHER])
    assert tunnel_filter.ensure_members() == [f"ipset {SET}: 1 admitted, 0 no longer"]
    tunnel_filter.update([OTHER])
    assert tunnel_filter.ensure_members() == [f"ipset {SET}: 0 admitted, 1 no longer"]
    assert reads == [] and len(ipset.writes) == writes + 2
    assert ipset.members(SET) == {"192.0.2.1", "192.0.2.3"}
    monkeypatch.undo()
    tunnel_filter.update(IPv4Address(int(OTHER) + i) for i in range(set_capacity(2)))  # beyond maxelem
    assert tunnel_filter.ensure_members() == [f"ipset {SET}: maxelem 1024 is below the 1025 admitted"]
    assert len(ipset.members(SET)) == 1025


def test_cleanup_removes_the_rules_before_the_set_they_name():
    iptables, ipset, tunnel_filter = world()
    tunnel_filter.ensure()
    with pytest.raises(IpsetError, match="in use"):  # what the kernel says while a rule names it
        ipset.destroy(SET)
    tunnel_filter.cleanup()
    assert [w.kind for w in ipset.writes][-1] == "destroy" and CHAIN not in iptables.table("filter").chains
    assert ipset.sets == {}
    tunnel_filter.cleanup()  # quiet when gone


def test_a_set_outgrowing_its_maxelem_is_refilled_and_swapped_in_behind_the_same_rules():
    assert [set_capacity(n) for n in (0, 512, 513, 5000)] == [1024, 1024, 2048, 16384]
    iptables, ipset, tunnel_filter = world()
    tunnel_filter.update([IPv4Address(int(PEER) + i) for i in range(3)])
    tunnel_filter.ensure()
    rules = iptables.table("filter").chains[CHAIN].rules
    many = [IPv4Address(int(IPv4Address("10.0.0.0")) + i) for i in range(1500)]
    tunnel_filter.update(many)
    assert tunnel_filter.ensure() == [f"ipset {SET}: maxelem 1024 is below the 1501 admitted"]
    assert ipset.describe(SET).max_elements == 4096 and len(ipset.members(SET)) == 1501
    assert [w.kind for w in ipset.writes][2:] == ["create", "update", "swap", "destroy"]  # the scratch set
    assert set(ipset.sets) == {SET} and iptables.table("filter").chains[CHAIN].rules == rules
    assert tunnel_filter.check() == []


def test_a_set_of_another_type_is_recreated_after_the_rules_naming_it_go():
    iptables, ipset, tunnel_filter = world()
    tunnel_filter.ensure()
    iptables.restore("*filter\n-F NETAGENT-TUNNEL-IN\nCOMMIT\n")
    ipset.destroy(SET)
    ipset.ensure_set(IpsetSpec(SET, IpsetType.HASH_NET))
    tunnel_filter.update([PEER])
    problems = tunnel_filter.ensure()
    assert problems[0] == f"ipset {SET} is hash:net family inet, not hash:ip family inet"
    assert ipset.describe(SET).type is IpsetType.HASH_IP and tunnel_filter.check() == []


def test_replace_set_refuses_to_swap_in_a_set_of_another_type():
    ipset = FakeIpset()
    ipset.ensure_set(IpsetSpec(SET, IpsetType.HASH_NET))
    with pytest.raises(IpsetError, match="cannot be swapped"):
        replace_set(ipset, IpsetSpec(SET, IpsetType.HASH_IP), ["192.0.2.1"], scratch=SET + "-NEW")


LISTED = """Name: NETAGENT-TUNNEL-PEERS6
Type: hash:ip
Revision: 6
Header: family inet6 hashsize 1024 maxelem 2048 bucketsize 12 initval 0x6a034ce8
Size in memory: 296
References: 1
Number of entries: 2
Members:
2001:db8::2
2001:db8::1
"""


def test_one_ipset_list_reads_the_header_and_the_members():
    from netagent.kernel.ipset.restore import parse_list
    info, members = parse_list(LISTED)
    assert (info.name, info.type, info.family, info.max_elements, info.references, info.entries) == \
        (SET6, IpsetType.HASH_IP, "inet6", 2048, 1, 2)
    assert members == {"2001:db8::1", "2001:db8::2"}
    empty = LISTED.replace("Number of entries: 2", "Number of entries: 0").split("Members:")[0] + "Members:\n"
    assert parse_list(empty)[1] == frozenset()


def test_without_a_tunnel_no_chain_or_set_is_kept_and_left_ones_are_removed():
    iptables, ipset, tunnel_filter = world(own=())
    tunnel_filter.ensure()
    assert CHAIN in iptables.table("filter").chains and SET in ipset.sets
    host_gw = TunnelFilter(runner=iptables, settings=RoutingSettings(mode=Mode.HOST_GW), own=(), ipset=ipset)
    assert host_gw.check() == [f"filter {CHAIN} present with no tunnel in use",
                               f"ipset {SET} present with no tunnel in use"]
    assert host_gw.ensure()
    assert CHAIN not in iptables.table("filter").chains and SET not in ipset.sets
    assert host_gw.check() == [] and host_gw.ensure() == []


def test_netagent_cleanup_removes_the_ip6tables_chain_then_the_sets(monkeypatch):
    from netagent.daemon import cleanup
    from netagent.kernel.ipset import runner as ipset_runner
    from netagent.kernel.iptables import backend as iptables_backend
    from netagent.kernel.iptables import runner as iptables_runner

    iptables6, ipset, tunnel_filter = world(Mode.IPIP, IpFamily.V6, own=(IPv6Address("2001:db8::1"),))
    tunnel_filter.ensure()
    ipset.ensure_set(IpsetSpec("NETAGENT-NPS-0123456789abcdef", IpsetType.HASH_IP))  # not the filter's
    monkeypatch.setattr(iptables_backend, "missing_binaries", lambda family, backend: backend.value != "nft")
    iptables4 = FakeIptables()
    monkeypatch.setattr(iptables_runner, "IptablesRunner",
                        lambda *, backend, family: iptables6 if family is IpFamily.V6 else iptables4)
    monkeypatch.setattr(ipset_runner, "IpsetRunner", lambda: ipset)
    assert cleanup.remove_owned_chains() == [f"ip6tables (nft) chain filter/{CHAIN}", f"ipset {SET6}"]
    assert set(ipset.sets) == {"NETAGENT-NPS-0123456789abcdef"} and CHAIN not in iptables6.table("filter").chains


def admitted_sources(harness: AgentHarness) -> list[str]:
    tunnel_filter = harness.agent.tunnel_filters[IpFamily.V4]
    return sorted(tunnel_filter.ipset.members(SET), key=lambda a: IPv4Address(a))


def test_the_agent_keeps_the_filter_in_step_with_the_admitted_peers():
    harness = AgentHarness()
    harness.put(node("node-2", 2))
    harness.put(node("node-3", 3, cidr="10.96.0.0/24"))  # refused (the Service range): not admitted
    harness.sync(SyncKind.FULL)
    assert admitted_sources(harness) == [str(LOCAL_IP), "198.18.16.12"]
    rules = harness.iptables.table("filter").chains[CHAIN].rules
    harness.put(node("node-4", 4))
    harness.sync()
    assert admitted_sources(harness) == [str(LOCAL_IP), "198.18.16.12", "198.18.16.14"]
    harness.delete("node-2")
    harness.sync()
    assert admitted_sources(harness) == [str(LOCAL_IP), "198.18.16.14"]
    assert harness.iptables.table("filter").chains[CHAIN].rules == rules
    harness.iptables.restore("*filter\n-F INPUT\nCOMMIT\n")  # drift: the full sync repairs the jump
    harness.sync(SyncKind.FULL)
    assert harness.iptables.table("filter").chains["INPUT"].rules[0][-1] == CHAIN


def test_the_agent_keeps_no_filter_in_host_gw_mode():
    harness = AgentHarness(mode=Mode.HOST_GW)
    harness.put(node("node-2", 2))
    harness.sync(SyncKind.FULL)
    assert CHAIN not in harness.iptables.table("filter").chains
    assert harness.agent.tunnel_filters[IpFamily.V4].ipset.list_names() == []


def test_the_nft_flavour_writes_once_repairs_drift_and_follows_the_peers():
    from netagent.kernel.nftables.fake import FakeNft
    from netagent.noderoutes.tunnel_filter_nft import NftTunnelFilter, nft_tunnel_rules

    assert [s for s, _ in nft_tunnel_rules(RoutingSettings(mode=Mode.VXLAN), IpFamily.V6)] == [
        "udp dport 4789 ip6 saddr != @ADMITTED drop"]  # the protocol first: only tunnel packets look the set up
    assert [s for s, _ in nft_tunnel_rules(RoutingSettings(mode=Mode.IPIP), IpFamily.V4)] == [
        "meta l4proto 4 ip saddr != @ADMITTED drop"]
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
    from tests.unit.noderoutes.node_agent_support import AgentWorld

    world = AgentWorld()
    world.api.put(node("node-2", 2))
    nft = FakeNft()
    agent = NodeAgent(world.agent.settings, api=world.api, host=dataclasses.replace(world.agent.host, nft=nft),
                      registry=Registry())
    agent.prepare()
    agent._sync(SyncKind.FULL)
    agent.filter_loop.sync(SyncKind.FULL)
    assert "NETAGENT" not in world.iptables.save()
    assert agent.tunnel_filters[IpFamily.V4].check() == []
    assert [str(a) for a in agent.tunnel_filters[IpFamily.V4].admitted] == [str(LOCAL_IP), "198.18.16.12"]


NFT_GOLDEN = """\
add table ip netagent-tunnel
delete table ip netagent-tunnel
add table ip netagent-tunnel
add set ip netagent-tunnel ADMITTED { type ipv4_addr; }
add element ip netagent-tunnel ADMITTED { 192.0.2.1, 192.0.2.2 }
add chain ip netagent-tunnel INPUT { type filter hook input priority filter - 10; policy accept; }
add rule ip netagent-tunnel INPUT udp dport 4789 ip saddr != @ADMITTED drop \
comment "netagent: tunnel packets only from admitted peers [113a40b0]"
"""


def test_the_nft_batch_is_pinned_and_its_rules_name_their_set():
    """The batch the table model renders for the filter (byte-identical to the renderer it
    replaced), and the set each rule uses is a field of the rule, not found in its text."""
    from netagent.kernel.nftables.fake import FakeNft
    from netagent.noderoutes.tunnel_filter_nft import ADMITTED_SET, render_tunnel_nft, tunnel_rules

    rules = tunnel_rules(RoutingSettings(mode=Mode.AUTO), IpFamily.V4)
    assert [rule.sets for rule in rules] == [(ADMITTED_SET,)]
    batch = render_tunnel_nft(IpFamily.V4, rules, [IPv4Address("192.0.2.1"), IPv4Address("192.0.2.2")])
    assert batch == NFT_GOLDEN
    FakeNft().apply(batch)


def test_without_a_tunnel_a_partial_sync_reads_nothing_after_the_first_look(monkeypatch):
    """host-gw: the first `ensure_members` looks for leftovers (and removes them); later ones, on
    every Node change, run no iptables-save and no ipset list."""
    iptables, ipset, tunnel_filter = world(mode=Mode.HOST_GW)
    tunnel_filter.update([PEER])
    assert tunnel_filter.ensure_members() == []
    reads = []
    monkeypatch.setattr(iptables, "table", lambda name: reads.append(name))
    monkeypatch.setattr(ipset, "describe", lambda name: reads.append(name))
    tunnel_filter.update([PEER, OTHER])
    assert tunnel_filter.ensure_members() == [] and reads == []


def test_the_nft_flavour_reads_nothing_on_a_partial_sync_that_changes_no_member(monkeypatch):
    from netagent.kernel.nftables.fake import FakeNft
    from netagent.noderoutes.tunnel_filter_nft import NftTunnelFilter

    nft = FakeNft()
    tunnel_filter = NftTunnelFilter(nft=nft, settings=RoutingSettings(mode=Mode.VXLAN), own=(OWN,))
    tunnel_filter.update([PEER])
    assert tunnel_filter.ensure_members()  # nothing written yet: the whole ensure
    reads = []
    monkeypatch.setattr(nft, "list_table", lambda *args: reads.append(args))
    assert tunnel_filter.ensure_members() == [] and reads == []
    monkeypatch.undo()
    tunnel_filter.update([PEER, OTHER])
    assert tunnel_filter.ensure_members() and [str(a) for a in tunnel_filter.admitted] == [
        str(OWN), str(PEER), str(OTHER)] and tunnel_filter.check() == []
