"""How much one NetworkPolicy may hold: `PolicyLimits` (the agent's `--policy-max-*` flags) and
`measure`, which counts a policy's raw spec against them before anything of it is parsed.

Why a bound per object. A policy a real API server accepts can hold tens of thousands of
peers (1.5 MB, 37,000 ipBlocks); rendered one rule per (peer, port) into the chain of every
pod it selects, that was 740,000 rules and seconds of work per sync on every node. Above a
limit kube_objects.py reads the policy *closed* (`too-large`: the pods it selects isolated,
nothing allowed), never ignored, and the rejection says which limit.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PolicyLimits:
    """What one NetworkPolicy may hold before it is read closed as `too-large` (its selected
    pods isolated, nothing allowed). Each (peer, port) pair of a rule is a rule in the chain
    of every local pod the policy selects, except that a rule's ipBlocks without except are
    one hash:net set (one peer, however many blocks), so `pairs` bounds each of those chains.
    The defaults are far above hand-written policies (10,000 ipBlocks hold a cloud provider's
    published ranges) and keep one policy's work to a fraction of a second."""
    rules: int = 500            # ingress + egress rules
    peers: int = 2000           # selector peers (podSelector / namespaceSelector items)
    ip_blocks: int = 10000      # ipBlock peers
    excepts: int = 4000         # except entries over all ipBlocks
    ports: int = 1000           # ports items over all rules
    pairs: int = 10000          # sum over rules of max(1, rendered peers) x max(1, ports)


DEFAULT_LIMITS = PolicyLimits()


def measure(spec: dict, limits: PolicyLimits) -> str:
    """Which limit the spec exceeds ("" none), counted on the raw lists before any parsing."""
    counts = dict.fromkeys(("rules", "peers", "ip_blocks", "excepts", "ports", "pairs"), 0)
    for field, peer_field in (("ingress", "from"), ("egress", "to")):
        rules = spec.get(field)
        for rule in rules if isinstance(rules, list) else ():
            counts["rules"] += 1
            if not isinstance(rule, dict):
                continue
            peers, ports = rule.get(peer_field), rule.get("ports")
            peers = peers if isinstance(peers, list) else []
            ports = ports if isinstance(ports, list) else []
            counts["ports"] += len(ports)
            rendered = plain = 0            # peers rendered one by one; blocks grouped in a set
            for item in peers:
                block = item.get("ipBlock") if isinstance(item, dict) else None
                if not isinstance(block, dict):
                    counts["peers"] += 1
                    rendered += 1
                    continue
                counts["ip_blocks"] += 1
                excepts = block.get("except")
                counts["excepts"] += len(excepts) if isinstance(excepts, list) else 0
                if excepts:
                    rendered += 1
                else:
                    plain += 1
            rendered += min(plain, 1)
            counts["pairs"] += max(1, rendered) * max(1, len(ports))
    over = [f"{count} {name.replace('_', ' ')} (limit {getattr(limits, name)})"
            for name, count in counts.items() if count > getattr(limits, name)]
    return ", ".join(over)
