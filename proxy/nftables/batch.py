"""What one sync writes, and the nft text of it: one batch, one transaction (pure).

`Changes` is the difference between what the kernel holds and what is wanted; both sync
kinds fill it (a full sync from the table read back, `full_changes`; a partial one from the
changed service ports' contributions, in backend.py) and `Changes.text` writes it in the
one order in which every reference is valid at every step of the transaction:

  1. chains to rewrite or delete are flushed (no rule of theirs references anything after),
  2. stale and changed elements deleted (no verdict names a chain about to go),
  3. stale chains deleted, then stale sets (nothing references them any more),
  4. new sets and chains added, then the rules of new and rewritten chains,
  5. new and changed elements added.

A table in a layout this version does not write (a fixed map missing or of another type,
a hooked chain elsewhere) is replaced whole: `delete table` and the whole table, in the same
transaction, so traffic never meets a half-built table.
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from netagent.kernel.families import IpFamily
from netagent.kernel.nftables import text
from proxy.nftables import names as N
from proxy.nftables.readback import TableView
from proxy.nftables.render import BASE_CHAINS, Contents, ElementValue
from proxy.nftables.spelling import spelling

# elements per `add element` command: libnftables takes any length, this keeps each line modest
ELEMENTS_PER_COMMAND = 5000


def rule_digest(rule: str) -> str:
    """The digest comment render.rule appended to a rule's text."""
    return rule.rsplit(' comment "', 1)[1][:-1]


@dataclass
class Changes:
    family: IpFamily = IpFamily.V4
    table: str = N.TABLE
    replace_table: bool = False      # delete it first (a foreign layout)
    create_table: bool = False       # declare the table, the fixed maps and sets, the hooked chains
    flush: set[str] = field(default_factory=set)
    delete_elements: dict[str, set[str]] = field(default_factory=dict)
    delete_chains: set[str] = field(default_factory=set)
    delete_sets: set[str] = field(default_factory=set)
    add_sets: dict[str, str] = field(default_factory=dict)
    add_chains: set[str] = field(default_factory=set)
    rules: dict[str, tuple[str, ...]] = field(default_factory=dict)
    add_elements: dict[str, dict[str, ElementValue]] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.replace_table or self.create_table or self.flush or any(self.delete_elements.values())
                    or self.delete_chains or self.delete_sets or self.add_sets or self.add_chains or self.rules
                    or any(self.add_elements.values()))

    @property
    def writes(self) -> int:
        """Elements, rules, chains and sets written or removed: the size of the transaction."""
        return (sum(map(len, self.delete_elements.values())) + sum(map(len, self.add_elements.values()))
                + sum(map(len, self.rules.values())) + len(self.delete_chains) + len(self.add_chains)
                + len(self.delete_sets) + len(self.add_sets) + len(self.flush))

    def delete_element(self, holder: str, key: str) -> None:
        self.delete_elements.setdefault(holder, set()).add(key)

    def add_element(self, holder: str, key: str, value: ElementValue) -> None:
        self.add_elements.setdefault(holder, {})[key] = value

    def text(self) -> str:
        spell = spelling(self.family)
        where = f"{spell.ip} {text.name(self.table)}"
        out: list[str] = []
        if self.replace_table:
            out.append(f"delete table {where}")
        if self.create_table or self.replace_table:
            out.append(f"add table {where}")
            for holder, declaration in spell.map_declarations.items():
                out.append(f"add map {where} {text.name(holder)} {{ {declaration}; }}")
            for holder, declaration in spell.set_declarations.items():
                out.append(f"add set {where} {text.name(holder)} {{ {declaration}; }}")
            for chain, declaration in BASE_CHAINS.items():
                out.append(f"add chain {where} {text.name(chain)} {{ {declaration}; }}")
        out.extend(f"flush chain {where} {text.name(chain)}" for chain in sorted(self.flush))
        for holder, keys in sorted(self.delete_elements.items()):
            out.extend(f"delete element {where} {text.name(holder)} {text.element_block(chunk)}"
                       for chunk in _chunks(sorted(keys)))
        # affinity role chains reference their endpoint chains: delete those first
        for chain in sorted(self.delete_chains, key=lambda c: (not c.startswith("AFF-"), c)):
            out.append(f"delete chain {where} {text.name(chain)}")
        out.extend(f"delete set {where} {text.name(name)}" for name in sorted(self.delete_sets))
        out.extend(f"add set {where} {text.name(name)} {{ {declaration}; }}"
                   for name, declaration in sorted(self.add_sets.items()))
        out.extend(f"add chain {where} {text.name(chain)}" for chain in sorted(self.add_chains))
        # rules naming other chains (affinity role chains) after those chains' own rules
        for chain, rules in sorted(self.rules.items(), key=lambda item: (item[0].startswith("AFF-"), item[0])):
            out.extend(f"add rule {where} {text.name(chain)} {rule}" for rule in rules)
        for holder, values in sorted(self.add_elements.items()):
            items = [_element(key, value) for key, value in sorted(values.items())]
            out.extend(f"add element {where} {text.name(holder)} {text.element_block(chunk)}"
                       for chunk in _chunks(items))
        return "\n".join(out) + "\n" if out else ""


def _writable(name: str) -> bool:
    try:
        text.name(name)
    except text.UnsafeNftText:
        return False
    return True


def _element(key: str, value: ElementValue) -> str:
    data, comment = value
    keyed = f"{key} comment {text.comment(comment)}" if comment else key
    return text.element(keyed, data)


def _chunks(items: list[str]) -> Iterable[list[str]]:
    for start in range(0, len(items), ELEMENTS_PER_COMMAND):
        yield items[start:start + ELEMENTS_PER_COMMAND]


def everything(desired: Contents, changes: Changes) -> Changes:
    """`changes` filled to write all of `desired` into a table just declared."""
    for chain, rules in desired.chains.items():
        if chain not in BASE_CHAINS:
            changes.add_chains.add(chain)
        changes.rules[chain] = rules
    changes.add_sets.update(desired.sets)
    for holder, held in desired.elements.items():
        for key, value in held.items():
            changes.add_element(holder, key, value)
    return changes


def full_changes(view: TableView | None, desired: Contents, *, family: IpFamily = IpFamily.V4) -> Changes:
    """What makes the table read back as `view` (None: absent) hold exactly `desired`."""
    changes = Changes(family=family)
    if view is None:
        changes.create_table = True
        return everything(desired, changes)
    if not view.skeleton_ok(family) or not all(map(_writable, [*view.chains, *view.sets])):
        # another layout, or an object (added by hand) whose name our text cannot write back to
        # delete it: the whole table is replaced instead, in the same one transaction
        changes.replace_table = True
        return everything(desired, changes)
    for holder, held in desired.elements.items():
        present = view.elements.get(holder, {})
        for key, value in present.items():
            if held.get(key) != value:
                changes.delete_element(holder, key)
        for key, value in held.items():
            if present.get(key) != value:
                changes.add_element(holder, key, value)
    recreated = {name for name, declaration in desired.sets.items()
                 if name in view.sets and view.sets[name] != declaration}
    for name in view.sets:
        if name not in desired.sets or name in recreated:
            changes.delete_sets.add(name)
    for name, declaration in desired.sets.items():
        if name not in view.sets or name in recreated:
            changes.add_sets[name] = declaration
    for chain, rules in desired.chains.items():
        digests = view.chains.get(chain)
        uses_recreated = any(f"@{name} " in rule for rule in rules for name in recreated)
        if digests is None:
            changes.add_chains.add(chain)
            changes.rules[chain] = rules
        elif uses_recreated or digests != tuple(rule_digest(rule) for rule in rules):
            changes.flush.add(chain)
            changes.rules[chain] = rules
    for chain in view.chains:
        if chain not in desired.chains:
            changes.flush.add(chain)
            changes.delete_chains.add(chain)
    # a stale set may be used by a chain that is kept but rewritten: flushed above already
    for name in changes.delete_sets:
        for chain, rules in desired.chains.items():
            if any(f"@{name} " in rule for rule in rules) and chain in view.chains:
                changes.flush.add(chain)
                changes.rules[chain] = rules
    return changes
