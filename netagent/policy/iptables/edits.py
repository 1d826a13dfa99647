"""The restore input of a PARTIAL apply: each changed chain edited in place (`-D` the rules
that left, `-I`/`-A` the rules that arrived) instead of re-declared and rewritten.

Why. A CNI ADD's one-pod difference is one pod chain (new), one hook in a bucket chain of a
few dozen rules and one entry in a directory chain; rewriting those chains made the restore
input (and, on the nft backend, the kernel's transaction) grow with the pods of a bucket:
about 100 lines and 130 rule deletions and insertions for one new rule at 1,000 pods. Edits
cost the rules that changed. On iptables-legacy the kernel still replaces the whole filter
table per restore (IPT_SO_SET_REPLACE), so there the input only stops growing; the write's
cost is the table's size.

An edit keeps the chain's order exactly as rendered (the FULL apply compares rule lists, so an
appended hook a sorted bucket would put elsewhere would look like drift): rules that stay
keep their relative order, and the new ones are inserted at their final positions in
ascending order. A chain whose kept rules would change order, or that holds a rule twice,
or whose edits would outnumber its rules, is rewritten as before. Rules are deleted by their
spec (as iptables-save prints them, which is what the applied state holds), so a chain edited
by someone else makes the restore fail, and the caller falls back to the FULL apply.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence

from netagent.kernel.iptables.restore_format import RestoreBuilder

Rule = tuple[str, ...]
Rules = tuple[Rule, ...]


def chain_edits(held: Rules, wanted: Rules) -> tuple[list[Rule], list[tuple[int, Rule]]] | None:
    """(rules to delete, (1-based position, rule) to insert in ascending order) that turn `held`
    into `wanted`; None when the chain is better (or only) rewritten."""
    held_set, wanted_set = set(held), set(wanted)
    if len(held_set) != len(held) or len(wanted_set) != len(wanted) or not wanted:
        return None
    gone = [rule for rule in held if rule not in wanted_set]
    if [rule for rule in held if rule in wanted_set] != [rule for rule in wanted if rule in held_set]:
        return None
    arriving = [(index + 1, rule) for index, rule in enumerate(wanted) if rule not in held_set]
    if len(gone) + len(arriving) >= len(wanted):
        return None
    return gone, arriving


def render_edits(table: str, wanted: Mapping[str, Rules], held: Mapping[str, Rules], *,
                 remove: Sequence[str] = ()) -> tuple[RestoreBuilder, int]:
    """Restore input (for --noflush) that makes the chains in `wanted` hold their rules, given
    that they hold `held`'s (a chain missing there is new), and removes `remove`; and how many
    chains it rewrites whole. Every chain written whole is declared before any rule, so jumps to
    new chains resolve; the removed ones go last, once nothing above refers to them."""
    builder = RestoreBuilder()
    edits = {name: (None if name not in held else chain_edits(held[name], rules)) for name, rules in wanted.items()}
    whole = [name for name, edit in edits.items() if edit is None]
    for name in whole:
        builder.declare_chain(table, name)
    for name, rules in wanted.items():
        edit = edits[name]
        if edit is None:
            for spec in rules:
                builder.append(table, name, spec)
            continue
        gone, arriving = edit
        for spec in gone:
            builder.delete(table, name, spec)
        length = len(held[name]) - len(gone)
        for position, spec in arriving:
            if position > length:
                builder.append(table, name, spec)
            else:
                builder.insert(table, name, spec, position=position)
            length += 1
    for name in remove:
        builder.flush_chain(table, name)
    for name in remove:
        builder.delete_chain(table, name)
    return builder, len(whole)
