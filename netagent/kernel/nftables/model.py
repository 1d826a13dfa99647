"""The one typed model of an nftables table of ours, and its one renderer and digest.

Every component that owns a table (kernel/owned.py's `NFT_*_TABLE`) builds a `Table` of frozen
values and nothing else; this module turns it into the batch that (re)creates it in one
transaction, and `tables.py` reads a table back from its JSON listing into the same values,
says whether it drifted and writes it. Built on it: masquerade (`noderoutes/masquerade_nft.py`),
the tunnel source filter (`noderoutes/tunnel_filter_nft.py`), pod anti-spoofing's nft flavour
(`policy/antispoof.py`), the policy's table (`policy/nftables/`) and the service proxy's
(`proxy/nftables/`, which also fills `changes.Changes` itself on a partial sync).

- `Table` (family, name, chains, sets and maps), `Chain` (a regular chain, or a base chain
  when it carries a `BaseChain`: type, hook, priority, policy), `Set` and `Map` (key type as a
  tuple of datatypes, concatenations included; flags such as `interval`; a map's value type,
  `verdict` for a verdict map), `Element` (its key parts as a tuple, each already nft text,
  never a joined string; a map element's value), `Rule` (its statements, its comment, and the
  sets and maps it references as a field, checked against the table when rendered).
- Every piece of text comes from `text.py`'s gates: names through `text.name`, comments
  through `text.comment`, elements through `text.concat`/`text.element`/`text.element_block`;
  a rule's statements are built by the component from those gates and `ref()`.
- The digest (`digest_comment`): a rule is recognised when read back by its comment, which
  ends with the first 8 hex digits of the SHA-256 of its statements, so a rule whose text
  changed (another version of netagent) reads back as another rule.
"""
from __future__ import annotations

import functools
import hashlib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import NamedTuple

from netagent.kernel.nftables import text


ELEMENTS_PER_COMMAND = 5000   # elements per `add element` line: libnftables takes any length


class ModelError(text.UnsafeNftText):
    """A table that cannot be rendered as it is (a rule naming a set the table lacks, two
    chains or sets of one name, an element of the wrong arity)."""


@dataclass(frozen=True)
class BaseChain:
    """What makes a chain a base chain: `type nat hook postrouting priority srcnat + 10;
    policy accept;`. `priority` is the number the kernel lists (`prio`); `priority_text` what
    the batch says (`srcnat + 10`, `raw`), the number's spelling when empty."""
    type: str
    hook: str
    priority: int
    priority_text: str = ""
    policy: str = "accept"

    def spec(self) -> dict[str, object]:
        """As the kernel lists it: type, hook, prio, policy."""
        return {"type": self.type, "hook": self.hook, "prio": self.priority, "policy": self.policy}

    @property
    def declaration(self) -> str:
        """`type nat hook postrouting priority srcnat + 10; policy accept;`"""
        return (f"type {self.type} hook {self.hook} priority {self.priority_text or self.priority}; "
                f"policy {self.policy};")


@dataclass(frozen=True)
class Rule:
    """One rule: `statements` (nft text built from `text.py`'s gates and `ref()`), its
    `comment` (the text the kernel will hold, already `text.safe_comment_text`; None for
    none), and `sets`: every set or map whose `@name` the statements use."""
    statements: str
    comment: str | None = None
    sets: tuple[str, ...] = ()

    @property
    def text(self) -> str:
        """The rule as an `add rule` line ends: its statements and its comment."""
        if self.comment is None:
            return self.statements
        return f"{self.statements} comment {text.comment(self.comment)}"


@dataclass(frozen=True)
class Chain:
    name: str
    rules: tuple[Rule, ...] = ()
    base: BaseChain | None = None


class Element(NamedTuple):
    """A set element (`key` only) or a map element (`key : value`). `key` holds one rendered
    part per datatype of the key (`('"na0"', '10.0.0.1')` for `ifname . ipv4_addr`); `value`
    is the rendered value (an address, `goto CHAIN`, `drop`); `comment` the element's comment
    as the kernel will hold it (`text.safe_comment_text`), None for none. A NamedTuple, not a
    frozen dataclass: a service table holds 130,000 of them, made, hashed and compared at C
    speed (measured: half the cost to make, and the differ compares sets of them)."""
    key: tuple[str, ...]
    value: str | None = None
    comment: str | None = None

    def render(self) -> str:
        key = text.concat(self.key)
        if self.comment is not None:
            key += f" comment {text.comment(self.comment)}"
        return text.element(key, self.value)


@dataclass(frozen=True)
class Set:
    """A named set: `key_type` one datatype per key part; `flags` as nft spells them. A set
    with `dynamic` in its flags is the packet path's (`update @set`): its elements are never
    compared, deleted or written by the differ. `timeout` (seconds) and `size`, when given,
    are declared (`timeout 60s; size 65536;`) and compared."""
    name: str
    key_type: tuple[str, ...]
    flags: tuple[str, ...] = ()
    elements: tuple[Element, ...] = ()
    timeout: int | None = None
    size: int | None = None

    @property
    def value_type(self) -> str | None:
        return None


@dataclass(frozen=True)
class Map:
    """A named map: a set whose elements carry a `value_type` value (`verdict`: a vmap).
    `typeof`, when given, is the declaration (`ip daddr . th dport : ip daddr . tcp dport`,
    for a key nft cannot spell by type, such as a `numgen` slot); `key_type` and `value_type`
    then say what the kernel lists for it (`ipv4_addr . inet_service . integer`)."""
    name: str
    key_type: tuple[str, ...]
    value_type: str
    flags: tuple[str, ...] = ()
    elements: tuple[Element, ...] = ()
    typeof: str | None = None


@dataclass(frozen=True)
class Table:
    """A whole table of ours: what the kernel must hold, nothing more."""
    family: str
    name: str
    chains: tuple[Chain, ...] = ()
    sets: tuple[Set | Map, ...] = ()

    @property
    def where(self) -> str:
        return f"{self.family} {text.name(self.name)}"

    def chain(self, name: str) -> Chain | None:
        return self._chains_by_name.get(name)

    def set(self, name: str) -> Set | Map | None:
        return self._sets_by_name.get(name)

    @functools.cached_property
    def _chains_by_name(self) -> dict[str, Chain]:
        """Name -> chain (the first of a name), built once: a table of thousands of pod chains
        is looked up by name once per chain in every diff."""
        found: dict[str, Chain] = {}
        for chain in self.chains:
            found.setdefault(chain.name, chain)
        return found

    @functools.cached_property
    def _sets_by_name(self) -> dict[str, Set | Map]:
        found: dict[str, Set | Map] = {}
        for entry in self.sets:
            found.setdefault(entry.name, entry)
        return found


@dataclass(frozen=True)
class ElementWrite:
    """A transaction that only deletes and adds elements of existing sets and maps of one
    table (`Nft.apply_elements`): `declared` holds each touched set's or map's declaration
    (its elements unused), which an element writer needs to encode keys and values by type;
    `delete` keys, then `add` elements, per holder. `text()` is the same change as nft text."""
    family: str
    table: str
    declared: dict[str, Set | Map]
    delete: dict[str, tuple[tuple[str, ...], ...]]
    add: dict[str, tuple[Element, ...]]

    def __len__(self) -> int:
        return sum(map(len, self.delete.values())) + sum(map(len, self.add.values()))

    def text(self) -> str:
        where = f"{self.family} {text.name(self.table)}"
        out = element_lines("delete", where, {holder: [text.concat(key) for key in keys]
                                              for holder, keys in self.delete.items()})
        out += element_lines("add", where, {holder: [element.render() for element in elements]
                                            for holder, elements in self.add.items()})
        return "\n".join(out) + "\n" if out else ""


def element_lines(verb: str, where: str, rendered: dict[str, list[str]]) -> list[str]:
    """`add|delete element <where> HOLDER { ... }` lines, ELEMENTS_PER_COMMAND a line, holders
    in name order."""
    out = []
    for holder, items in sorted(rendered.items()):
        for start in range(0, len(items), ELEMENTS_PER_COMMAND):
            out.append(f"{verb} element {where} {text.name(holder)} "
                       f"{text.element_block(items[start:start + ELEMENTS_PER_COMMAND])}")
    return out


def ref(name: str) -> str:
    """A set or map named in a rule's statements: `@NAME` (list it in `Rule.sets` too)."""
    return "@" + text.name(name)


def digest(statements: str) -> str:
    """The first 8 hex digits of the SHA-256 of a rule's statements."""
    return hashlib.sha256(statements.encode()).hexdigest()[:8]


DIGEST_ROOM = len(" [01234567]")


def digest_comment(purpose: str, statements: str) -> str:
    """The comment a rule is recognised by: `netagent: <purpose> [<digest>]`, as the kernel
    will hold it (`text.safe_comment_text`: an adversarial purpose costs its comment only; a
    long one is cut so the digest always survives)."""
    shown = text.safe_comment_text(f"netagent: {purpose}", room=text.COMMENT_MAX_BYTES - DIGEST_ROOM)
    return f"{shown} [{digest(statements)}]"


def purpose_of(comment: str) -> str:
    """A digest comment without `netagent: ` and its digest (what a status command shows)."""
    shown = comment.removeprefix("netagent: ")
    return shown[:-DIGEST_ROOM] if shown.endswith("]") and shown[-DIGEST_ROOM:].startswith(" [") else shown


def digested_rule(statements: str, purpose: str, *, sets: Iterable[str] = ()) -> Rule:
    """A rule whose comment carries the digest of its statements."""
    return Rule(statements, digest_comment(purpose, statements), tuple(sets))


def render_table(table: Table) -> str:
    """One batch that replaces the table with `table` in one transaction: the `add` first
    makes the `delete` succeed when the table is missing, so what the kernel holds after it
    is exactly `table` (conntrack keeps the NAT bindings of existing connections).

    Order, so every name exists before it is used: regular chains declared first (a rule or a
    verdict may jump to them), then each set or map with its elements, then each base chain
    and each chain's rules, then the elements of verdict maps (they name chains)."""
    _check(table)
    where = table.where
    lines = [f"add table {where}", f"delete table {where}", f"add table {where}"]
    lines += [f"add chain {where} {text.name(c.name)}" for c in table.chains if c.base is None]
    verdicts: list[str] = []
    for entry in table.sets:
        lines.append(f"add {_kind(entry)} {where} {text.name(entry.name)} {{ {set_spec(entry)} }}")
        rendered = [e.render() for e in entry.elements]
        for start in range(0, len(rendered), ELEMENTS_PER_COMMAND):
            add = (f"add element {where} {text.name(entry.name)} "
                   f"{text.element_block(rendered[start:start + ELEMENTS_PER_COMMAND])}")
            (verdicts if entry.value_type == "verdict" else lines).append(add)
    for chain in table.chains:
        if chain.base is not None:
            base = chain.base
            lines.append(f"add chain {where} {text.name(chain.name)} {{ {base.declaration} }}")
        lines.extend(f"add rule {where} {chain.name} {rule.text}" for rule in chain.rules)
    return "\n".join(lines + verdicts) + "\n"


def render_delete(family: str, name: str) -> str:
    """The batch that deletes a table (which must exist)."""
    return f"delete table {family} {text.name(name)}\n"


def render_absent(family: str, name: str) -> str:
    """The batch lines that delete a table whether or not it exists (the `add` first), for a
    component whose table moved to another family (anti-spoofing's `inet` and `bridge`)."""
    return f"add table {family} {text.name(name)}\ndelete table {family} {text.name(name)}\n"


def _kind(entry: Set | Map) -> str:
    return "map" if isinstance(entry, Map) else "set"


def set_spec(entry: Set | Map) -> str:
    """The body of a set's or map's declaration: `type ipv4_addr; flags interval;`,
    `typeof ...;`, `flags dynamic,timeout; timeout 60s; size 65536;`."""
    key = " . ".join(entry.key_type)
    if isinstance(entry, Map):
        spec = f"typeof {entry.typeof};" if entry.typeof else f"type {key} : {entry.value_type};"
    else:
        spec = f"type {key};"
    if entry.flags:
        spec += f" flags {','.join(entry.flags)};"
    if isinstance(entry, Set) and entry.timeout is not None:
        spec += f" timeout {text.number(entry.timeout)}s;"
    if isinstance(entry, Set) and entry.size is not None:
        spec += f" size {text.number(entry.size)};"
    return spec


def _check(table: Table) -> None:
    """Refuse a table the kernel would refuse for its shape (before any text is sent)."""
    names = [c.name for c in table.chains]
    set_names = [s.name for s in table.sets]
    for found, what in ((names, "chain"), (set_names, "set or map")):
        if len(set(found)) != len(found):
            raise ModelError(f"table {table.name}: a {what} named twice in {found}")
    for entry in table.sets:
        for element in entry.elements:
            if len(element.key) != len(entry.key_type) or (element.value is None) != isinstance(entry, Set):
                raise ModelError(f"{_kind(entry)} {entry.name}: element {element} does not fit "
                                 f"{' . '.join(entry.key_type)}")
    for chain in table.chains:
        for rule in chain.rules:
            missing = [name for name in rule.sets if name not in set_names]
            if missing:
                raise ModelError(f"chain {chain.name}: a rule references {missing}, not in table {table.name}")
