"""What both policy dataplanes take from policy/shared.py: set members checked once, a named
port's member typed until a dataplane spells it (ipset text, or an nft concatenation)."""
from __future__ import annotations

from netagent.kernel.families import IpFamily
from netagent.policy.iptables.render import spelled
from netagent.policy.nftables.render import element_key
from netagent.policy.semantics import NodePlan, PortMember, SetKind, SetRef
from netagent.policy.shared import checked_sets, ipset_spelling


def ref(kind: SetKind) -> SetRef:
    return SetRef(kind, f"a {kind.value} set", 65536, IpFamily.V4)


def test_named_port_members_stay_typed_and_are_spelled_by_each_dataplane():
    named = ref(SetKind.NAMED)
    members, broken = checked_sets(NodePlan((), {named: frozenset({PortMember("10.0.0.2", "TCP", 8080)})}), [])
    assert not broken and members[named] == {PortMember("10.0.0.2", "tcp", 8080)}
    assert spelled(named, members[named]) == {"10.0.0.2,tcp:8080"}
    assert element_key(SetKind.NAMED, PortMember("10.0.0.2", "tcp", 8080)) == ("10.0.0.2", "tcp", "8080")
    assert ipset_spelling(PortMember("fd00::2", "udp", 53)) == "fd00::2,udp:53"


def test_members_no_set_can_hold_are_left_out_or_break_an_except_set():
    named, pods, excepts = ref(SetKind.NAMED), ref(SetKind.PODS), ref(SetKind.EXCEPT)
    refused: list[str] = []
    plan = NodePlan((), {
        named: frozenset({PortMember("10.0.0.2", "tcp", 70000), PortMember("10.0.0.3", "icmp", 1),
                          "10.0.0.4,tcp:80", PortMember("10.0.0.5", "udp", 53)}),   # a string is not a named port
        pods: frozenset({"10.0.0.7", PortMember("10.0.0.8", "tcp", 1), "not-an-address"}),
        excepts: frozenset({"10.1.0.0/16", "10.2.0.0/33"}),
    })
    members, broken = checked_sets(plan, refused)
    assert members[named] == {PortMember("10.0.0.5", "udp", 53)}
    assert members[pods] == {"10.0.0.7"}
    assert broken == {excepts} and len(refused) == 6
    assert any("'10.0.0.2,tcp:70000' cannot be written; left out" in why for why in refused)
