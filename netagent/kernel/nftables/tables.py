"""A table of ours read back, compared and kept: the other half of `model.py`.

- `read_table`: an `Nft.list_table` answer (libnftables JSON, real or `FakeNft`'s) back into
  `model.Table` values, enough to compare: base chains' type, hook, priority and policy, rules
  in order by their comment (the kernel lists statements as `expr`, which we never parse: the
  comment's digest, `model.digest_comment`, stands for the statements), sets' and maps' types,
  flags, timeout and size, and elements, each key as its parts, with its comment.
- `drift`: the one differ, one sentence per difference between the wanted table and the
  table read back (empty: in sync). Elements are compared as sets (the kernel lists them in
  hash order) in one canonical spelling (`canonical_part`).
- `ensure_table`, `remove_table`: read, compare, and write only when drifted, in one
  transaction (`model.render_table`); delete the table, quiet when gone.
"""
from __future__ import annotations

import ipaddress
from typing import Any

from netagent.kernel.nftables import listing
from netagent.kernel.nftables.model import BaseChain, Chain, Element, Map, Rule, Set, Table, render_delete, render_table
from netagent.kernel.nftables.runner import Nft


def read_table(family: str, name: str, objects: list[dict[str, Any]] | None) -> Table | None:
    """The table as listed, or None when it is missing."""
    if objects is None:
        return None
    chains = []
    listed_rules = listing.rules_by_chain(objects)
    for chain_name, body in listing.chains(objects).items():
        base = None
        if "hook" in body:
            base = BaseChain(body.get("type", ""), body["hook"], body.get("prio", 0), policy=body.get("policy", "accept"))
        rules = tuple(Rule("", rule.get("comment")) for rule in listed_rules.get(chain_name, ()))
        chains.append(Chain(chain_name, rules, base))
    sets: list[Set | Map] = []
    for set_name, body in listing.sets(objects).items():
        key_type = tuple(body["type"]) if isinstance(body.get("type"), list) else (str(body.get("type")),)
        flags = body.get("flags", ())
        flags = (flags,) if isinstance(flags, str) else tuple(flags)
        elements = _elements(body)
        if "map" in body:
            sets.append(Map(set_name, key_type, str(body["map"]), flags, elements))
        else:
            sets.append(Set(set_name, key_type, flags, elements, body.get("timeout"), body.get("size")))
    return Table(family, name, tuple(chains), tuple(sets))


def shape(entry: Set | Map) -> tuple[object, ...]:
    """What a set's or map's declaration says, as compared with one read back: kind, key and
    value types, flags (`dynamic` apart: libnftables does not list it), timeout and size."""
    return (isinstance(entry, Map), entry.key_type, getattr(entry, "value_type", None),
            frozenset(entry.flags) - {"dynamic"}, getattr(entry, "timeout", None), getattr(entry, "size", None))


def dynamic(entry: Set | Map) -> bool:
    """A set the packet path fills (`update @set`): its elements are not ours to compare."""
    return "dynamic" in entry.flags


def _elements(body: dict[str, Any]) -> tuple[Element, ...]:
    """A set's or map's elements as listed (`listing.commented_elements`, inlined: a table of
    100,000 elements is read back on every full sync)."""
    is_map = "map" in body
    found = []
    for item in body.get("elem", ()):
        key, value = (item[0], item[1]) if is_map else (item, None)
        comment = None
        if key.__class__ is dict and "elem" in key:
            wrapped = key["elem"]
            key = wrapped.get("val")
            comment = None if wrapped.get("comment") is None else str(wrapped["comment"])
        found.append(Element(_parts(key), None if value is None else _text(value), comment))
    return tuple(found)


def _parts(key: Any) -> tuple[str, ...]:
    if key.__class__ is dict and "concat" in key:
        return tuple(part if part.__class__ is str else _text(part) for part in key["concat"])
    return (_text(key),)


def _text(value: Any) -> str:
    """`listing.element_text`, with the common cases first: an address or word, a number, a
    concatenation of those."""
    if value.__class__ is str:
        return value
    if value.__class__ is int:
        return str(value)
    if value.__class__ is dict and "concat" in value:
        return " . ".join(part if part.__class__ is str else _text(part) for part in value["concat"])
    return listing.element_text(value)


def canonical_part(part: str) -> str:
    """One spelling of a key part or value for comparing: quotes off (`"na0"` lists as `na0`),
    a whole-length prefix as its address (the kernel lists `10.0.0.1/32` as `10.0.0.1`)."""
    if len(part) >= 2 and part[0] == part[-1] == '"':
        return part[1:-1]
    if "/" in part:
        try:
            network = ipaddress.ip_network(part, strict=False)
        except ValueError:
            return part
        if network.prefixlen == network.max_prefixlen:
            return str(network.network_address)
    return part


def _canonical(elements: tuple[Element, ...]) -> set[tuple[tuple[str, ...], str | None]]:
    return {(tuple(canonical_part(p) for p in e.key), None if e.value is None else canonical_part(e.value))
            for e in elements}


def _noun(entry: Set | Map) -> str:
    if isinstance(entry, Set) and entry.key_type in (("ipv4_addr",), ("ipv6_addr",)):
        return "networks" if "interval" in entry.flags else "addresses"
    return "elements"


def drift(wanted: Table, held: Table | None) -> list[str]:
    """What differs between `held` (read back) and `wanted`, one sentence per difference."""
    if held is None:
        return [f"table {wanted.family} {wanted.name} missing"]
    problems = []
    for entry in wanted.sets:
        found = held.set(entry.name)
        kind = "map" if isinstance(entry, Map) else "set"
        if found is None or isinstance(found, Map) != isinstance(entry, Map):
            problems.append(f"{kind} {entry.name} missing")
            continue
        if shape(found) != shape(entry):
            problems.append(f"{kind} {entry.name} is not {' . '.join(entry.key_type)} {sorted(entry.flags)}")
        elif not dynamic(entry) and _canonical(found.elements) != _canonical(entry.elements):
            shown = [" . ".join(e.key) for e in entry.elements]
            problems.append(f"{kind} {entry.name} holds other {_noun(entry)} than {shown}")
    for chain in wanted.chains:
        held_chain = held.chain(chain.name)
        if held_chain is None:
            problems.append(f"chain {chain.name} missing")
            continue
        want_spec = None if chain.base is None else chain.base.spec()
        held_spec = None if held_chain.base is None else held_chain.base.spec()
        if held_spec != want_spec:
            problems.append(f"chain {chain.name} is not {want_spec or 'a regular chain'}")
        if [r.comment for r in held_chain.rules] != [r.comment for r in chain.rules]:
            problems.append(f"chain {chain.name}: {len(held_chain.rules)} rule(s) differ from the "
                            f"{len(chain.rules)} wanted")
    extra = sorted({c.name for c in held.chains} - {c.name for c in wanted.chains})
    if extra:
        problems.append(f"chains not ours to keep: {extra}")
    extra_sets = sorted({s.name for s in held.sets} - {s.name for s in wanted.sets})
    if extra_sets:
        problems.append(f"sets or maps not ours to keep: {extra_sets}")
    return problems


def table_drift(nft: Nft, wanted: Table) -> list[str]:
    """`drift` of the table the kernel holds now."""
    return drift(wanted, read_table(wanted.family, wanted.name, nft.list_table(wanted.family, wanted.name)))


def ensure_table(nft: Nft, wanted: Table) -> list[str]:
    """Replace the table in one transaction when it drifted; what drifted (empty: no write)."""
    problems = table_drift(nft, wanted)
    if problems:
        nft.apply(render_table(wanted))
    return problems


def remove_table(nft: Nft, family: str, name: str) -> bool:
    """Delete the table; False (and nothing written) when it is gone already."""
    if nft.list_table(family, name) is None:
        return False
    nft.apply(render_delete(family, name))
    return True
