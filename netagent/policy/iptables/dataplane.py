"""Making the kernel hold a `WantedState`: the only module of the policy engine that writes.

A sync compares the wanted state with what is there and writes only the difference:
- a FULL sync reads the kernel (one iptables-save of filter, one `ipset save`), so a
  restarted agent adopts what its predecessor left with no write at all, and drift (a chain
  edited or flushed by hand, a set member removed, our FORWARD jump moved) is repaired;
- a PARTIAL sync compares with the state this process last applied, reading nothing: by
  identity first, so a CNI ADD's one-pod render (render.py's `render_wanted_with_pod`, which
  shares every unchanged chain and set) costs its own pod's writes and a walk of the names;
  changed chains are edited in place (edits.py), and members joining sets that exist join
  after the chains, with KNOWN's (one ipset exec fewer). A partial write that fails falls
  back at once to the FULL apply, which repairs whatever part of it was written.
The writes, in an order that never opens a pod:
  1. ipsets: create missing sets and change members (one `ipset restore`); addresses leave
     KNOWN here, but none joins it yet;
  2. iptables: changed chains rewritten, chains no longer wanted removed, the FORWARD jump
     (and, with IPVS, the OUTPUT jump) repaired, all in one `iptables-restore --noflush`
     (atomic for the filter table);
  3. KNOWN gains the pods whose chains now exist (a second `ipset restore`, only when needed);
  4. sets no longer referenced are destroyed.
After a failure the applied record is dropped, so the next (FULL, the runner's rule) sync
reads the kernel again.

One dataplane per family (`family`: its `Iptables` is that family's, iptables or ip6tables):
ipset's names are shared by both families, so each owns the policy sets of its own ipset
family only (`family inet` or `inet6`, as the kernel reports them), and its KNOWN set.
"""
from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from netagent.kernel import owned
from netagent.kernel.families import IpFamily
from netagent.kernel.ipset.model import IpsetError, IpsetSpec, IpsetType, SetContents
from netagent.kernel.ipset.runner import Ipset, sync_sets
from netagent.kernel.iptables.restore_format import Table, jump_target
from netagent.kernel.iptables.runner import Iptables, IptablesError, JumpPosition, add_jump_repair, jump_spec
from netagent.policy.dataplane import ApplyReport, PolicyDataplane
from netagent.policy.readback import KernelPolicy
from netagent.policy.iptables.edits import render_edits
from netagent.policy.iptables.readback import parse_kernel_policy
from netagent.policy.iptables.render import (
    JUMP_COMMENT,
    OUTPUT_CHAIN,
    OUTPUT_JUMP_COMMENT,
    OUTPUT_JUMP_MATCH,
    OUTPUT_PARENT,
    PARENT_CHAIN,
    TABLE,
    Rules,
    WantedState,
    render_chains,
    render_wanted,
    render_wanted_with_pod,
    render_wanted_without_pod,
)
from netagent.policy.shared import RenderSettings
from netagent.policy.pod_plan import PodAdded, PodRemoved
from netagent.policy.semantics import NodePlan, PodPlan

log = logging.getLogger("netagent.policy")
KNOWN_SPEC = IpsetSpec(owned.POLICY_KNOWN_SET, IpsetType.HASH_IP, comment="local pods already programmed")
KNOWN_SPECS = {IpFamily.V4: KNOWN_SPEC,
               IpFamily.V6: IpsetSpec(owned.POLICY_KNOWN_SET6, IpsetType.HASH_IP, comment=KNOWN_SPEC.comment,
                                      family=IpFamily.V6.ipset)}


@dataclass
class _Held:
    """The policy chains and sets of this family as the kernel holds them (a FULL apply's read)."""
    chains: dict[str, Rules]
    sets: dict[str, SetContents]


HOOKS = {owned.POLICY_CHAIN: (PARENT_CHAIN, jump_spec(owned.POLICY_CHAIN, comment=JUMP_COMMENT)),
         OUTPUT_CHAIN: (OUTPUT_PARENT, jump_spec(OUTPUT_CHAIN, comment=OUTPUT_JUMP_COMMENT, match=OUTPUT_JUMP_MATCH))}


def _jump_is_first(table: Table, parent: str, spec: tuple[str, ...]) -> bool:
    rules = table.chains[parent].rules if parent in table.chains else []
    jumps = [rule for rule in rules if jump_target(rule) == jump_target(spec)]
    return bool(rules) and rules[0] == spec and len(jumps) == 1


def _jumps_into(table: Table, chains: list[str]) -> list[tuple[str, tuple[str, ...]]]:
    """(built-in chain, rule) of our hook jumps into `chains`."""
    found = []
    for chain in chains:
        parent = HOOKS[chain][0] if chain in HOOKS else None
        if parent is not None and parent in table.chains:
            found += [(parent, rule) for rule in table.chains[parent].rules if jump_target(rule) == chain]
    return found


class IptablesDataplane(PolicyDataplane[WantedState]):
    """Applies wanted states through an `Iptables` and an `Ipset` (real or fake)."""

    def __init__(self, *, iptables: Iptables, ipset: Ipset, family: IpFamily = IpFamily.V4) -> None:
        self.iptables = iptables
        self.ipset = ipset
        self.family = family
        self.known = KNOWN_SPECS[family]
        self._last: WantedState | None = None     # what the last apply left the kernel holding

    def _contents(self, name: str, members: frozenset[str], set_type: IpsetType = IpsetType.HASH_IP) -> SetContents:
        return SetContents(name, set_type, self.family.ipset, members)

    def _our_sets(self) -> dict[str, SetContents]:
        """The policy sets of this family (the other family's dataplane owns the rest)."""
        return {name: contents for name, contents in self.ipset.snapshot().items()
                if name.startswith(owned.POLICY_PREFIX) and contents.family == self.family.ipset}

    def _read_kernel(self) -> tuple[_Held, Table]:
        table = self.iptables.table(TABLE)
        chains = {name: tuple(chain.rules) for name, chain in table.chains.items()
                  if name.startswith(owned.POLICY_PREFIX) and not chain.builtin}
        return _Held(chains, self._our_sets()), table

    def render(self, plan: NodePlan, *, settings: RenderSettings,
               interface_of: Callable[[PodPlan], str | None]) -> WantedState:
        return render_wanted(plan, settings=settings, interface_of=interface_of)

    def read_policy(self) -> KernelPolicy:
        return parse_kernel_policy(self.iptables.save(TABLE, counters=True))

    def read_sets(self) -> dict[str, frozenset[str]]:
        return {name: contents.members for name, contents in self._our_sets().items()}

    def apply(self, wanted: WantedState, *, full: bool) -> ApplyReport:
        try:
            last = self._last
            if full or last is None or _needs_kernel(last, wanted, self.known.name):
                report = self._apply_from_kernel(wanted)
            else:
                try:
                    report = self._apply_difference(last, wanted)
                except (IptablesError, IpsetError) as error:
                    # a write of the difference was refused (a chain edited behind our back, a
                    # set gone): what it wrote is repaired by the FULL apply, which reads the kernel
                    log.warning("network policy: the partial write failed (%s); applying from the kernel", error)
                    report = self._apply_from_kernel(wanted)
        except BaseException:
            self._last = None
            raise
        self._last = wanted
        if report.wrote:
            log.info("network policy: %d chain(s) written, %d removed, %d set(s) changed, %d destroyed%s",
                     report.chains_written, report.chains_removed, report.sets_changed, report.sets_destroyed,
                     ", hook jump repaired" if report.jump_repaired else "")
        return report

    def _apply_from_kernel(self, wanted: WantedState) -> ApplyReport:
        """The FULL apply: the difference between `wanted` and what the kernel holds."""
        current, table = self._read_kernel()
        # 1. sets: everything but KNOWN's additions
        known = self.known
        held_known = current.sets.get(known.name)
        known_now = held_known.members & wanted.known if held_known is not None else frozenset()
        first: dict[IpsetSpec, frozenset[str]] = {**wanted.sets, known: known_now}
        counts = sync_sets(self.ipset, first, current=current.sets)
        sets_changed = sum(1 for added, removed in counts.values() if added or removed)
        sets_changed += sum(1 for spec in first if spec.name not in current.sets)
        # 2. chains and the hook jumps
        changed = {name: rules for name, rules in wanted.chains.items() if current.chains.get(name) != rules}
        stale = sorted(name for name in current.chains if name not in wanted.chains)
        builder = render_chains(changed, remove=stale, unhook=_jumps_into(table, stale))
        repair = False
        for chain, (parent, spec) in HOOKS.items():
            if chain in wanted.chains and not _jump_is_first(table, parent, spec):
                add_jump_repair(builder, table, parent, spec, position=JumpPosition.FIRST)
                repair = True
        if builder:
            self.iptables.restore(builder.text())
        # 3. KNOWN gains the pods programmed above
        if wanted.known != known_now:
            sync_sets(self.ipset, {known: wanted.known}, current={known.name: self._contents(known.name, known_now)})
            sets_changed += 1
        # 4. sets nothing refers to any more
        wanted_names = {spec.name for spec in wanted.sets} | {known.name}
        doomed = sorted(name for name in current.sets if name not in wanted_names)
        for name in doomed:
            self.ipset.destroy(name)
        return ApplyReport(len(changed), len(stale), sets_changed, len(doomed), repair)

    def _apply_difference(self, last: WantedState, wanted: WantedState) -> ApplyReport:
        """The PARTIAL apply: what differs between `last` (what the last apply left the kernel
        holding) and `wanted`, found by identity first (a one-pod render shares every
        unchanged chain and member set), then by value. Written in the FULL apply's order,
        except that members arriving in sets that exist join after the chains, with KNOWN's
        (a tighter order: a set only grows once the rules that match it are in place), so a
        CNI ADD that creates no set costs one iptables-restore and one ipset restore; changed
        chains are edited, not rewritten (edits.py)."""
        if wanted is last:
            return ApplyReport()
        touched = [spec for spec, members in wanted.sets.items()
                   if (held := last.sets.get(spec)) is not members and held != members]
        doomed = [spec for spec in last.sets if spec not in wanted.sets]
        # each write as sync_sets sees it: a set holding what leaves (or arrives), asked to hold nothing
        # (or what arrives); a set not held yet is created with its members before the chains use it
        before = {spec: wanted.sets[spec] for spec in touched if spec not in last.sets}
        before.update({spec: frozenset() for spec in touched if spec in last.sets and last.sets[spec] - wanted.sets[spec]})
        leaving = {spec.name: self._contents(spec.name, last.sets[spec] - wanted.sets[spec], spec.type)
                   for spec in touched if spec in last.sets}
        after = {spec: wanted.sets[spec] - last.sets[spec] for spec in touched if spec in last.sets}
        known = self.known
        left, joined = last.known - wanted.known, wanted.known - last.known
        if left:
            before[known] = frozenset()
            leaving[known.name] = self._contents(known.name, left)
        if before:
            sync_sets(self.ipset, before, current=leaving)
        changed = {name: rules for name, rules in wanted.chains.items()
                   if (held_rules := last.chains.get(name)) is not rules and held_rules != rules}
        stale = [name for name in last.chains if name not in wanted.chains]
        if changed or stale:
            builder, _ = render_edits(TABLE, changed, last.chains, remove=stale)
            self.iptables.restore(builder.text())
        arriving = {spec: members for spec, members in after.items() if members}
        if joined:
            arriving[known] = joined
        if arriving:
            sync_sets(self.ipset, arriving, current={spec.name: self._contents(spec.name, frozenset(), spec.type)
                                                     for spec in arriving})
        for spec in doomed:
            self.ipset.destroy(spec.name)
        return ApplyReport(len(changed), len(stale), len(touched) + bool(left or joined), len(doomed), False)

    def render_with_pod(self, wanted: WantedState, added: PodAdded, *, settings: RenderSettings,
                        interface_of: Callable[[PodPlan], str | None]) -> WantedState | None:
        return render_wanted_with_pod(wanted, added, settings=settings, interface_of=interface_of)

    def render_without_pod(self, wanted: WantedState, removed: PodRemoved, *,
                           settings: RenderSettings) -> WantedState | None:
        return render_wanted_without_pod(wanted, removed, settings=settings)

    def cleanup(self) -> list[str]:
        """Remove every chain and set of the policy engine in this family (and the FORWARD jump)."""
        removed = self.iptables.delete_owned(prefix=owned.POLICY_PREFIX, table=TABLE)   # one read of filter
        for name in sorted(self._our_sets()):
            self.ipset.destroy(name)
            removed.append(f"ipset {name}")
        self._last = None
        return removed


def _needs_kernel(last: WantedState, wanted: WantedState, known: str) -> bool:
    """Whether the difference from `last` cannot be written alone: a hook chain coming or
    going (its jump is read from the kernel), a set name changing its kind, or a policy set
    named as KNOWN. The FULL apply handles those."""
    if any((name in last.chains) != (name in wanted.chains) for name in HOOKS):
        return True
    kinds = {spec.name: spec for spec in last.sets}
    return any(kinds.get(spec.name, spec) != spec or spec.name == known for spec in wanted.sets)
