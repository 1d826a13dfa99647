"""The `ip netagent-policy` table read back (libnftables JSON, `Nft.list_table`) into
policy/readback.py's `KernelPolicy` and the sets' members, so `netagent status policy`, its tracer
and the denied-packets metric are the same code in nftables mode as in iptables mode. Pure.

Why translate rather than match nft expressions on their own: there is one rule matcher
(`kernel/iptables/tracer.py`), which the trace of either dataplane should share. Each of our
rules' expressions has an iptables equivalent (an address or prefix, a set lookup, its
negation, a protocol and destination port or range, the named-port concatenation as a
`dst,dst` ip,port set, conntrack state), so a rule becomes the spec iptables-save would print
for it, and the sets' elements become ipset spellings. An expression outside that vocabulary
becomes `-m nft-<name>`, which the tracer refuses to judge (it says so), never a guess.

The table is read through kernel/nftables/tables.py (`read_table`: chains, rules by their
comments, sets and their elements as key parts); only the rules' expressions (`expr`, which
the model never reads) are taken from the listing beside it. Pods come from the table alone:
each pod chain's header (render.py) names, in its purpose (`model.purpose_of`), the
direction, address, pod and policies; the KNOWN set's elements, with their comments, name
every programmed local pod, open ones included (the pod directory); a chain's `counter drop`
holds the packets denied. A `ReadRule`'s comment is its rule's purpose.
"""
from __future__ import annotations

import ipaddress
from typing import Any

from netagent.kernel.families import IpFamily
from netagent.kernel.nftables import listing, tables
from netagent.kernel.nftables.listing import element_text
from netagent.kernel.nftables.model import Element, Set, purpose_of
from netagent.policy.readback import KernelPolicy, ReadRule, pod_directions
from netagent.policy.nftables.render import BASE_CHAIN, KNOWN_SET, TABLE

_VERDICTS = {"return": "RETURN", "drop": "DROP", "accept": "ACCEPT", "jump": "jump", "goto": "goto", "vmap": "vmap"}


def verdict_of(rule: dict[str, Any]) -> str:
    """A listed rule's verdict: `return`, `drop`, `vmap`, ... ("" for none)."""
    for expr in reversed(rule.get("expr") or ()):
        if isinstance(expr, dict):
            for key in expr:
                if key in _VERDICTS:
                    return key
    words = str(rule.get("text", "")).split()      # FakeNft keeps a rule as its text
    if "vmap" in words:
        return "vmap"
    return words[-1] if words and words[-1] in _VERDICTS else ""


def ipset_members(elements: tuple[Element, ...], *, interval: bool) -> frozenset[str]:
    """A set's elements (key parts, as `read_table` gives them) in the spelling the iptables
    tracer's ipsets hold."""
    found = set()
    for element in elements:
        if len(element.key) == 3:
            address, protocol, port = element.key
            found.add(f"{address},{protocol}:{port}")
            continue
        (text,) = element.key[:1]
        if interval and "-" in text:
            low, high = (ipaddress.ip_address(part) for part in text.split("-"))
            found.update(str(net) for net in ipaddress.summarize_address_range(low, high))
        else:
            found.add(tables.canonical_part(text))
    return frozenset(found)


def _side(left: dict[str, Any]) -> str | None:
    payload = left.get("payload") if isinstance(left, dict) else None
    if isinstance(payload, dict) and payload.get("protocol") in ("ip", "ip6"):
        return {"saddr": "src", "daddr": "dst"}.get(str(payload.get("field")))
    return None


def _match_spec(match: dict[str, Any]) -> list[str]:
    left, right, negated = match.get("left"), match.get("right"), match.get("op") == "!="
    bang = ["!"] if negated else []
    side = _side(left) if isinstance(left, dict) else None
    if side is not None:
        if isinstance(right, str) and right.startswith("@"):
            return ["-m", "set", *bang, "--match-set", right[1:], side]
        address = element_text(right)
        host = "" if "/" in address else f"/{IpFamily.of(address).max_prefix}"
        return [*bang, "-s" if side == "src" else "-d", address + host]
    if isinstance(left, dict) and "concat" in left and isinstance(right, str) and right.startswith("@"):
        return ["-m", "set", *bang, "--match-set", right[1:], "dst,dst"]
    if isinstance(left, dict) and left.get("meta", {}).get("key") == "l4proto" and not negated:
        return ["-p", str(right)]
    payload = left.get("payload") if isinstance(left, dict) else None
    if isinstance(payload, dict) and payload.get("field") == "dport" and not negated:
        protocol = payload.get("protocol")
        ports = f"{right['range'][0]}:{right['range'][1]}" if isinstance(right, dict) and "range" in right else str(right)
        head = ["-p", str(protocol)] if protocol in ("tcp", "udp", "sctp") else []
        return [*head, "-m", str(protocol), "--dport", ports]
    if isinstance(left, dict) and left.get("ct", {}).get("key") == "state" and not negated:
        states = right if isinstance(right, list) else [right]
        return ["-m", "conntrack", "--ctstate", ",".join(sorted(str(s).upper() for s in states))]
    return ["-m", "nft-unread"]


def rule_spec(rule: dict[str, Any]) -> tuple[tuple[str, ...], str, int]:
    """(iptables-style match spec, target, counted packets) of one nft rule."""
    spec: list[str] = []
    target, packets = "", 0
    if "expr" not in rule:           # FakeNft keeps a rule as its text: not read, so never judged
        verdict = verdict_of(rule)
        return ("-m", "nft-unread"), _VERDICTS.get(verdict, ""), 0
    for expr in rule.get("expr") or ():
        if not isinstance(expr, dict) or not expr:
            continue
        key = next(iter(expr))
        if key == "match":
            spec += _match_spec(expr["match"])
        elif key == "counter":
            packets = int((expr["counter"] or {}).get("packets", 0))
        elif key in _VERDICTS:
            target = _VERDICTS[key]
        else:
            spec += ["-m", f"nft-{key}"]
    return tuple(spec), target, packets


def parse_nft_policy(objects: list[dict[str, Any]]) -> tuple[KernelPolicy, dict[str, frozenset[str]]]:
    """The policy table's objects -> (its pods and rules, every set's members in ipset spelling)."""
    table = tables.read_table("ip", TABLE, objects)
    if table is None:
        return KernelPolicy(), {}
    sets = {entry.name: ipset_members(entry.elements, interval="interval" in entry.flags)
            for entry in table.sets if isinstance(entry, Set)}
    known = table.set(KNOWN_SET)
    local = {element.comment or element.key[0]: element.key[0] for element in (known.elements if known else ())}
    listed = listing.rules_by_chain(objects)
    chains: dict[str, list[ReadRule]] = {}
    for chain in table.chains:
        read = chains[chain.name] = []
        for rule, body in zip(chain.rules, listed.get(chain.name, ())):
            spec, target, packets = rule_spec(body)
            read.append(ReadRule(spec, purpose_of(rule.comment or ""), target, packets))
    found = KernelPolicy(guard=[rule for rule in chains.get(BASE_CHAIN, []) if rule.target == "DROP"], local=local)
    by_address = {ip: pod for pod, ip in local.items()}
    found.pods.extend(pod_directions(chains, address_first=True, pod_of=lambda pod, ip: by_address.get(ip, pod)))
    return found, sets
