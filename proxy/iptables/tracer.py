"""Tracing packets through the iptables proxy's own ruleset: what is proxy-specific about it.

The tracer itself (netfilter's path, matches, jumps, random forks) is generic and lives in
the kernel iptables library (netagent/kernel/iptables/tracer.py), shared with the policy
read-back. What only the service proxy knows is here: a rendered `Ruleset` as the tables the
tracer walks (self-contained, with the built-in chains and the jumps into ours), and the
ipset its rules match (the hairpin set and its members).
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping

from netagent.kernel.iptables.restore_format import Table
from netagent.kernel.iptables.tracer import Outcome, Packet, tables_from_text, trace_packet
from proxy.iptables.render import JumpLines, Ruleset


def ruleset_tables(ruleset: Ruleset) -> dict[str, Table]:
    """The tables a node holding only `ruleset` would have (built-in chains ACCEPT)."""
    return tables_from_text(ruleset.restore_text(jumps=JumpLines.APPEND))


def ruleset_ipsets(ruleset: Ruleset) -> dict[str, frozenset[str]]:
    """The sets `ruleset`'s rules match, with the members the backend would give them."""
    return {ruleset.settings.hairpin_set: ruleset.hairpin_members}


def trace_service_packet(ruleset: Ruleset, packet: Packet, *, local_addresses: Iterable[str],
                         tables: Mapping[str, Table] | None = None,
                         recent: Mapping[str, Iterable[str]] | None = None) -> list[Outcome]:
    """Where `packet` goes on a node holding `ruleset` (or `tables`, e.g. with another FORWARD
    policy); `recent`: the affinity lists that already hold a source."""
    return trace_packet(ruleset_tables(ruleset) if tables is None else tables, packet,
                        local_addresses=local_addresses, ipsets=ruleset_ipsets(ruleset), recent=recent)
