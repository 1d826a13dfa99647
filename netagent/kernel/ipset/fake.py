"""`FakeIpset`: in-memory sets that refuse what the kernel refuses, beside the `Ipset` interface.

Why stateful rather than a mock. Everything built on `Ipset` (`ensure_set`, `update`,
`sync_set`, `sync_sets`, `delete_owned_sets`, the service proxy's backends) is unit-tested
without root against this, so it keeps real sets and answers like the tool: members are
validated by the shared interface code before `_apply` sees them, `maxelem` is enforced
(a full set stops at the same restore line as the real tool, with the lines before it
applied), and a set in use cannot be destroyed. "In use" is either counted by hand
(`reference`/`release`) or asked of a callable such as `iptables_references(fake_iptables)`,
so a fake iptables' `--match-set` rules hold sets the way the kernel's do.

Each write is recorded in `writes` (an `IpsetWrite` per create, update, swap or destroy), so tests
can assert "no writes" after a sync that should find the kernel in agreement.
`tests/netns/test_ipset_runner.py` checks that it and the real tool agree.
"""
from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING

from netagent.kernel.ipset.model import (
    IpsetError,
    IpsetInfo,
    IpsetSpec,
    IpsetWrite,
    SetContents,
    member_family,
    spec_family,
    require_owned_name,
)
from netagent.kernel.ipset.runner import Ipset

if TYPE_CHECKING:
    from netagent.kernel.iptables.runner import Iptables


@dataclass
class _FakeSet:
    spec: IpsetSpec
    members: set[str] = field(default_factory=set)


class FakeIpset(Ipset):
    """In-memory sets with the real tool's rules (see the module docstring).

    A set is in use when `reference(name)` was called more often than `release(name)`, or
    when `in_use(name)` (optional callable, e.g. `iptables_references(fake_iptables)`) says so.
    """

    def __init__(self, *, in_use: Callable[[str], bool] | None = None) -> None:
        self.sets: dict[str, _FakeSet] = {}
        self.in_use = in_use
        self.writes: list[IpsetWrite] = []
        self._references: Counter[str] = Counter()

    def reference(self, name: str) -> None:
        self._references[name] += 1

    def release(self, name: str) -> None:
        if self._references[name] > 0:
            self._references[name] -= 1

    def _reference_count(self, name: str) -> int:
        return self._references[name] + (1 if self.in_use is not None and self.in_use(name) else 0)

    def list_names(self) -> list[str]:
        return list(self.sets)

    def describe(self, name: str) -> IpsetInfo | None:
        held = self.sets.get(name)
        if held is None:
            return None
        spec = held.spec
        return IpsetInfo(name=name, type=spec.type, family=spec_family(spec),
                         references=self._reference_count(name), entries=len(held.members),
                         max_elements=spec.max_elements if spec.type.is_hash else None)

    def members(self, name: str) -> frozenset[str]:
        if name not in self.sets:
            raise IpsetError(f"ipset save {name}: The set with the given name does not exist")
        return frozenset(self.sets[name].members)

    def destroy(self, name: str) -> None:
        require_owned_name(name)
        if name not in self.sets:
            return
        if self._reference_count(name):
            raise IpsetError(f"ipset destroy {name}: Set cannot be destroyed: it is in use by a kernel component")
        del self.sets[name]
        self.writes.append(IpsetWrite("destroy", name))

    def snapshot(self) -> dict[str, SetContents]:
        return {name: SetContents(name, held.spec.type, spec_family(held.spec), frozenset(held.members))
                for name, held in self.sets.items()}

    def swap(self, first: str, second: str) -> None:
        require_owned_name(first)
        require_owned_name(second)
        for name in (first, second):
            if name not in self.sets:
                raise IpsetError(f"ipset swap {first} {second}: The set with the given name does not exist")
        one, other = self.sets[first].spec, self.sets[second].spec
        if (one.type, spec_family(one)) != (other.type, spec_family(other)):
            raise IpsetError(f"ipset swap {first} {second}: The sets cannot be swapped: their type does not match")
        held = self.sets[first]
        self.sets[first] = _FakeSet(dataclasses.replace(self.sets[second].spec, name=first),
                                    self.sets[second].members)
        self.sets[second] = _FakeSet(dataclasses.replace(held.spec, name=second), held.members)
        self.writes.append(IpsetWrite("swap", first, removed=(second,)))

    def _apply(self, *, create: Sequence[IpsetSpec] = (),
               changes: Mapping[str, tuple[Sequence[str], Sequence[str]]] = MappingProxyType({})) -> None:
        missing = [name for name in changes if name not in self.sets and name not in {c.name for c in create}]
        if missing:
            raise IpsetError(f"ipset restore -exist: {missing[0]}: The set with the given name does not exist")
        line = 0
        for spec in create:
            line += 1
            if spec.name in self.sets:
                raise IpsetError(f"ipset restore -exist: line {line}: Set cannot be created: set with the same "
                                 f"name already exists")
            self.sets[spec.name] = _FakeSet(spec)
            self.writes.append(IpsetWrite("create", spec.name))
        for name, (add, remove) in changes.items():
            held = self.sets[name]
            removed = [member for member in remove if member in held.members]
            held.members.difference_update(removed)
            line += len(remove)
            added: list[str] = []
            for member in add:
                line += 1
                if member in held.members:
                    continue
                if held.spec.type.is_hash and member_family(member) != held.spec.family:
                    self.writes.append(IpsetWrite("update", name, tuple(added), tuple(removed)))
                    raise IpsetError(f"ipset restore -exist: line {line} (add {name} {member}): Syntax error: "
                                     f"member of family {member_family(member)} in a {held.spec.family} set")
                if held.spec.type.is_hash and len(held.members) >= held.spec.max_elements:
                    self.writes.append(IpsetWrite("update", name, tuple(added), tuple(removed)))
                    raise IpsetError(f"ipset restore -exist: line {line} (add {name} {member}): Hash is full, "
                                     f"cannot add more elements")
                held.members.add(member)
                added.append(member)
            self.writes.append(IpsetWrite("update", name, tuple(added), tuple(removed)))


def iptables_references(iptables: Iptables) -> Callable[[str], bool]:
    """A FakeIpset `in_use` callable: does any rule of `iptables` (an `Iptables`, usually
    FakeIptables) match the set with `--match-set NAME`?"""
    def in_use(name: str) -> bool:
        words = iptables.save().split()
        return any(word == "--match-set" and following == name
                   for word, following in zip(words, words[1:]))
    return in_use
