"""IPv6 and dual-stack NetworkPolicy without root (issue 22): IPv6 ipBlocks and pod addresses
through the real parsers (hostile ones refused alone), the family-free plan split per family
(policy/families.py), the IPv6 renderings against goldens (ip6tables restore text and the
`ip6 netagent-policy` batch), and a dual-stack engine over the stateful fakes: both families
programmed, adopted with no write, a dual-stack ADD programmed alone in both, cleaned up.

Goldens: tests/unit/golden/policy/*-ipv6.rules and nft_ipv6_routed.nft; rewrite them with
`UPDATE_GOLDEN=1 .venv/bin/python -m pytest tests/unit/policy/test_policy_families.py -q`.
"""
from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from netagent.infra.sync_runner import SyncKind
from netagent.kernel import owned
from netagent.kernel.families import IpFamily
from netagent.kernel.ipset import FakeIpset, iptables_references
from netagent.kernel.iptables.fake import FakeIptables
from netagent.kernel.nftables.fake import FakeNft
from netagent.kernel.pod_attachment import PodAttachment
from netagent.policy.engine import PolicyEngine, PolicySettings
from netagent.policy.families import FamilyDataplanes, plan_for_family
from netagent.policy.kube_objects import parse_ip_block, parse_pod, parse_policy
from netagent.policy.model import IpBlock
from netagent.policy.pod_binding import bound_addresses
from netagent.policy.iptables.dataplane import IptablesDataplane
from netagent.policy.nftables.dataplane import NftablesDataplane
from netagent.policy.readback import Packet, trace
from netagent.policy.ndp import NDP_TYPES, iptables_rules as ndp_rules
from netagent.policy.iptables.render import render_chains, render_wanted
from netagent.policy.shared import RenderSettings, ServicePath
from netagent.policy.nftables.render import render_nft
from netagent.policy.semantics import CidrMatch, PortMember, SetKind, SetRef, plan_node
from tests.unit.policy.policy_objects import namespace, pod, policy
from tests.unit.policy.test_policy_semantics import view_of

GOLDEN_DIR = Path(__file__).resolve().parents[1] / "golden" / "policy"
VETH = "na0123456789ab"
CIDRS = ("10.0.0.0/24", "fd00:0:0:1::/64")
LONG = 30.0


def dual(obj: dict, v6: str) -> dict:
    obj["status"]["podIPs"] = [{"ip": obj["status"]["podIP"]}, {"ip": v6}]
    return obj


PODS = (dual(pod("x", "a", "10.0.0.2", {"pod": "a"}, ports=(("serve", 80, "TCP"),)), "fd00:0:0:1::2"),
        dual(pod("x", "b", "10.0.0.3", {"pod": "b"}, ports=(("serve", 81, "TCP"),)), "fd00:0:0:1::3"),
        pod("x", "c", "10.0.0.4", {"pod": "c"}),                                   # IPv4 only
        pod("x", "d", "fd00:0:0:1::5", {"pod": "d"}),                              # IPv6 only
        dual(pod("y", "a", "10.0.1.2", {"pod": "a"}, node="node-2", ports=(("serve", 8080, "TCP"),)),
             "fd00:0:0:2::2"),
        namespace("x", team="red"), namespace("y", team="blue"))
WEB = policy("x", "web", {"podSelector": {"matchLabels": {"pod": "a"}}, "ingress": [
    {"from": [{"podSelector": {"matchLabels": {"pod": "b"}}},
              {"ipBlock": {"cidr": "fd00::/16", "except": ["fd00:0:0:2::/64"]}},
              {"ipBlock": {"cidr": "10.0.0.0/8", "except": ["10.0.1.0/24"]}}],
     "ports": [{"port": "serve"}, {"protocol": "SCTP", "port": 9000, "endPort": 9010}]}],
    "egress": [{"to": [{"namespaceSelector": {"matchLabels": {"team": "blue"}}}], "ports": [{"port": "serve"}]},
               {"to": [{"ipBlock": {"cidr": "::/0"}}], "ports": [{"protocol": "UDP", "port": 53}]}]})


def plan(*policies: dict):
    return plan_node(view_of(*PODS, *policies), node_name="node-1")


# ---- parsing ----

def test_an_ipv6_ip_block_with_except_is_read_canonical():
    assert parse_ip_block({"cidr": "FD00:0::1/16", "except": ["fd00:0:0:2::9/64"]}, where="b") == \
        IpBlock("fd00::/16", ("fd00:0:0:2::/64",))


@pytest.mark.parametrize("block, why", [
    ({"cidr": "fd00::/16", "except": ["10.0.0.0/8"]}, "not of fd00::/16's family"),
    ({"cidr": "10.0.0.0/8", "except": ["fd00::/16"]}, "not of 10.0.0.0/8's family"),
    ({"cidr": "fd00::/16", "except": ["fd01::/64"]}, "not inside"),
    ({"cidr": "fd00::/16", "except": ["fd00::/16"]}, "the whole block"),
    ({"cidr": "::ffff:10.0.0.0/104"}, "v4-mapped"),
    ({"cidr": "::/64"}, "v4-mapped"),
    ({"cidr": "fe80::/64%eth0"}, "zone"),
    ({"cidr": "fe80::1%eth0/64"}, "zone"),
    ({"cidr": "fd00::/129"}, "fd00::/129"),
    ({"cidr": "fd00::"}, "not a CIDR"),
    ({"cidr": "fd00:::1/64"}, "fd00:::1/64"),
])
def test_hostile_ipv6_ip_blocks_are_refused_alone_and_fail_closed(block, why):
    reading = parse_policy(policy("x", "p", {"podSelector": {}, "ingress": [
        {"from": [{"ipBlock": block}, {"podSelector": {"matchLabels": {"pod": "b"}}}]}]}))
    assert reading.reason == "malformed" and why in "; ".join(reading.problems), reading.problems
    peers = reading.value.ingress[0].peers
    assert peers is not None and len(peers) == 1 and peers[0].scope is not None     # the other peer kept


def test_a_policy_whose_only_peer_is_refused_allows_nothing():
    reading = parse_policy(policy("x", "p", {"podSelector": {}, "ingress": [
        {"from": [{"ipBlock": {"cidr": "fd00::/16", "except": ["10.0.0.0/8"]}}]}]}))
    assert reading.value.ingress[0].peers == ()


@pytest.mark.parametrize("status", [
    {"podIP": "10.0.0.2", "podIPs": [{"ip": "10.0.0.2"}, {"ip": "FD00::2"}]},
    {"podIP": "fd00::2", "podIPs": [{"ip": "fd00::2"}, {"ip": "10.0.0.2"}]},
])
def test_pod_ips_of_both_families_ipv4_first_whatever_the_order(status):
    info = parse_pod({"metadata": {"namespace": "x", "name": "a"}, "status": status}).value
    assert (info.ip, info.addresses) == ("10.0.0.2", ("10.0.0.2", "fd00::2"))


@pytest.mark.parametrize("entries, kept", [
    ([{"ip": "fe80::1%eth0"}], ()),
    ([{"ip": "::ffff:10.0.0.9"}], ()),
    ([{"ip": "fe80::9"}, {"ip": "169.254.0.9"}], ()),
    ([{"ip": "fd00::2"}, {"ip": "fd00::3"}], ("fd00::2",)),
    ([{"ip": "fd00::2"}, "fd00::3", {"ip": 7}, None, {"ip": "10.0.0.300"}], ("fd00::2",)),
])
def test_hostile_pod_addresses_are_left_out_alone(entries, kept):
    reading = parse_pod({"metadata": {"namespace": "x", "name": "a"}, "status": {"podIPs": entries}})
    assert reading.value.addresses == kept and reading.reason == "malformed"


def test_pod_ips_that_are_not_a_list_leave_pod_ip():
    reading = parse_pod({"metadata": {"namespace": "x", "name": "a"},
                         "status": {"podIP": "fd00::2", "podIPs": "fd00::3"}})
    assert reading.value.addresses == ("fd00::2",) and reading.problems


# ---- the plan per family ----

def test_the_plan_splits_per_family_sets_members_names_and_blocks():
    whole = plan(WEB)
    v4, v6 = plan_for_family(whole, IpFamily.V4), plan_for_family(whole, IpFamily.V6)
    assert {p.key: p.ip for p in v4.pods} == {"x/a": "10.0.0.2", "x/b": "10.0.0.3", "x/c": "10.0.0.4"}
    assert {p.key: p.ip for p in v6.pods} == {"x/a": "fd00:0:0:1::2", "x/b": "fd00:0:0:1::3", "x/d": "fd00:0:0:1::5"}
    a4, a6 = (next(p for p in projection.pods if p.key == "x/a") for projection in (v4, v6))
    blocks = {family: {a.peer.cidr for a in allows.ingress or () if isinstance(a.peer, CidrMatch)}
              for family, allows in ((IpFamily.V4, a4), (IpFamily.V6, a6))}
    assert blocks == {IpFamily.V4: {"10.0.0.0/8"}, IpFamily.V6: {"fd00::/16"}}
    assert {a.peer.cidr for a in a6.egress or () if isinstance(a.peer, CidrMatch)} == {"::/0"}
    assert not any(isinstance(a.peer, CidrMatch) for a in a4.egress or ())      # ::/0 matches no IPv4 peer
    members = {ref.kind: held for ref, held in v6.sets.items()}
    assert members[SetKind.PODS] == {"fd00:0:0:1::3"}
    assert members[SetKind.EXCEPT] == {"fd00:0:0:2::/64"}
    assert members[SetKind.NAMED] == {PortMember("fd00:0:0:2::2", "tcp", 8080)}
    assert all(ref.family is IpFamily.V6 and ref.name.startswith(owned.POLICY_SET6_PREFIX) and len(ref.name) <= 31
               for ref in v6.sets)
    assert not {ref.name for ref in v4.sets} & {ref.name for ref in v6.sets}


def test_an_ipv4_plan_is_its_own_ipv4_part_and_has_no_ipv6_part():
    ipv4_only = plan_node(view_of(*[o for o in PODS if "podIPs" not in o.get("status", {})
                                    and ":" not in (o.get("status") or {}).get("podIP", "")],
                                  policy("x", "p", {"podSelector": {}, "ingress": [{"from": [
                                      {"podSelector": {}}, {"ipBlock": {"cidr": "10.0.0.0/8"}}]}]})),
                          node_name="node-1")
    assert ipv4_only.pods and plan_for_family(ipv4_only, IpFamily.V4) is ipv4_only
    assert plan_for_family(ipv4_only, IpFamily.V6).pods == ()


def test_ipv4_only_blocks_allow_no_ipv6_peer():
    v6 = plan_for_family(plan(policy("x", "p", {"podSelector": {"matchLabels": {"pod": "a"}}, "ingress": [
        {"from": [{"ipBlock": {"cidr": "10.0.0.0/8"}}, {"ipBlock": {"cidr": "192.168.0.0/16"}}]}]})), IpFamily.V6)
    a = next(p for p in v6.pods if p.key == "x/a")
    assert a.ingress == () and a.ingress_policies == ("x/p",) and not v6.sets     # isolated, nothing allowed


# ---- goldens ----

def wanted6(mode: PodAttachment, *, ipvs: bool = False):
    settings = RenderSettings(mode, local_cidrs=("fd00:0:0:1::/64",), family=IpFamily.V6,
                              services=ServicePath.OUTPUT if ipvs else ServicePath.FORWARD)
    return render_wanted(plan_for_family(plan(WEB), IpFamily.V6), settings=settings, interface_of=lambda p: VETH)


def _golden(name: str, text: str) -> None:
    path = GOLDEN_DIR / name
    if os.environ.get("UPDATE_GOLDEN"):
        path.write_text(text)
    assert text == path.read_text()


@pytest.mark.parametrize("ipvs", [False, True], ids=["", "ipvs"])
@pytest.mark.parametrize("mode", list(PodAttachment), ids=lambda m: m.value)
def test_ipv6_iptables_golden(mode, ipvs):
    state = wanted6(mode, ipvs=ipvs)
    _golden(f"{mode.value}{'-ipvs' if ipvs else ''}-ipv6.rules", render_chains(state.chains).text())
    assert state.known == {"fd00:0:0:1::2", "fd00:0:0:1::3", "fd00:0:0:1::5"}
    assert {spec.family for spec in state.sets} == {"inet6"}
    assert all(len(name) <= 28 for name in state.chains)


def test_ipv6_nft_golden():
    recorded: list[str] = []

    class Recording(FakeNft):
        def apply(self, batch: str) -> None:
            recorded.append(batch)
            super().apply(batch)

    nft = Recording()
    programmer = NftablesDataplane(nft, family=IpFamily.V6)
    settings = RenderSettings(PodAttachment.ROUTED, local_cidrs=("fd00:0:0:1::/64",), family=IpFamily.V6)
    state = programmer.render(plan_for_family(plan(WEB), IpFamily.V6), settings=settings, interface_of=lambda p: VETH)
    programmer.apply(state, full=True)
    # the batch's order of sets follows a set's iteration: compared line by line, sorted
    _golden("nft_ipv6_routed.nft", "".join(sorted("".join(recorded).splitlines(keepends=True))))
    assert nft.tables() == [("ip6", owned.NFT_POLICY_TABLE)]
    assert not programmer.apply(programmer.render(plan_for_family(plan(WEB), IpFamily.V6), settings=settings,
                                                  interface_of=lambda p: VETH), full=True).wrote


# ---- neighbour discovery: never filtered (as ARP), whatever a pod's policies ----

@pytest.mark.parametrize("mode", list(PodAttachment), ids=lambda m: m.value)
def test_ipv6_neighbour_discovery_returns_in_the_hook_chain_before_any_pod_chain(mode):
    """ICMPv6 NDP and MLD RETURN right after the replies, before the KNOWN guard and every hook
    into a pod chain (once per node, not per pod or rule); IPv4 has no such rule (ARP is not IP)."""
    hook = wanted6(mode).chains[owned.POLICY_CHAIN]
    ndp = [rule for rule in hook if "ipv6-icmp" in rule]
    assert list(hook[1:1 + len(NDP_TYPES)]) == ndp == ndp_rules(IpFamily.V6)
    assert [rule[rule.index("--icmpv6-type") + 1] for rule in ndp] == [str(kind) for kind in NDP_TYPES]
    assert {"133", "134", "135", "136", "137"} <= {rule[rule.index("--icmpv6-type") + 1] for rule in ndp}
    hop_limits = {rule[rule.index("--icmpv6-type") + 1]: rule[rule.index("--hl-eq") + 1] for rule in ndp}
    assert hop_limits == {"130": "1", "131": "1", "132": "1", "133": "255", "134": "255", "135": "255",
                          "136": "255", "137": "255", "143": "1"}     # only what was never routed
    assert all(rule[:4] == ("-p", "ipv6-icmp", "-m", "icmp6") and rule[-1] == "RETURN" for rule in ndp)
    assert not any("icmp6" in rule for name, rules in wanted6(mode).chains.items() if name != owned.POLICY_CHAIN
                   for rule in rules)
    v4 = render_wanted(plan_for_family(plan(WEB), IpFamily.V4), interface_of=lambda p: VETH,
                       settings=RenderSettings(mode, local_cidrs=("10.0.0.0/24",)))
    assert not any("icmp6" in rule or "ipv6-icmp" in rule for rules in v4.chains.values() for rule in rules)
    assert ndp_rules(IpFamily.V4) == []


def test_nft_neighbour_discovery_is_one_base_rule_of_the_ip6_table_only():
    settings = RenderSettings(PodAttachment.BRIDGE, local_cidrs=("fd00:0:0:1::/64",), family=IpFamily.V6)
    base = render_nft(plan_for_family(plan(WEB), IpFamily.V6), settings=settings, interface_of=lambda p: VETH,
                      family=IpFamily.V6).base
    assert [rule.statements for rule in base[1:3]] == [
        "icmpv6 type { nd-router-solicit, nd-router-advert, nd-neighbor-solicit, nd-neighbor-advert, nd-redirect }"
        " ip6 hoplimit 255 return",
        "icmpv6 type { mld-listener-query, mld-listener-report, mld-listener-done, mld2-listener-report }"
        " ip6 hoplimit 1 return"]
    assert all(rule.statements.endswith(" return") for rule in base[1:3])   # the same nine types as iptables'
    v4 = render_nft(plan_for_family(plan(WEB), IpFamily.V4), settings=RenderSettings(PodAttachment.BRIDGE),
                    interface_of=lambda p: VETH, family=IpFamily.V4)
    assert not any("icmpv6" in rule.statements for rule in v4.base)


def test_the_ipv6_read_back_ignores_neighbour_discovery_and_still_traces():
    """The NDP RETURNs are neither guard nor allow rules: the read-back's guard is the KNOWN
    DROPs, and its tracer (which does not read icmp6) judges a connection as before."""
    iptables, ipset = FakeIptables(family=IpFamily.V6), FakeIpset()
    programmer = IptablesDataplane(iptables=iptables, ipset=ipset, family=IpFamily.V6)
    state = wanted6(PodAttachment.BRIDGE)
    programmer.apply(state, full=True)
    assert not programmer.apply(wanted6(PodAttachment.BRIDGE), full=True).wrote      # read back: no drift
    kernel = programmer.read_policy()
    assert len(kernel.guard) == 2 and all(rule.target == "DROP" for rule in kernel.guard)
    assert not any("icmp6" in rule.spec for pod_chain in kernel.pods for rule in pod_chain.allows)
    sets = programmer.read_sets()
    assert trace(kernel, sets, Packet("fd00:0:0:1::3", "fd00:0:0:1::2", "tcp", 80))[0]        # x/b -> x/a serve
    assert not trace(kernel, sets, Packet("fd00:0:0:1::3", "fd00:0:0:1::2", "tcp", 81))[0]


# ---- a dual-stack engine over the fakes ----

class DualNode:
    """One node's engine with one iptables dataplane per family, sharing one FakeIpset (ipset's
    names are global), as policy_start.py builds it."""

    def __init__(self, *pods: dict, ipset: FakeIpset | None = None, iptables: dict | None = None) -> None:
        self.iptables = iptables or {family: FakeIptables(family=family) for family in IpFamily}
        refs = [iptables_references(fake) for fake in self.iptables.values()]
        self.ipset = ipset or FakeIpset(in_use=lambda name: any(ref(name) for ref in refs))
        self.dataplanes = FamilyDataplanes({family: IptablesDataplane(iptables=self.iptables[family], ipset=self.ipset,
                                                                     family=family) for family in IpFamily})
        self.reservations = {"10.0.0.2": "ca", "fd00:0:0:1::2": "ca", "10.0.0.3": "cb", "fd00:0:0:1::3": "cb"}
        self.engine = PolicyEngine(PolicySettings("node-1", RenderSettings(PodAttachment.ROUTED, local_cidrs=CIDRS)),
                                   dataplane=self.dataplanes, interface_of=lambda p: self._veth(p.ip))
        self.engine.set_requester(lambda: None)
        for recorder in (self.engine.namespaces, self.engine.pods, self.engine.policies):
            recorder.on_synced()
        for obj in (namespace("x"), PODS[1], *pods, WEB):
            (self.engine.namespaces if "spec" not in obj else
             self.engine.policies if obj.get("kind") == "NetworkPolicy" else self.engine.pods).on_add(obj)
        self.engine.sync(SyncKind.FULL)

    def _veth(self, ip: str) -> str | None:
        container = self.reservations.get(ip)
        return f"na{container}0000000000" if container else None

    def saved(self, family: IpFamily) -> str:
        return self.iptables[family].save("filter")

    def writes(self) -> tuple[int, ...]:
        return (*(len(fake.restores) for fake in self.iptables.values()), len(self.ipset.writes))


def test_a_dual_stack_engine_programs_each_family_in_its_own_tables_and_sets():
    node = DualNode(PODS[0])
    assert "-s 10.0.0.0/24 -m set ! --match-set NETAGENT-NP-KNOWN src" in node.saved(IpFamily.V4)
    assert "-s fd00:0:0:1::/64 -m set ! --match-set NETAGENT-NP-KNOWN6 src" in node.saved(IpFamily.V6)
    assert "fd00" not in node.saved(IpFamily.V4) and "10.0.0" not in node.saved(IpFamily.V6)
    assert node.ipset.members(owned.POLICY_KNOWN_SET) == {"10.0.0.2", "10.0.0.3"}
    assert node.ipset.members(owned.POLICY_KNOWN_SET6) == {"fd00:0:0:1::2", "fd00:0:0:1::3"}
    families = {name: info.family for name in node.ipset.list_names() if (info := node.ipset.describe(name))}
    assert {family for name, family in families.items() if name.startswith(owned.POLICY_SET6_PREFIX)} == {"inet6"}
    assert {family for name, family in families.items() if name.startswith(owned.POLICY_SET_PREFIX)} == {"inet"}
    # a restarted agent adopts both families with no write at all
    again = DualNode(PODS[0], ipset=node.ipset, iptables=node.iptables)
    assert again.engine.last_report is not None and not again.engine.last_report.wrote
    # cleanup removes both families' chains and sets
    again.dataplanes.cleanup()
    assert not node.ipset.list_names()
    assert all(owned.POLICY_PREFIX not in node.saved(family) for family in IpFamily)


def test_a_dual_stack_add_is_programmed_alone_in_both_families_and_its_del_too():
    node = DualNode()
    node.engine.pods.on_add(pod("x", "a", None, {"pod": "a"}, phase="Pending"))
    node.engine.sync(SyncKind.PARTIAL)
    before = node.writes()
    outcome = node.engine.bind_pod("x", "a", ("fd00:0:0:1::2/64", "10.0.0.2/24"), "naca0000000000",
                                   container_id="ca", deadline=time.monotonic() + LONG)
    assert outcome.programmed and outcome.incremental, outcome
    assert node.ipset.members(owned.POLICY_KNOWN_SET) == {"10.0.0.2", "10.0.0.3"}
    assert node.ipset.members(owned.POLICY_KNOWN_SET6) == {"fd00:0:0:1::2", "fd00:0:0:1::3"}
    assert [after - was for after, was in zip(node.writes()[:2], before)] == [1, 1]   # one restore per family
    # equal to what a full sync renders: it writes nothing
    node.engine.sync(SyncKind.FULL)
    assert not node.engine.last_report.wrote
    assert node.engine.unbind_pod("x", "a", container_id="ca", deadline=time.monotonic() + LONG).programmed
    assert node.ipset.members(owned.POLICY_KNOWN_SET6) == {"fd00:0:0:1::3"}
    node.engine.sync(SyncKind.FULL)
    assert not node.engine.last_report.wrote


def test_set_refs_of_both_families_are_distinct_values():
    ref = SetRef(SetKind.PODS, "ns=x pods[pod=b]")
    other = SetRef(SetKind.PODS, "ns=x pods[pod=b]", family=IpFamily.V6)
    assert ref != other and hash(ref) != hash(other) and ref.name != other.name
    assert ref.name.startswith(owned.POLICY_SET_PREFIX) and other.name.startswith(owned.POLICY_SET6_PREFIX)


@pytest.mark.parametrize("addresses, bound", [
    (("fd00::2/64", "10.0.0.2/24"), ("10.0.0.2", "fd00::2")),
    (("fd00::2/64",), ("fd00::2",)),
    (("::ffff:10.0.0.2/120", "fe80::1%eth0/64", "fd00::2/64", "fd00::3/64", "junk"), ("fd00::2",)),
    (("::ffff:10.0.0.2/120",), ()),
])
def test_an_adds_addresses_are_bound_one_per_family_ipv4_first(addresses, bound):
    assert bound_addresses(addresses) == bound
