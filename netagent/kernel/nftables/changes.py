"""The one differ of our nftables tables, and the one batch that writes a difference.

A component that keeps a large table (the service proxy's, the policy's) does not rewrite it
on every sync: it writes what changed, in one transaction. `Changes` is that difference in
the model's values (`model.py`): chains to flush, add, fill or delete, sets and maps to add or
delete, elements (keys as tuples of parts) to delete and add; `Changes.text` renders it in the
one order in which every name exists when used and nothing is deleted while referenced:

  1. chains to rewrite or delete are flushed (their rules reference nothing after this),
  2. stale and changed elements deleted (no verdict names a chain about to go),
  3. stale chains, then stale sets and maps, deleted,
  4. new sets and maps, then new chains, then the rules of new and rewritten chains,
  5. new and changed elements added (a verdict may name a chain added in 4).

Deleting chains in any order after the flush was measured to work (nft 1.0.6: a flushed
chain no longer holds references in the same transaction).

`Changes.apply(nft)` writes it: a change of elements only as one `Nft.apply_elements`
(netlink messages on the real runner), a table the kernel lacks as its skeleton and then its
elements (see `apply`), anything else as the one text batch.

`table_changes(wanted, held)` is the differ: `held` is the table read back from the kernel
(`tables.read_table`: a full sync, which adopts a predecessor's table and repairs drift) or
the table this process last applied (a partial sync); both are `model.Table`s. Rules are
compared by their comments (each carries the digest of its statements, `model.digest_comment`),
elements by their canonical spelling (`tables.canonical_part`) and comment. What cannot be
changed in place (a base chain's hook, type or priority; a table that is missing; an object
read back whose name or element our text gates refuse to write again) makes the whole table
rebuilt in the same transaction (`Changes.rebuild`: `model.render_table`). A set or map whose
type or flags changed is deleted and added again, and every kept chain whose rules reference
it (`Rule.sets`) rewritten.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

from netagent.kernel.nftables import text
from netagent.kernel.nftables.model import (BaseChain, Element, ElementWrite, Map, Rule, Set, Table, element_lines,
                                            render_delete, render_table, set_spec)
from netagent.kernel.nftables.runner import Nft
from netagent.kernel.nftables.tables import canonical_part, dynamic, shape

Key = tuple[str, ...]


@dataclass
class Changes:
    """What one transaction changes in the table `family name` (empty: nothing to write)."""
    family: str
    table: str
    rebuild: Table | None = None   # the whole table, written over whatever the kernel holds
    flush: set[str] = field(default_factory=set)
    delete_elements: dict[str, set[Key]] = field(default_factory=dict)
    delete_chains: set[str] = field(default_factory=set)
    delete_sets: dict[str, str] = field(default_factory=dict)        # name -> "set" or "map"
    add_sets: dict[str, Set | Map] = field(default_factory=dict)   # declarations; elements below
    add_chains: dict[str, BaseChain | None] = field(default_factory=dict)
    rules: dict[str, tuple[Rule, ...]] = field(default_factory=dict)
    add_elements: dict[str, dict[Key, Element]] = field(default_factory=dict)
    declared: dict[str, Set | Map] = field(default_factory=dict)   # holders' declarations (element writes)
    missing: bool = False          # `rebuild` of a table the kernel does not hold

    def __bool__(self) -> bool:
        return bool(self.rebuild or self.flush or any(self.delete_elements.values()) or self.delete_chains
                    or self.delete_sets or self.add_sets or self.add_chains or self.rules
                    or any(self.add_elements.values()))

    @property
    def writes(self) -> int:
        """Elements, rules, chains and sets written or removed: the size of the transaction."""
        if self.rebuild is not None:
            table = self.rebuild
            return (len(table.chains) + len(table.sets) + sum(len(c.rules) for c in table.chains)
                    + sum(len(s.elements) for s in table.sets))
        return (sum(map(len, self.delete_elements.values())) + sum(map(len, self.add_elements.values()))
                + sum(map(len, self.rules.values())) + len(self.delete_chains) + len(self.add_chains)
                + len(self.delete_sets) + len(self.add_sets) + len(self.flush))

    def delete_element(self, holder: str, key: Key) -> None:
        self.delete_elements.setdefault(holder, set()).add(key)

    def add_element(self, holder: str, element: Element) -> None:
        self.add_elements.setdefault(holder, {})[element.key] = element

    def rewrite(self, chain: str, rules: tuple[Rule, ...]) -> None:
        """Flush a kept chain and write `rules` into it."""
        self.flush.add(chain)
        self.rules[chain] = rules

    def text(self) -> str:
        """The batch, in the order of the module docstring ("" when there is nothing to do)."""
        if self.rebuild is not None:
            return render_table(self.rebuild)
        where = f"{self.family} {text.name(self.table)}"
        out = [f"flush chain {where} {text.name(chain)}" for chain in sorted(self.flush)]
        out += element_lines("delete", where, {holder: [text.concat(key) for key in sorted(keys)]
                                               for holder, keys in self.delete_elements.items() if keys})
        out.extend(f"delete chain {where} {text.name(chain)}" for chain in sorted(self.delete_chains))
        out.extend(f"delete {kind} {where} {text.name(name)}" for name, kind in sorted(self.delete_sets.items()))
        out.extend(f"add {'map' if isinstance(entry, Map) else 'set'} {where} {text.name(name)} "
                   f"{{ {set_spec(entry)} }}" for name, entry in sorted(self.add_sets.items()))
        for chain, base in sorted(self.add_chains.items()):
            out.append(f"add chain {where} {text.name(chain)}" + ("" if base is None else f" {{ {base.declaration} }}"))
        for chain, rules in sorted(self.rules.items()):
            out.extend(f"add rule {where} {text.name(chain)} {rule.text}" for rule in rules)
        out += element_lines("add", where, {holder: [element.render() for _, element in sorted(elements.items())]
                                            for holder, elements in self.add_elements.items() if elements})
        return "\n".join(out) + "\n" if out else ""

    def element_write(self) -> ElementWrite | None:
        """The change as an `ElementWrite` when it changes elements only (None otherwise)."""
        if self.rebuild is not None or self.flush or self.delete_chains or self.delete_sets or self.add_sets \
                or self.add_chains or self.rules:
            return None
        return ElementWrite(self.family, self.table, self.declared,
                            {holder: tuple(sorted(keys)) for holder, keys in self.delete_elements.items() if keys},
                            {holder: tuple(element for _, element in sorted(elements.items()))
                             for holder, elements in self.add_elements.items() if elements})

    def apply(self, nft: Nft) -> int:
        """Write the change; how many transactions that took (0: nothing to write).

        Elements only: one `Nft.apply_elements` (netlink messages on the real runner). A table
        the kernel does not hold, rebuilt, on a runner that writes elements natively: its
        skeleton (chains, rules, empty sets) as text, then its elements, two transactions; the
        table did not exist, so no packet met a half-written one, and a refused element write
        deletes the skeleton again (nothing changed). Anything else: one text batch."""
        rebuild = self.rebuild
        if rebuild is not None and self.missing and nft.native_elements and any(s.elements for s in rebuild.sets):
            nft.apply(render_table(replace(rebuild, sets=tuple(replace(s, elements=()) for s in rebuild.sets))))
            try:
                nft.apply_elements(ElementWrite(rebuild.family, rebuild.name, {s.name: s for s in rebuild.sets}, {},
                                                {s.name: s.elements for s in rebuild.sets if s.elements}))
            except BaseException:
                nft.apply(render_delete(rebuild.family, rebuild.name))
                raise
            return 2
        write = self.element_write()
        if write is not None:
            if not len(write):
                return 0
            nft.apply_elements(write)
            return 1
        batch = self.text()
        if batch:
            nft.apply(batch)
            return 1
        return 0


def table_changes(wanted: Table, held: Table | None, *, read_back: bool = True) -> Changes:
    """What makes the table that reads back as `held` (None: missing) hold exactly `wanted`.
    `read_back`: `held` came from the kernel, so its names and keys are checked before they
    are written again; False for the table this process applied last (rendered here)."""
    changes = Changes(wanted.family, wanted.name, declared={entry.name: entry for entry in wanted.sets})
    if held is None or not _adoptable(wanted, held, read_back=read_back):
        changes.rebuild, changes.missing = wanted, held is None
        return changes
    try:
        _in_place(changes, wanted, held, read_back=read_back)
    except text.UnsafeNftText:   # a stale element read back whose key our gates cannot write to delete it
        return Changes(wanted.family, wanted.name, rebuild=wanted)
    return changes


def _in_place(changes: Changes, wanted: Table, held: Table, *, read_back: bool) -> None:
    recreated: set[str] = set()
    for entry in wanted.sets:
        found = held.set(entry.name)
        if found is entry or (not read_back and found == entry):
            continue             # unchanged since the last apply (a renderer's cached value): nothing to compare
        if found is None or shape(found) != shape(entry):
            if found is not None:
                recreated.add(entry.name)
                changes.delete_sets[entry.name] = _kind(found)
            changes.add_sets[entry.name] = replace(entry, elements=())
            for element in entry.elements:
                changes.add_element(entry.name, element)
            continue
        if not dynamic(entry):
            _element_changes(changes, found, entry, read_back=read_back)
    for entry in held.sets:
        if wanted.set(entry.name) is None:
            changes.delete_sets[entry.name] = _kind(entry)
    for chain in wanted.chains:
        held_chain = held.chain(chain.name)
        if held_chain is None:
            changes.add_chains[chain.name] = chain.base
            changes.rules[chain.name] = chain.rules
        elif (held_chain.rules is not chain.rules and _comments(held_chain.rules) != _comments(chain.rules)
              or (recreated and any(name in recreated for rule in chain.rules for name in rule.sets))):
            changes.rewrite(chain.name, chain.rules)
    for chain in held.chains:
        if wanted.chain(chain.name) is None:
            changes.flush.add(chain.name)
            changes.delete_chains.add(chain.name)


def _adoptable(wanted: Table, held: Table, *, read_back: bool) -> bool:
    """Whether `held` can be changed in place: every base chain in both has the spec wanted,
    and (`read_back`) every name read back can be written again through `text`'s gates (an
    element key only needs to be when the element is deleted: `_element_changes`)."""
    for chain in wanted.chains:
        found = held.chain(chain.name)
        if found is not None and _spec(found.base) != _spec(chain.base):
            return False
    if not read_back:
        return True
    try:
        for name in [*(c.name for c in held.chains), *(s.name for s in held.sets)]:
            text.name(name)
    except text.UnsafeNftText:
        return False
    return True


def _spec(base: BaseChain | None) -> dict[str, object] | None:
    return None if base is None else base.spec()


def written(entry: Set | Map, key: Key) -> Key:
    """A key read back, spelt again through `text`'s gates by its datatype (so it can be
    deleted); UnsafeNftText when one of its parts cannot be."""
    if len(key) != len(entry.key_type):
        raise text.UnsafeNftText(f"{entry.name}: key {key} does not fit {entry.key_type}")
    return tuple(_part(datatype, part, interval="interval" in entry.flags) for datatype, part in zip(entry.key_type, key))


def _part(datatype: str, part: str, *, interval: bool) -> str:
    if datatype in ("ipv4_addr", "ipv6_addr"):
        return text.network(part) if interval or "/" in part or "-" in part else text.address(part)
    if datatype == "ifname":
        return text.interface(part[1:-1] if part.startswith('"') else part)
    if datatype == "inet_proto":
        return text.protocol(part)
    if datatype in ("inet_service", "mark", "integer"):
        try:
            return text.number(int(part, 0))
        except ValueError as exc:
            raise text.UnsafeNftText(f"{datatype} {part!r} is not a number") from exc
    raise text.UnsafeNftText(f"no gate spells a {datatype} read back")


def _element_changes(changes: Changes, held: Set | Map, wanted: Set | Map, *, read_back: bool) -> None:
    """Elements compared whole as spelt first (the common case: the renderer writes what the
    kernel lists; a set difference at C speed), and only those that differ matched again by
    canonical key (`canonical_part`): an element spelt apart is kept, one whose value or comment
    changed is replaced. A stale element read back is deleted under its key spelt again through
    the gates (`written`)."""
    wanted_elements = set(wanted.elements)
    if len(held.elements) == len(wanted_elements) and wanted_elements.issuperset(held.elements):
        return   # in agreement (the kernel lists each element once): one lookup per element
    held_elements = set(held.elements)
    stale, new = held_elements - wanted_elements, wanted_elements - held_elements
    by_canonical = {_canonical_key(element.key): element for element in stale}
    for element in new:
        old = by_canonical.pop(_canonical_key(element.key), None)
        if old is not None and _same_value(old, element):
            continue
        if old is not None:
            changes.delete_element(held.name, element.key)
        changes.add_element(held.name, element)
    for element in by_canonical.values():
        changes.delete_element(held.name, written(held, element.key) if read_back else element.key)


def _same_value(old: Element, new: Element) -> bool:
    return _canonical_value(old) == _canonical_value(new)


def _canonical_key(key: Key) -> Key:
    return tuple(canonical_part(part) for part in key)


def _canonical_value(element: Element) -> tuple[str | None, str | None]:
    return (None if element.value is None else canonical_part(element.value), element.comment)


def _comments(rules: tuple[Rule, ...]) -> list[str | None]:
    return [rule.comment for rule in rules]


def _kind(entry: Set | Map) -> str:
    return "map" if isinstance(entry, Map) else "set"

