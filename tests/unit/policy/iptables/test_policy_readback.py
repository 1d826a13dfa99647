"""Reading the policy state back from `iptables-save -c` text, and the packet tracer, on the
renderer's own output (so readback and renderer cannot drift apart) with counters added."""
from __future__ import annotations

import dataclasses

from netagent.kernel.ipset import FakeIpset, iptables_references
from netagent.kernel.iptables.fake import FakeIptables
from netagent.kernel.pod_attachment import PodAttachment
from netagent.policy.iptables.dataplane import IptablesDataplane
from netagent.policy.readback import Packet, ReadRule, trace
from netagent.policy.iptables.readback import parse_kernel_policy
from tests.unit.policy.iptables.test_policy_render import WEB, wanted


def programmed():
    iptables = FakeIptables()
    ipset = FakeIpset(in_use=iptables_references(iptables))
    IptablesDataplane(iptables=iptables, ipset=ipset).apply(wanted(PodAttachment.BRIDGE, WEB), full=True)
    text = iptables.save("filter")
    # counters as `iptables-save -c` prints them: 7 packets hit x/a's ingress DROP
    text = "\n".join(("[7:420] " + line) if "deny ingress to x/a" in line else line for line in text.splitlines())
    return parse_kernel_policy(text), {name: c.members for name, c in ipset.snapshot().items()}


def test_pods_policies_rules_and_drops_come_back():
    kernel, _ = programmed()
    (ingress,) = [p for p in kernel.of("x/a") if p.direction == "ingress"]
    assert (ingress.ip, ingress.policies, ingress.denied_packets) == ("10.0.0.2", ("x/web",), 7)
    assert ingress.describe_allows()[0].startswith("x/web ingress[0]: tcp/80 in set NETAGENT-NPS-")
    assert [p.direction for p in kernel.of("10.0.0.2")] == ["egress", "ingress"]
    assert len(kernel.guard) == 2


def test_tracer_follows_sets_ports_and_excepts():
    kernel, sets = programmed()
    allowed, steps = trace(kernel, sets, Packet("10.0.0.3", "10.0.0.2", "tcp", 80))   # x/b (pod=b) -> x/a serve
    assert allowed and steps[-1] == "ingress: x/a allows it by x/web ingress[0]"
    assert not trace(kernel, sets, Packet("10.0.0.3", "10.0.0.2", "tcp", 81))[0]
    assert trace(kernel, sets, Packet("10.9.0.1", "10.0.0.2", "sctp", 9005))[0]       # ipBlock 10/8
    assert not trace(kernel, sets, Packet("10.0.1.9", "10.0.0.2", "tcp", 80))[0]      # in the except
    # egress of x/a: named port "serve" of the blue namespace's pods (y/a has it as 8080)
    assert trace(kernel, sets, Packet("10.0.0.2", "10.0.1.2", "tcp", 8080))[0]
    assert not trace(kernel, sets, Packet("10.0.0.2", "10.0.1.2", "tcp", 80))[0]
    allowed, steps = trace(kernel, sets, Packet("10.0.0.99", "10.0.0.3", "tcp", 80))
    assert not allowed and "not programmed yet" in steps[0]                            # the KNOWN guard


def test_open_pods_are_named_from_the_pod_directory():
    kernel, sets = programmed()
    assert kernel.local == {"x/a": "10.0.0.2", "x/b": "10.0.0.3"}
    assert kernel.of("x/b") == [] and kernel.find("x/b") == kernel.find("b") == ("x/b", "10.0.0.3")
    assert kernel.find("10.0.0.2") == ("x/a", "10.0.0.2") and kernel.find("y/a") is None   # y/a: another node
    allowed, steps = trace(kernel, sets, Packet("10.0.0.2", "10.0.0.3", "udp", 53))
    assert allowed and steps[-1] == "ingress: x/b (10.0.0.3) is not isolated for ingress on this node"


def test_a_rule_the_tracer_cannot_read_is_said_so_and_an_unlisted_set_is_empty():
    kernel, sets = programmed()
    (ingress,) = [p for p in kernel.of("x/a") if p.direction == "ingress"]
    odd = ReadRule(("-m", "physdev", "--physdev-in", "na1234"), "allow x/odd ingress[0]", "RETURN")
    unlisted = ReadRule(("-m", "set", "--match-set", "NETAGENT-NPS-GONE", "src"), "allow x/gone", "RETURN")
    kernel.pods[kernel.pods.index(ingress)] = dataclasses.replace(ingress, allows=(unlisted, odd))
    allowed, steps = trace(kernel, sets, Packet("10.0.0.3", "10.0.0.2", "tcp", 80))
    assert not allowed and steps[-1].startswith("cannot judge: unsupported match -m physdev")
    kernel.pods[kernel.pods.index(dataclasses.replace(ingress, allows=(unlisted, odd)))] = dataclasses.replace(
        ingress, allows=(unlisted,))
    allowed, steps = trace(kernel, sets, Packet("10.0.0.3", "10.0.0.2", "tcp", 80))
    assert not allowed and "no rule allows it" in steps[-1]
