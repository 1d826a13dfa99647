"""Making the `ip netagent-policy` table hold an `NftWanted` (render_nft.py): the nft
`PolicyDataplane`, with the iptables programmer's contract (dataplane.py).

Every write is ONE nft transaction (`Nft.apply`): the kernel commits all of it or nothing, and
packets see the table before or after, never between. So no order inside it can open a pod; the
text is still ordered so each command finds what it names: sets and maps created, chains added
or flushed and refilled, map elements deleted and added (the new ones jump to chains that now
exist), then chains and sets nothing refers to any more deleted.

- A PARTIAL sync compares with what this process last applied and writes only changed set and
  map elements and changed chains (a label change: set elements only).
- A FULL sync reads the table back (`list_table`, libnftables JSON) and writes the difference,
  so a restarted agent adopts its predecessor's table with zero writes and drift is repaired:
  rules are compared by their comments (each carries the digest of its rule) and verdicts,
  sets and maps by their elements (interval sets as collapsed networks), KNOWN by element and
  comment. What cannot be repaired in place (the base chain's hook or priority, a set's or
  map's type, an object the renderer never names) rebuilds the table: `delete table` and the
  whole table in the same transaction, atomic like any other.
- After any failure the applied record is dropped, so the next sync (FULL, the runner's rule)
  reads the table again.
"""
from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from netagent.kernel.nftables.runner import Nft
from netagent.kernel.nftables import text as nft_text
from netagent.policy.dataplane import ApplyReport, PolicyDataplane
from netagent.policy.readback import KernelPolicy
from netagent.policy.readback_nft import element_text, ipset_members, parse_nft_policy, verdict_of
from netagent.policy.render import RenderSettings
from netagent.policy.render_nft import (
    BASE_CHAIN,
    EGRESS_MAP,
    INGRESS_MAP,
    IPV4,
    KNOWN_SET,
    TABLE,
    Family,
    NftRule,
    NftWanted,
    collapsed,
    element_nft,
    render_nft,
    render_nft_with_pod,
    render_nft_without_pod,
)
from netagent.policy.pod_plan import PodAdded, PodRemoved
from netagent.policy.semantics import NodePlan, PodPlan

log = logging.getLogger("netagent.policy")

Rules = tuple[tuple[str, str], ...]         # (comment, verdict) per rule: what is compared
SetShape = tuple[str, bool]                 # (type, interval)


@dataclass
class _Held:
    """The table as comparable values (from the kernel, or from what was last applied)."""
    exists: bool = False
    hook: tuple | None = None                                   # (type, hook, priority, policy) of the base chain
    base: Rules | None = None
    chains: dict[str, Rules] = field(default_factory=dict)      # pod chains
    sets: dict[str, tuple[SetShape, frozenset[str]]] = field(default_factory=dict)
    maps: dict[str, tuple[str, dict[str, str]]] = field(default_factory=dict)   # name -> (key type, key -> chain)
    known: dict[str, str] | None = None                         # address -> comment; None: no KNOWN set
    foreign: list[str] = field(default_factory=list)            # objects the renderer never names


@functools.lru_cache(maxsize=16384)
def _rules(rules: tuple[NftRule, ...]) -> Rules:
    return tuple((rule.comment, rule.verdict) for rule in rules)


def _normalised(shape: SetShape, elements: list[Any]) -> frozenset[str]:
    """Listed elements as render_nft.py spells them (interval sets: collapsed networks)."""
    if shape[1]:
        return collapsed(set(ipset_members(elements, interval=True)))
    return frozenset(element_text(element) for element in elements)


def _held_from(wanted: NftWanted) -> _Held:
    return _Held(True, _hook(wanted), _rules(wanted.base), {name: _rules(rules) for name, rules in wanted.chains.items()},
                 {name: ((spec.type, spec.interval), spec.elements) for name, spec in wanted.sets.items()},
                 {EGRESS_MAP: (wanted.key_type, dict(wanted.egress)), INGRESS_MAP: (wanted.key_type, dict(wanted.ingress))},
                 dict(wanted.known))


def _hook(wanted: NftWanted) -> tuple:
    return ("filter", "forward", wanted.hook_priority, "accept")


def _read(objects: list[dict[str, Any]] | None, family: Family) -> _Held:
    """The table as the kernel lists it."""
    held = _Held()
    if objects is None:
        return held
    held.exists = True
    chain_rules: dict[str, list[tuple[str, str]]] = {}
    for obj in objects:
        if "chain" in obj:
            chain = obj["chain"]
            chain_rules.setdefault(chain["name"], [])
            if chain["name"] == BASE_CHAIN:
                held.hook = (chain.get("type"), chain.get("hook"), chain.get("prio"), chain.get("policy"))
        elif "rule" in obj:
            rule = obj["rule"]
            chain_rules.setdefault(rule["chain"], []).append((rule.get("comment", ""), verdict_of(rule)))
        elif "set" in obj:
            spec = obj["set"]
            shape = (_type_text(spec.get("type")), "interval" in (spec.get("flags") or ()))
            if spec["name"] == KNOWN_SET:
                held.known = {element_text(e): _element_comment(e) for e in spec.get("elem") or ()}
                if shape != (family.address_type, False):
                    held.foreign.append(f"set {KNOWN_SET} of another type")
            else:
                held.sets[spec["name"]] = (shape, _normalised(shape, list(spec.get("elem") or ())))
        elif "map" in obj:
            spec = obj["map"]
            if spec.get("map") != "verdict" or spec["name"] not in (EGRESS_MAP, INGRESS_MAP):
                held.foreign.append(f"map {spec['name']}")
                continue
            held.maps[spec["name"]] = (_type_text(spec.get("type")), {
                element_text(key): _jump_target(value) for key, value in (spec.get("elem") or ())})
        elif "table" not in obj:
            held.foreign.append(str(next(iter(obj), "?")))
    if BASE_CHAIN in chain_rules:
        held.base = tuple(chain_rules.pop(BASE_CHAIN))
    held.chains = {name: tuple(rules) for name, rules in chain_rules.items()}
    return held


def _type_text(value: Any) -> str:
    return " . ".join(value) if isinstance(value, list) else str(value)


def _element_comment(element: Any) -> str:
    return element["elem"].get("comment", "") if isinstance(element, dict) and "elem" in element else ""


def _jump_target(verdict: Any) -> str:
    jump = verdict.get("jump") if isinstance(verdict, dict) else None
    return str(jump.get("target", "?")) if isinstance(jump, dict) else "?"


class NftPolicyProgrammer(PolicyDataplane[NftWanted]):
    """Applies wanted states to the policy table through an `Nft` (real or fake)."""

    def __init__(self, nft: Nft, *, family: Family = IPV4) -> None:
        self.nft = nft
        self.family = family
        self._applied: _Held | None = None

    def render(self, plan: NodePlan, *, settings: RenderSettings,
               interface_of: Callable[[PodPlan], str | None]) -> NftWanted:
        return render_nft(plan, settings=settings, interface_of=interface_of, family=self.family)

    def _list(self) -> list[dict[str, Any]] | None:
        return self.nft.list_table(self.family.name, TABLE)

    def read_policy(self) -> KernelPolicy:
        return parse_nft_policy(self._list() or [])[0]

    def read_sets(self) -> dict[str, frozenset[str]]:
        return parse_nft_policy(self._list() or [])[1]

    def apply(self, wanted: NftWanted, *, full: bool) -> ApplyReport:
        try:
            return self._apply(wanted, full=full)
        except BaseException:
            self._applied = None
            raise

    def _apply(self, wanted: NftWanted, *, full: bool) -> ApplyReport:
        current = _read(self._list(), self.family) if full or self._applied is None else self._applied
        target = _held_from(wanted)
        if _must_rebuild(current, target):
            batch = _Batch(self.family)
            if current.exists:
                batch.line(f"delete table {batch.prefix}")
            report = _write(batch, _Held(), wanted, target, rebuilt=current.exists)
        else:
            batch = _Batch(self.family)
            report = _write(batch, current, wanted, target, rebuilt=False)
        if batch.lines:
            self.nft.apply(batch.text())
        self._applied = target
        if report.wrote:
            log.info("network policy (nft): %d chain(s) written, %d removed, %d set(s)/map(s) changed, "
                     "%d destroyed%s", report.chains_written, report.chains_removed, report.sets_changed,
                     report.sets_destroyed, ", base chain repaired" if report.jump_repaired else "")
        return report

    def apply_pod(self, wanted: NftWanted, added: PodAdded, *, settings: RenderSettings,
                  interface_of: Callable[[PodPlan], str | None]) -> tuple[NftWanted, ApplyReport] | None:
        """One new pod in one transaction: its chains, its address into the sets it joined, its
        map entries and its KNOWN entry."""
        if not self._delta_ready():
            return None
        new = render_nft_with_pod(wanted, added, settings=settings, interface_of=interface_of, family=self.family)
        return None if new is None else (new, self._apply_delta(wanted, new))

    def remove_pod(self, wanted: NftWanted, removed: PodRemoved, *,
                   settings: RenderSettings) -> tuple[NftWanted, ApplyReport] | None:
        if not self._delta_ready():
            return None
        new = render_nft_without_pod(wanted, removed)
        return None if new is None else (new, self._apply_delta(wanted, new))

    def _delta_ready(self) -> bool:
        held = self._applied
        return held is not None and held.known is not None and set(held.maps) == {EGRESS_MAP, INGRESS_MAP}

    def _apply_delta(self, wanted: NftWanted, new: NftWanted) -> ApplyReport:
        """What differs between `wanted` (last applied) and `new`, found by identity (the one-pod
        renders share every unchanged value), through `_write` on just those objects: one batch."""
        held = self._applied
        assert held is not None and held.known is not None
        touched = {name for name, spec in new.sets.items() if wanted.sets.get(name) is not spec}
        touched |= {name for name in wanted.sets if name not in new.sets}
        chains = {name for name, rules in new.chains.items() if wanted.chains.get(name) is not rules}
        chains |= {name for name in wanted.chains if name not in new.chains}
        key_type = new.key_type
        keys = {key for side in ((wanted.egress, new.egress), (wanted.ingress, new.ingress)) for key in _differing(*side)}
        addresses = _differing(wanted.known, new.known)

        def part(state: _Held, maps: tuple[dict[str, str], dict[str, str]], known: dict[str, str]) -> _Held:
            return _Held(True, held.hook, held.base, {n: state.chains[n] for n in chains if n in state.chains},
                         {n: state.sets[n] for n in touched if n in state.sets},
                         {EGRESS_MAP: (key_type, {k: v for k, v in maps[0].items() if k in keys}),
                          INGRESS_MAP: (key_type, {k: v for k, v in maps[1].items() if k in keys})},
                         {ip: known[ip] for ip in addresses if ip in known})
        target_all = _Held(True, held.hook, held.base, {n: _rules(new.chains[n]) for n in chains if n in new.chains},
                           {n: ((new.sets[n].type, new.sets[n].interval), new.sets[n].elements)
                            for n in touched if n in new.sets})
        current = part(held, (held.maps[EGRESS_MAP][1], held.maps[INGRESS_MAP][1]), held.known)
        target = part(target_all, (dict(new.egress), dict(new.ingress)), dict(new.known))
        batch = _Batch(self.family)
        report = _write(batch, current, replace(new, chains={n: new.chains[n] for n in chains if n in new.chains}),
                        target, rebuilt=False)
        try:
            if batch.lines:
                self.nft.apply(batch.text())
        except BaseException:
            self._applied = None
            raise
        for name in chains:
            held.chains.pop(name, None)
        held.chains.update(target.chains)
        for name in touched:
            held.sets.pop(name, None)
        held.sets.update(target.sets)
        for name, entries in ((EGRESS_MAP, new.egress), (INGRESS_MAP, new.ingress)):
            if entries is not (wanted.egress if name == EGRESS_MAP else wanted.ingress):
                held.maps[name] = (key_type, dict(entries))
        held.known = dict(new.known)
        return report

    def cleanup(self) -> list[str]:
        """Remove the policy table (everything of the policy engine in nft)."""
        self._applied = None
        if self._list() is None:
            return []
        self.nft.apply(f"delete table {_Batch(self.family).prefix}\n")
        return [f"nft table {self.family.name} {TABLE}"]


def _differing(old: Mapping[str, str], new: Mapping[str, str]) -> set[str]:
    """Keys whose value differs (or that one side lacks); identical mappings cost nothing."""
    if old is new:
        return set()
    return {key for key in old.keys() | new.keys() if old.get(key) != new.get(key)}


def _must_rebuild(current: _Held, target: _Held) -> bool:
    """What cannot be changed in place: the base chain's hook, a set's or map's type, foreign objects."""
    if not current.exists:
        return False
    if current.foreign or (current.hook is not None and current.hook != target.hook):
        return True
    if any(name in target.sets and shape != target.sets[name][0] for name, (shape, _) in current.sets.items()):
        return True
    return any(name in target.maps and key_type != target.maps[name][0]
               for name, (key_type, _) in current.maps.items())


class _Batch:
    def __init__(self, family: Family) -> None:
        self.prefix = f"{family.name} {nft_text.name(TABLE)}"
        self.lines: list[str] = []

    def line(self, text: str) -> None:
        self.lines.append(text)

    def elements(self, verb: str, name: str, items: Iterable[str]) -> None:
        items = sorted(items)
        for start in range(0, len(items), 4096):
            self.lines.append(f"{verb} element {self.prefix} {nft_text.name(name)} "
                              f"{nft_text.element_block(items[start:start + 4096])}")

    def chain(self, name: str, rules: Iterable[NftRule], *, exists: bool, head: str = "") -> None:
        if not exists:
            self.lines.append(f"add chain {self.prefix} {nft_text.name(name)}" + (f" {{ {head} }}" if head else ""))
        else:
            self.lines.append(f"flush chain {self.prefix} {nft_text.name(name)}")
        self.lines.extend(f"add rule {self.prefix} {name} {rule.text}" for rule in rules)

    def text(self) -> str:
        return "\n".join(self.lines) + "\n"


def _map_key(key_type: str, key: str) -> str:
    return nft_text.interface(key) if key_type == "ifname" else nft_text.address(key)


def _write(batch: _Batch, current: _Held, wanted: NftWanted, target: _Held, *, rebuilt: bool) -> ApplyReport:
    """Append to `batch` what turns `current` into `target`; the report of it."""
    if not current.exists:
        batch.line(f"add table {batch.prefix}")
    sets_changed = 0
    # sets and maps exist before anything names them
    for name, ((type_text, interval), elements) in target.sets.items():
        held = current.sets.get(name)
        if held is None:
            flags = " flags interval;" if interval else ""
            batch.line(f"add set {batch.prefix} {nft_text.name(name)} {{ type {type_text};{flags} }}")
        if held is None or held[1] != elements:
            if held is not None and interval:
                batch.line(f"flush set {batch.prefix} {nft_text.name(name)}")
                removed: frozenset[str] = frozenset()
                added = elements
            else:
                removed, added = (held[1] - elements, elements - held[1]) if held else (frozenset(), elements)
            batch.elements("delete", name, map(element_nft, removed))
            batch.elements("add", name, map(element_nft, added))
            sets_changed += 1
    if current.known is None:
        batch.line(f"add set {batch.prefix} {KNOWN_SET} {{ type {wanted.family.address_type}; }}")
    for name, (key_type, _) in target.maps.items():
        if name not in current.maps:
            batch.line(f"add map {batch.prefix} {nft_text.name(name)} {{ type {key_type} : verdict; }}")
    # chains: pod chains (re)written, then the base chain
    written = 0
    for name, rules in wanted.chains.items():
        if current.chains.get(name) != target.chains[name]:
            batch.chain(name, rules, exists=name in current.chains)
            written += 1
    repaired = current.base != target.base or current.hook is None
    if repaired:
        head = (f"type filter hook forward priority {wanted.hook_priority}; policy accept;"
                if current.hook is None else "")
        batch.chain(BASE_CHAIN, wanted.base, exists=current.hook is not None, head=head)
    # verdict maps and KNOWN: what left or changed out, then what is new in
    for name, (key_type, entries) in target.maps.items():
        held_entries = current.maps.get(name, (key_type, {}))[1]
        gone = [key for key, chain in held_entries.items() if entries.get(key) != chain]
        new = [key for key, chain in entries.items() if held_entries.get(key) != chain]
        batch.elements("delete", name, (_map_key(key_type, key) for key in gone))
        batch.elements("add", name, (nft_text.element(_map_key(key_type, key), nft_text.jump(entries[key]))
                                     for key in new))
        sets_changed += bool(gone or new)
    known = current.known or {}
    target_known = target.known or {}
    gone = [ip for ip, comment in known.items() if target_known.get(ip) != comment]
    new = [ip for ip, comment in target_known.items() if known.get(ip) != comment]
    batch.elements("delete", KNOWN_SET, map(nft_text.address, gone))
    batch.elements("add", KNOWN_SET, (f"{nft_text.address(ip)} comment {nft_text.comment(target_known[ip])}"
                                      for ip in new))
    sets_changed += bool(gone or new) or current.known is None
    # what nothing refers to any more
    stale = sorted(name for name in current.chains if name not in target.chains)
    for name in stale:
        batch.line(f"delete chain {batch.prefix} {nft_text.name(name)}")
    doomed = sorted(name for name in current.sets if name not in target.sets)
    for name in doomed:
        batch.line(f"delete set {batch.prefix} {nft_text.name(name)}")
    return ApplyReport(written, len(stale), sets_changed, len(doomed), repaired and (rebuilt or current.exists))

