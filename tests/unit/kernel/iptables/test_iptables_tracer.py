"""The kernel iptables library's tracer on its own: one rule's matches (`PacketTracer.matches`,
what the policy read-back asks), sets of addresses, networks and ports, and refusing what it
does not understand (a tracer that guessed would make tests pass that should fail). Its walk
through whole service rulesets is tested in test_proxy_iptables_tracer.py."""
from __future__ import annotations

import pytest

from netagent.kernel.iptables.restore_format import split_tokens
from netagent.kernel.iptables.tracer import Packet, PacketTracer, TraceError, tables_from_text, trace_packet

POD, VIP = "10.244.1.77", "10.96.0.10"
SETS = {"NETS": frozenset({"10.0.0.0/8", "192.168.5.0/24"}), "ADDRS": frozenset({"10.0.0.2"}),
        "PORTS": frozenset({"10.0.1.2,tcp:8080"}), "EMPTY": frozenset()}


def matches(rule: str, packet: Packet) -> bool:
    return PacketTracer({}, local_addresses=(), ipsets=SETS).matches(split_tokens(rule), packet)


def test_addresses_protocols_and_port_ranges():
    packet = Packet("10.0.0.3", "10.0.0.2", "tcp", 80)
    assert matches("-s 10.0.0.0/24 -d 10.0.0.2/32 -p tcp -m tcp --dport 80", packet)
    assert matches("-p tcp -m tcp --dport 70:90", packet)
    assert not matches("-p udp -m udp --dport 80", packet)
    assert not matches("! -s 10.0.0.0/24", packet)
    assert matches("-m comment --comment \"anything\" -p tcp", packet)
    assert matches("", packet)                                            # no match: everything


def test_sets_of_networks_addresses_and_address_ports():
    assert matches("-m set --match-set NETS src", Packet("10.9.0.1", "10.0.0.2", "sctp", 9005))
    assert not matches("-m set --match-set NETS src", Packet("172.16.0.1", "10.0.0.2", "tcp", 80))
    assert matches("-m set ! --match-set NETS src", Packet("172.16.0.1", "10.0.0.2", "tcp", 80))
    assert matches("-m set --match-set ADDRS dst", Packet("10.0.0.3", "10.0.0.2", "tcp", 80))
    assert matches("-m set --match-set PORTS dst,dst", Packet("10.0.0.2", "10.0.1.2", "tcp", 8080))
    assert not matches("-m set --match-set PORTS dst,dst", Packet("10.0.0.2", "10.0.1.2", "tcp", 80))
    assert not matches("-m set --match-set EMPTY src", Packet("10.0.0.2", "10.0.1.2", "tcp", 80))
    assert matches("-p TCP", Packet("10.0.0.2", "10.0.1.2", "TCP", 80))  # any case


def test_a_random_match_is_no_yes_or_no_and_unknowns_are_refused():
    packet = Packet("10.0.0.3", "10.0.0.2", "tcp", 80)
    with pytest.raises(TraceError):
        matches("-m statistic --mode random --probability 0.5", packet)
    with pytest.raises(TraceError):
        matches("-m physdev --physdev-in na1234", packet)
    with pytest.raises(TraceError):
        matches("-m set --match-set UNKNOWN src", packet)


def test_the_tracer_refuses_what_it_does_not_understand():
    tables = tables_from_text("*nat\n:PREROUTING ACCEPT [0:0]\n-A PREROUTING -m physdev --physdev-is-in -j ACCEPT\n"
                              "COMMIT\n")
    with pytest.raises(TraceError):
        trace_packet(tables, Packet(POD, VIP, "tcp", 80), local_addresses=[])
    tables = tables_from_text("*nat\n:PREROUTING ACCEPT [0:0]\n-A PREROUTING -j CLASSIFY --set-class 1:1\nCOMMIT\n")
    with pytest.raises(TraceError):
        trace_packet(tables, Packet(POD, VIP, "tcp", 80), local_addresses=[])
    tables = tables_from_text("*nat\n:POSTROUTING ACCEPT [0:0]\n"
                              "-A POSTROUTING -m set --match-set UNKNOWN dst,dst,src -j MASQUERADE\nCOMMIT\n")
    with pytest.raises(TraceError):
        trace_packet(tables, Packet(POD, VIP, "tcp", 80), local_addresses=[])
