"""What the kernel enforces, read back: per pod and direction, the policies, the allow rules
and the packets denied; and a tracer that answers "would A reach B on port P?" from those
rules and the sets' members. Pure: each dataplane reads its kernel state into these values
(`iptables/readback.py`: `iptables-save -c` text; `nftables/readback.py`: the table's listing).

Why from the kernel and not from the agent's memory: the question an operator asks is what
the node does now (after a restart, a hand edit, a failed sync), and the rules say it: each
pod chain starts with a comment rule naming the pod, its address and the policies that
isolate it, each allow rule's comment names its policy rule, and the final DROP
carries the denied packet count; the pod directory chains (never jumped to) name every
programmed local pod, open ones included, with its address. The tracer walks the same chains a new connection walks:
the KNOWN guard of the hook chain, the source pod's egress chain, the destination pod's
ingress chain; whether a rule matches is the kernel iptables library's tracer's answer
(`PacketTracer.matches`, one matcher for the proxy and the policy), which says so when it
meets a match it does not read. A set the rules name that `ipset save` did not list is
empty.
"""
from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from netagent.kernel.iptables.tracer import Packet, PacketTracer, TraceError

__all__ = ["KernelPolicy", "Packet", "PodDirection", "ReadRule", "describe_match", "trace"]

ALLOW_PREFIX = "allow "        # an allow rule's purpose: + "<policy> <direction>[<index>]"


@dataclass(frozen=True)
class ReadRule:
    """One rule as read back: its match in iptables' spelling (what the tracer judges), its
    purpose (the comment without the dataplane's prefix and digest: `allow x/p ingress[0]`),
    its target and the packets it counted."""
    spec: tuple[str, ...]
    comment: str
    target: str
    packets: int = 0


@dataclass(frozen=True)
class PodDirection:
    """One pod chain as the kernel holds it."""
    pod: str
    ip: str
    direction: str                       # "ingress" | "egress"
    chain: str
    policies: tuple[str, ...]
    allows: tuple[ReadRule, ...]
    denied_packets: int

    def describe_allows(self) -> list[str]:
        return [f"{rule.comment.removeprefix(ALLOW_PREFIX)}: {describe_match(rule.spec)}" for rule in self.allows]


@dataclass
class KernelPolicy:
    pods: list[PodDirection] = field(default_factory=list)
    guard: list[ReadRule] = field(default_factory=list)   # the hook chain's DROP rules (KNOWN guard)
    local: dict[str, str] = field(default_factory=dict)   # every programmed local pod (the directory): ns/name -> ip

    def of(self, pod_or_ip: str) -> list[PodDirection]:
        return [p for p in self.pods if pod_or_ip in (p.pod, p.ip, p.pod.split("/")[-1])]

    def find(self, pod_or_ip: str) -> tuple[str, str] | None:
        """(ns/name, ip) of a local pod given as ns/name, a bare name or its address."""
        for pod, ip in sorted(self.local.items()):
            if pod_or_ip in (pod, ip, pod.split("/")[-1]):
                return pod, ip
        chains = self.of(pod_or_ip)
        return (chains[0].pod, chains[0].ip) if chains else None


POD_HEADER = re.compile(r"^(ingress|egress) (\S+) (\S+) selected by (.*)$")


def pod_directions(chains: Mapping[str, Sequence[ReadRule]], *, address_first: bool,
                   pod_of: Callable[[str, str], str] = lambda pod, ip: pod) -> list[PodDirection]:
    """The pod chains among `chains` (name -> rules read back, in order): each whose first
    rule's comment is a pod header, `<direction> <pod> <ip> selected by <policies>` (the
    nftables renderer writes the address first: `address_first`), with its allows (the
    RETURN rules after it) and its denied packets (its DROP rules' counters). `pod_of(pod, ip)`
    names the pod (the nft dataplane looks the address up in its directory)."""
    found = []
    for name, rules in sorted(chains.items()):
        head = POD_HEADER.match(rules[0].comment) if rules else None
        if head is None:
            continue
        direction, first, second, policies = head.groups()
        pod, ip = (second, first) if address_first else (first, second)
        denied = sum(rule.packets for rule in rules if rule.target == "DROP")
        found.append(PodDirection(pod_of(pod, ip), ip, direction, name, tuple(filter(None, policies.split(","))),
                                  tuple(rule for rule in rules[1:] if rule.target == "RETURN"), denied))
    return found


def describe_match(spec: Sequence[str]) -> str:
    """`-p tcp -m set --match-set S src -m tcp --dport 80` -> `tcp/80 from set S`."""
    words, index, protocol = [], 0, "any protocol"
    while index < len(spec):
        token = spec[index]
        if token == "-p":
            protocol = spec[index + 1]
            index += 2
        elif token in ("-s", "-d"):
            words.append(f"{'from' if token == '-s' else 'to'} {spec[index + 1]}")
            index += 2
        elif token == "--dport":
            protocol = f"{protocol}/{spec[index + 1]}"
            index += 2
        elif token == "--match-set":
            negated = index > 0 and spec[index - 1] == "!"
            words.append(f"{'not ' if negated else ''}in set {spec[index + 1]} ({spec[index + 2]})")
            index += 3
        else:
            index += 1
    if protocol == "any protocol" and not words:
        return "everything"
    return " ".join([protocol, *words])


def _matcher(kernel: KernelPolicy, sets: Mapping[str, frozenset[str]]) -> PacketTracer:
    """The tracer over `sets`, every other set our rules name empty (not listed by ipset save)."""
    named = {rule.spec[index + 1] for rules in (kernel.guard, *(pod.allows for pod in kernel.pods))
             for rule in rules for index, token in enumerate(rule.spec[:-1]) if token == "--match-set"}
    return PacketTracer({}, local_addresses=(), ipsets={**dict.fromkeys(named, frozenset()), **sets})


def trace(kernel: KernelPolicy, sets: Mapping[str, frozenset[str]], packet: Packet) -> tuple[bool, list[str]]:
    """(allowed, the steps that decided it) for the first packet of a new connection."""
    steps: list[str] = []
    matcher = _matcher(kernel, sets)
    try:
        for rule in kernel.guard:
            if matcher.matches(rule.spec, packet):
                return False, [f"dropped: {rule.comment} ({describe_match(rule.spec)})"]
        for direction, address in (("egress", packet.source), ("ingress", packet.destination)):
            chain = next((p for p in kernel.pods if p.direction == direction and p.ip == address), None)
            if chain is None:
                named = next((f"{pod} ({ip})" for pod, ip in kernel.local.items() if ip == address), address)
                steps.append(f"{direction}: {named} is not isolated for {direction} on this node")
                continue
            allowed_by = next((rule for rule in chain.allows if matcher.matches(rule.spec, packet)), None)
            if allowed_by is None:
                steps.append(f"{direction}: {chain.pod} is isolated by {', '.join(chain.policies) or '?'} "
                             f"and no rule allows it: dropped")
                return False, steps
            steps.append(f"{direction}: {chain.pod} allows it by {allowed_by.comment.removeprefix(ALLOW_PREFIX)}")
    except TraceError as error:
        return False, [*steps, f"cannot judge: {error}"]
    return True, steps
