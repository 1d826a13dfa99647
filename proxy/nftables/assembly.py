"""The service proxy's table put together from its service ports, and kept up to date port by port.

`Assembly` holds every rendered port's contribution (render.py's `PortObjects`); `table()` is
the whole `model.Table` a full sync hands to `changes.table_changes`. A partial sync never
builds or diffs the whole table: `changed_ports` replaces the changed ports' contributions and
fills a `changes.Changes` with what that moved (their elements, the balancing chains they start
or stop needing, their own affinity chains and sets), so its cost follows the changed ports.

An element two ports both name (the same address and port: a clash) takes the value of the
port first in name order.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping

from netagent.kernel.nftables.changes import Changes
from netagent.kernel.nftables.model import Chain, Element, Map, Rule, Set, Table
from proxy.model import NodeContext, ServicePortName
from proxy.nftables import names as N
from proxy.nftables.render import BASE_CHAINS, Key, NftProxySettings, PortObjects, count_chain_rules, fixed_chains


_Owned = tuple[ServicePortName, Element] | dict[ServicePortName, Element]   # one owner, or a clash's owners


class Assembly:
    """Service ports' objects put together, kept up to date port by port. Elements are held
    per holder by key, each with its one owning port (`(name, element)`), or in a clash the
    owners' elements by name: at 10,000 Services that is 132,000 keys, so no dict or
    (holder, key) pair is kept per element."""

    def __init__(self, node: NodeContext, settings: NftProxySettings) -> None:
        self.node, self.settings = node, settings
        self.ports: dict[ServicePortName, PortObjects] = {}
        self._held: dict[str, dict[Key, _Owned]] = {}
        self._chain_users: dict[str, set[ServicePortName]] = {}
        self._port_rules = 0    # rules of the ports' own chains (affinity), kept as ports come and go

    def put(self, port: PortObjects | None, name: ServicePortName) -> None:
        """Replace `name`'s contribution with `port` (None: remove it)."""
        old = self.ports.pop(name, None)
        if old is not None:
            self._port_rules -= sum(len(chain.rules) for chain in old.chains)
            for holder, elements in old.elements:
                held = self._held[holder]
                for element in elements:
                    owned = held[element.key]
                    if owned.__class__ is tuple:
                        del held[element.key]
                        continue
                    assert isinstance(owned, dict)
                    del owned[name]
                    if len(owned) == 1:
                        held[element.key] = next(iter(owned.items()))
            for chain in old.count_chains:
                users = self._chain_users[chain]
                users.discard(name)
                if not users:
                    del self._chain_users[chain]
        if port is not None:
            self.ports[name] = port
            self._port_rules += sum(len(chain.rules) for chain in port.chains)
            for holder, elements in port.elements:
                held = self._held.setdefault(holder, {})
                for element in elements:
                    owned = held.setdefault(element.key, (name, element))
                    if owned.__class__ is tuple and owned[0] is not name and owned[0] != name:
                        first, value = owned
                        held[element.key] = {first: value, name: element}
                    elif owned.__class__ is dict:
                        assert isinstance(owned, dict)
                        owned[name] = element
            for chain in port.count_chains:
                self._chain_users.setdefault(chain, set()).add(name)

    def value(self, holder: str, key: Key) -> Element | None:
        owned = self._held.get(holder, {}).get(key)
        return None if owned is None else _first(owned)

    def count_chains(self) -> set[str]:
        return set(self._chain_users)

    def size(self) -> int:
        """Elements plus rules (`BackendSyncReport.rules`), without building the table or
        walking every port (a partial sync asks for it)."""
        rules = sum(len(r) for r in fixed_chains(self.node, self.settings).values())
        rules += sum(len(count_chain_rules(chain, self.node, self.settings)) for chain in self._chain_users)
        return sum(map(len, self._held.values())) + rules + self._port_rules

    def table(self) -> Table:
        """The whole table: the fixed maps and sets with every port's elements (in port order),
        the ports' own sets, the hooked and fixed chains, the balancing chains in use and the
        ports' own chains."""
        spell = self.settings.spelling
        sets: list[Set | Map] = [
            dataclasses.replace(holder, elements=tuple([owned[1] if owned.__class__ is tuple else _first(owned)
                                                        for owned in self._held.get(holder.name, {}).values()]))
            for holder in spell.holders]
        own_sets = {entry.name: entry for port in self.ports.values() for entry in port.sets}
        sets += [own_sets[name] for name in sorted(own_sets)]
        own_chains = {chain.name: chain for port in self.ports.values() for chain in port.chains}
        chains = [Chain(name, rules, BASE_CHAINS.get(name))
                  for name, rules in fixed_chains(self.node, self.settings).items()]
        chains += [Chain(name, count_chain_rules(name, self.node, self.settings)) for name in sorted(self._chain_users)]
        chains += [own_chains[name] for name in sorted(own_chains)]
        return Table(spell.ip, N.TABLE, tuple(chains), tuple(sets))


def _first(owned: _Owned) -> Element:
    """The element of the one owner, or of the owner first in name order (a clash)."""
    if owned.__class__ is tuple:
        return owned[1]
    assert isinstance(owned, dict)
    return owned[min(owned)]


def assemble(ports: Iterable[PortObjects], *, node: NodeContext, settings: NftProxySettings) -> Assembly:
    assembly = Assembly(node, settings)
    for port in ports:
        assembly.put(port, port.name)
    return assembly


def changed_ports(assembly: Assembly, renders: Mapping[ServicePortName, tuple[PortObjects | None, PortObjects | None]],
                  changes: Changes) -> None:
    """Put each changed port's new contribution (`renders`: name -> (old, new), None for none)
    into `assembly`, and into `changes` what that changed in the table."""
    chains_before = assembly.count_chains()
    keys = {(holder, element.key) for old, new in renders.values() for port in (old, new) if port is not None
            for holder, elements in port.elements for element in elements}
    before = {key: assembly.value(*key) for key in keys}   # every key, before any port changes
    for name, (old, new) in renders.items():
        assembly.put(new, name)
        _own_objects(changes, old, new)
    for key in keys:
        after = assembly.value(*key)
        if after == before[key]:
            continue
        holder, element_key = key
        if before[key] is not None:
            changes.delete_element(holder, element_key)
        if after is not None:
            changes.add_element(holder, after)
    chains_after = assembly.count_chains()
    for chain in chains_after - chains_before:
        changes.add_chains[chain] = None
        changes.rules[chain] = count_chain_rules(chain, assembly.node, assembly.settings)
    for chain in chains_before - chains_after:
        changes.flush.add(chain)
        changes.delete_chains.add(chain)


def _own_objects(changes: Changes, old: PortObjects | None, new: PortObjects | None) -> None:
    """A changed port's own chains and sets (affinity): added, rewritten or deleted; a chain
    whose rules use a set declared again (another timeout) is rewritten."""
    old_chains = {chain.name: chain.rules for chain in old.chains} if old else {}
    new_chains = {chain.name: chain.rules for chain in new.chains} if new else {}
    old_sets = {entry.name: entry for entry in old.sets} if old else {}
    new_sets = {entry.name: entry for entry in new.sets} if new else {}
    recreated = {name for name in old_sets.keys() & new_sets.keys() if old_sets[name] != new_sets[name]}
    for chain, rules in new_chains.items():
        if chain not in old_chains:
            changes.add_chains[chain] = None
            changes.rules[chain] = rules
        elif old_chains[chain] != rules or _uses(rules, recreated):
            changes.rewrite(chain, rules)
    for chain in old_chains.keys() - new_chains.keys():
        changes.flush.add(chain)
        changes.delete_chains.add(chain)
    for name in (old_sets.keys() - new_sets.keys()) | recreated:
        changes.delete_sets[name] = "set"
    for name in (new_sets.keys() - old_sets.keys()) | recreated:
        changes.add_sets[name] = new_sets[name]


def _uses(rules: tuple[Rule, ...], names: set[str]) -> bool:
    return any(name in rule.sets for rule in rules for name in names)
