"""`FakeNft`: an in-memory nf_tables that runs the subset of nft text netagent's renderers
write, atomically, refusing what the kernel refuses, and lists tables in libnftables' JSON.

The subset (everything else is refused as a syntax error, so a renderer that strays is
caught in unit tests):
- `add|create|delete|flush table FAMILY NAME`
- `add|create chain FAMILY TABLE NAME [{ type T hook H priority P; [policy accept|drop;] }]`,
  `delete|flush chain FAMILY TABLE NAME`
- `add|create set|map FAMILY TABLE NAME { type A [. B ...] [: V]; | typeof EXPR [. EXPR] [: EXPR];
  [flags f[,g];] [timeout T;] [size N;] [policy P;] [elements = { e, ... }] }`, `delete|flush set|map ...`
- `add|create|delete element FAMILY TABLE NAME { e, ... }` (elements as `text.element`
  writes them; `timeout T` and `comment "c"` after a key)
- `add|insert rule FAMILY TABLE CHAIN <statements> [comment "c"]`,
  `delete rule FAMILY TABLE CHAIN handle N`

What it refuses, as the kernel does (each measured with nft 1.0.6 in a namespace):
a missing table, chain, set or map; `create` of one that exists; `add chain` of an existing
chain with another hook, type or priority (a base chain may change its policy); `add set`
of an existing set with other types or flags; an element not of the set's type, a prefix or
range without `flags interval`, an overlapping interval, an existing key with another value
(`add`) or at all (`create`), a missing element (`delete`), more elements than `size`;
a jump or goto (rule or verdict map) to a missing chain or to a base chain; a rule naming a
missing `@set`; deleting a chain that is the target of a jump/goto (a chain holding rules is deleted with
them), or a set a rule names. A batch applies to a copy and replaces the state only when all of it succeeded.

What it does not model: nft's keywords as names (`add chain ip t fwd` is a syntax error on
the kernel and accepted here: `text.name` is the guard every renderer goes through), rule statements (a rule is kept as its text, comment apart, under
the key `text`, where the kernel lists `expr`: consumers recognise rules by `comment`),
counters, element expiry (`expires`), interval overlap in concatenated keys, `auto-merge`,
the `inet`/`bridge`/`netdev` specifics, and set/element ORDER (the kernel lists elements in
hash order: consumers must not rely on any order, and the fake keeps insertion order).
"""
from __future__ import annotations

import copy
import json
from dataclasses import dataclass, field
from typing import Any

from netagent.kernel.nftables import fake_parse as parse
from netagent.kernel.nftables.fake_parse import NftSyntax
from netagent.kernel.nftables.runner import FAMILIES, Nft, NftError

BASE_HOOKS = ("prerouting", "input", "forward", "output", "postrouting", "ingress", "egress")


@dataclass
class _Chain:
    name: str
    handle: int
    base: dict[str, Any] | None = None         # type, hook, prio, policy
    rules: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class _Set:
    name: str
    handle: int
    is_map: bool
    keys: list[str]
    values: list[str] | None                   # None for a set; ["verdict"] for a vmap
    flags: list[str]
    timeout: int | None = None
    size: int | None = None
    elements: dict[str, tuple[Any, Any, dict[str, Any]]] = field(default_factory=dict)

    @property
    def interval(self) -> bool:
        return "interval" in self.flags


@dataclass
class _Table:
    family: str
    name: str
    handle: int
    next_handle: int = 1
    chains: dict[str, _Chain] = field(default_factory=dict)
    sets: dict[str, _Set] = field(default_factory=dict)

    def take_handle(self) -> int:
        self.next_handle += 1
        return self.next_handle - 1


def _refuse(reason: str, command: list[str]) -> NftError:
    return NftError(f"Error: {reason}\n{' '.join(command)[:200]}")


class FakeNft(Nft):
    """nf_tables in memory (see the module docstring for the subset)."""

    def __init__(self) -> None:
        self._tables: dict[tuple[str, str], _Table] = {}
        self._table_handle = 0
        self.batches: list[str] = []        # every batch applied, for tests that count writes
        self.fail_next: NftError | None = None   # inject one failure into the next apply()

    # -- the seam
    def apply(self, batch: str) -> None:
        if self.fail_next is not None:
            failure, self.fail_next = self.fail_next, None
            raise failure
        saved = (copy.deepcopy(self._tables), self._table_handle)
        try:
            for command in parse.commands(batch):
                self._run(command)
        except NftError:
            self._tables, self._table_handle = saved
            raise
        except (ValueError, KeyError, IndexError) as error:   # a malformed command
            self._tables, self._table_handle = saved
            raise NftSyntax(f"Error: syntax error: {error}") from error
        self.batches.append(batch)

    def list_table(self, family: str, name: str) -> list[dict[str, Any]] | None:
        table = self._tables.get((family, name))
        return None if table is None else _listing(table)

    def tables(self) -> list[tuple[str, str]]:
        return list(self._tables)

    # -- commands
    def _run(self, command: list[str]) -> None:
        if len(command) < 4:
            raise _refuse("syntax error", command)
        verb, kind, family = command[0], command[1], command[2]
        if family not in FAMILIES:
            raise _refuse(f"syntax error, unexpected {family}", command)
        if kind == "table":
            self._table_command(verb, family, command)
            return
        table = self._tables.get((family, command[3]))
        if table is None:
            raise _refuse("No such file or directory", command)
        if len(command) < 5:
            raise _refuse("syntax error", command)
        handler = {"chain": self._chain_command, "set": self._set_command, "map": self._set_command,
                   "element": self._element_command, "rule": self._rule_command}.get(kind)
        if handler is None:
            raise _refuse(f"syntax error, unexpected {kind}", command)
        handler(verb, table, command)

    def _table_command(self, verb: str, family: str, command: list[str]) -> None:
        key = (family, command[3])
        if len(command) != 4:
            raise _refuse("syntax error (a table body is outside the fake's subset)", command)
        if verb in ("add", "create"):
            if key in self._tables:
                if verb == "create":
                    raise _refuse("Could not process rule: File exists", command)
                return
            self._table_handle += 1
            self._tables[key] = _Table(family, command[3], self._table_handle)
        elif verb == "delete":
            if self._tables.pop(key, None) is None:
                raise _refuse("Could not process rule: No such file or directory", command)
        elif verb == "flush":
            table = self._tables.get(key)
            if table is None:
                raise _refuse("Could not process rule: No such file or directory", command)
            for chain in table.chains.values():
                chain.rules.clear()
        else:
            raise _refuse(f"syntax error, unexpected {verb}", command)

    def _chain_command(self, verb: str, table: _Table, command: list[str]) -> None:
        name = command[4]
        chain = table.chains.get(name)
        if verb in ("add", "create"):
            base = self._base_spec(command) if len(command) > 5 else None
            if chain is not None:
                if verb == "create" or (base is not None and chain.base is None):
                    raise _refuse("Could not process rule: File exists", command)
                if base is not None and chain.base is not None:
                    if any(base[k] != chain.base[k] for k in ("type", "hook", "prio")):
                        raise _refuse("Could not process rule: Operation not supported", command)
                    chain.base["policy"] = base["policy"]
                return
            table.chains[name] = _Chain(name, table.take_handle(), base)
            return
        if chain is None:
            raise _refuse("Could not process rule: No such file or directory", command)
        if verb == "flush":
            chain.rules.clear()
        elif verb == "delete":
            if _chain_referenced(table, name, besides=chain):
                raise _refuse("Could not process rule: Device or resource busy", command)
            del table.chains[name]
        else:
            raise _refuse(f"syntax error, unexpected {verb}", command)

    @staticmethod
    def _base_spec(command: list[str]) -> dict[str, Any]:
        body, end = parse.block(command, 5)
        if end != len(command):
            raise _refuse("syntax error after the chain body", command)
        spec: dict[str, Any] = {"policy": "accept"}
        for statement in parse.split_on(body, ";"):
            if not statement:
                continue
            if statement[0] == "type" and len(statement) >= 6 and statement[2] == "hook" \
                    and statement[4] == "priority":
                if statement[1] not in ("filter", "nat", "route") or statement[3] not in BASE_HOOKS:
                    raise _refuse("Could not process rule: Operation not supported", command)
                spec.update(type=statement[1], hook=statement[3], prio=parse.priority(statement[5:]))
            elif statement[0] == "policy" and len(statement) == 2 and statement[1] in ("accept", "drop"):
                spec["policy"] = statement[1]
            else:
                raise _refuse(f"syntax error in chain body: {' '.join(statement)}", command)
        if "hook" not in spec:
            raise _refuse("syntax error: a chain body without type, hook and priority", command)
        return spec

    def _set_command(self, verb: str, table: _Table, command: list[str]) -> None:
        name, is_map = command[4], command[1] == "map"
        found = table.sets.get(name)
        if verb in ("add", "create"):
            command, items = _without_elements(command)
            new = self._set_spec(table, name, command, is_map=is_map)
            if found is not None:
                if verb == "create" or (found.keys, found.values, found.flags, found.is_map) != \
                        (new.keys, new.values, new.flags, new.is_map):
                    raise _refuse("Could not process rule: File exists", command)
                found.size = new.size if new.size is not None else found.size
            else:
                new.handle = table.take_handle()
                table.sets[name] = found = new
            for item in items:          # `elements = { ... }` in the body: added as `add element` adds them
                self._element("add", table, found, item, command)
            return
        if found is None or found.is_map != is_map:
            raise _refuse("Could not process rule: No such file or directory", command)
        if verb == "flush":
            found.elements.clear()
        elif verb == "delete":
            if _set_referenced(table, name):
                raise _refuse("Could not process rule: Device or resource busy", command)
            del table.sets[name]
        else:
            raise _refuse(f"syntax error, unexpected {verb}", command)

    @staticmethod
    def _set_spec(table: _Table, name: str, command: list[str], *, is_map: bool) -> _Set:
        body, end = parse.block(command, 5)
        if end != len(command):
            raise _refuse("syntax error after the set body", command)
        made = _Set(name, 0, is_map, [], None, [])
        for statement in parse.split_on(body, ";"):
            if not statement:
                continue
            word, rest = statement[0], list(statement[1:])
            if word in ("type", "typeof"):
                key_tokens, value_tokens = (rest, None)
                if ":" in rest:
                    at = rest.index(":")
                    key_tokens, value_tokens = rest[:at], rest[at + 1:]
                reader = parse.datatypes if word == "type" else parse.typeof_types
                made.keys = reader(key_tokens)
                if value_tokens is not None:
                    made.values = ["verdict"] if value_tokens == ["verdict"] else reader(value_tokens)
                if word == "type" and "integer" in made.keys:
                    raise _refuse("unqualified type integer specified in set definition", command)
            elif word == "flags":
                made.flags = [flag for part in parse.split_on(rest, ",") for flag in part]
                if any(flag not in ("interval", "timeout", "dynamic", "constant") for flag in made.flags):
                    raise _refuse(f"syntax error, unknown flag in {' '.join(rest)}", command)
            elif word == "timeout" and len(rest) == 1:
                made.timeout = parse.seconds(rest[0])
            elif word == "size" and len(rest) == 1:
                made.size = int(rest[0])
            elif word == "policy" and rest in (["performance"], ["memory"]):
                pass
            else:
                raise _refuse(f"syntax error in set body: {' '.join(statement)}", command)
        if not made.keys or (is_map and made.values is None) or (not is_map and made.values is not None):
            raise _refuse("syntax error: a set needs a type (a map a type with ': data')", command)
        if made.timeout is not None and "timeout" not in made.flags:
            made.flags.append("timeout")
        return made

    def _element_command(self, verb: str, table: _Table, command: list[str]) -> None:
        target = table.sets.get(command[4])
        if target is None:
            raise _refuse("No such file or directory", command)
        body, end = parse.block(command, 5)
        if end != len(command) or not body:
            raise _refuse("syntax error in the element list", command)
        for item in parse.split_on(body, ","):
            self._element(verb, table, target, item, command)

    def _element(self, verb: str, table: _Table, target: _Set, item: list[str], command: list[str]) -> None:
        options: dict[str, Any] = {}
        while len(item) >= 3 and item[-2] in ("timeout", "comment"):
            word, option = item[-2], item[-1]
            options[word] = parse.seconds(option) if word == "timeout" else option.strip('"')
            item = item[:-2]
        value_tokens = None
        if ":" in item:
            at = item.index(":")
            item, value_tokens = item[:at], item[at + 1:]
        key = parse.compound(target.keys, item, interval=target.interval)
        ident = json.dumps(key, sort_keys=True)
        if verb == "delete":
            if ident not in target.elements:
                raise _refuse("element does not exist", command)
            del target.elements[ident]
            return
        if verb not in ("add", "create"):
            raise _refuse(f"syntax error, unexpected {verb}", command)
        if target.values is None:
            if value_tokens is not None:
                raise _refuse("syntax error: a value for a set element", command)
            value: Any = None
        else:
            if value_tokens is None:
                raise _refuse("syntax error: a map element without a value", command)
            if target.values == ["verdict"]:
                value = parse.verdict(value_tokens, lambda chain: _jump_target(table, chain, command))
            else:
                value = parse.compound(target.values, value_tokens, interval=False)
        if options.get("timeout") is not None and "timeout" not in target.flags:
            raise _refuse("Operation not supported (an element timeout on a set without it)", command)
        existing = target.elements.get(ident)
        if existing is not None:
            if verb == "create" or existing[1] != value:
                raise _refuse("Could not process rule: File exists", command)
            return
        if target.interval and len(target.keys) == 1:
            low, high = parse.bounds(key)
            for other, _value, _options in target.elements.values():
                other_low, other_high = parse.bounds(other)
                if low <= other_high and other_low <= high:
                    raise _refuse("interval overlaps with an existing one", command)
        if target.size is not None and len(target.elements) >= target.size:
            raise _refuse("Could not process rule: Too many open files in system", command)
        target.elements[ident] = (key, value, options)

    def _rule_command(self, verb: str, table: _Table, command: list[str]) -> None:
        chain = table.chains.get(command[4])
        if chain is None:
            raise _refuse("Could not process rule: No such file or directory", command)
        statements = command[5:]
        if verb == "delete":
            if len(statements) != 2 or statements[0] != "handle":
                raise _refuse("syntax error: delete rule needs 'handle N'", command)
            handle = int(statements[1])
            kept = [rule for rule in chain.rules if rule["handle"] != handle]
            if len(kept) == len(chain.rules):
                raise _refuse("Could not process rule: No such file or directory", command)
            chain.rules = kept
            return
        if verb not in ("add", "insert") or not statements:
            raise _refuse("syntax error", command)
        comment = None
        if len(statements) >= 2 and statements[-2] == "comment":
            comment = statements[-1].strip('"')
            statements = statements[:-2]
            if len(comment.encode()) > 128:
                raise _refuse("comment too long, 128 characters maximum allowed", command)
        if not statements:
            raise _refuse("syntax error, unexpected comment", command)
        for index, token in enumerate(statements):
            if token in ("jump", "goto") and index + 1 < len(statements):
                _jump_target(table, statements[index + 1], command)
            if token.startswith("@") and token[1:] not in table.sets:
                raise _refuse(f"No such file or directory (set {token[1:]})", command)
        rule: dict[str, Any] = {"handle": table.take_handle(), "text": " ".join(statements)}
        if comment is not None:
            rule["comment"] = comment
        if verb == "add":
            chain.rules.append(rule)
        else:
            chain.rules.insert(0, rule)


def _jump_target(table: _Table, name: str, command: list[str]) -> None:
    chain = table.chains.get(name)
    if chain is None:
        raise _refuse(f"No such file or directory; chain {name} does not exist", command)
    if chain.base is not None:
        raise _refuse("Could not process rule: Operation not supported (a jump to a base chain)", command)


def _targets(rule: dict[str, Any]) -> set[str]:
    tokens = rule["text"].split()
    return {tokens[i + 1] for i, token in enumerate(tokens[:-1]) if token in ("jump", "goto")}


def _chain_referenced(table: _Table, name: str, *, besides: _Chain) -> bool:
    """Is `name` the target of a jump or goto (rules of other chains, verdict maps)?"""
    for chain in table.chains.values():
        if chain is not besides and any(name in _targets(rule) for rule in chain.rules):
            return True
    for found in table.sets.values():
        for _key, value, _options in found.elements.values():
            if isinstance(value, dict) and any(isinstance(v, dict) and v.get("target") == name
                                               for v in value.values()):
                return True
    return False


def _without_elements(command: list[str]) -> tuple[list[str], list[list[str]]]:
    """A set or map declaration without its `elements = { ... }` statement, and those elements."""
    body, end = parse.block(command, 5)
    kept: list[str] = []
    items: list[list[str]] = []
    for statement in parse.split_on(body, ";"):
        if statement[:2] == ["elements", "="]:
            inner, after = parse.block(statement, 2)
            if after != len(statement) or not inner:
                raise _refuse("syntax error in the set's elements", command)
            items += parse.split_on(inner, ",")
        elif statement:
            kept += [*statement, ";"]
    return [*command[:5], "{", *kept, "}", *command[end:]], items


def _set_referenced(table: _Table, name: str) -> bool:
    return any("@" + name in rule["text"].split() for chain in table.chains.values() for rule in chain.rules)


def _listing(table: _Table) -> list[dict[str, Any]]:
    ident = {"family": table.family, "table": table.name}
    found: list[dict[str, Any]] = [{"table": {"family": table.family, "name": table.name,
                                              "handle": table.handle}}]
    for entry in table.sets.values():
        body: dict[str, Any] = {"family": table.family, "name": entry.name, "table": table.name,
                                "type": entry.keys[0] if len(entry.keys) == 1 else list(entry.keys),
                                "handle": entry.handle}
        if entry.values is not None:
            body["map"] = " . ".join(entry.values)
        if entry.size is not None:
            body["size"] = entry.size
        flags = [flag for flag in entry.flags if flag != "dynamic"]
        if flags:
            body["flags"] = flags
        if entry.timeout is not None:
            body["timeout"] = entry.timeout
        elements = [_element_json(entry, key, value, options)
                    for key, value, options in entry.elements.values()]
        if elements:
            body["elem"] = elements
        found.append({"map" if entry.is_map else "set": body})
    for chain in table.chains.values():
        body = {"family": table.family, "table": table.name, "name": chain.name, "handle": chain.handle}
        if chain.base is not None:
            body.update(chain.base)
        found.append({"chain": body})
    for chain in table.chains.values():
        for rule in chain.rules:
            found.append({"rule": {**ident, "chain": chain.name, **copy.deepcopy(rule)}})
    return found


def _element_json(entry: _Set, key: Any, value: Any, options: dict[str, Any]) -> Any:
    shown: Any = copy.deepcopy(key)
    if options or entry.timeout is not None:
        wrapped: dict[str, Any] = {"val": shown}
        if "timeout" in options:
            wrapped["timeout"] = options["timeout"]
        if "comment" in options:
            wrapped["comment"] = options["comment"]
        shown = {"elem": wrapped}
    return shown if entry.values is None else [shown, copy.deepcopy(value)]
