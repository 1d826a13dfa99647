"""Making the `ip netagent-policy` table hold an `NftPolicy` (render.py): the nft
`PolicyDataplane`, with the iptables dataplane's contract (policy/dataplane.py).

It writes nothing of its own: the difference between the table wanted and the table held is
kernel/nftables/changes.py's (`table_changes`), and so is its write (`Changes.apply`), ONE
nft transaction: the kernel commits all of it or nothing, and packets see the table before or
after, never between. A change of elements only goes as netlink messages (`Nft.apply_elements`):
libnftables would fetch every interval set's elements before an `add element` (nft 1.0.6: one
dump per ipBlock set, 200 at 200 policies), which was most of a one-pod ADD's cost.

- A PARTIAL sync compares with the table this process last applied (`read_back=False`), cut
  first to what the render did not reuse (`_narrowed`), and writes only changed elements and
  chains (a label change: set elements only); a CNI ADD or DEL is a partial sync of the table
  render.py derives with or without that pod (`render_with_pod`, `render_without_pod`).
- A FULL sync reads the table back (`tables.read_table` of `list_table`) and writes the
  difference, so a restarted agent adopts its predecessor's table with zero writes and drift
  is repaired (rules compared by their digest comments, sets and maps by their elements, KNOWN
  by element and comment); what cannot be changed in place (the base chain's hook or
  priority, a name our text gates refuse) rebuilds the whole table in the same transaction.
- A PARTIAL write the kernel refuses (nothing of it written: one transaction) falls back at
  once to the FULL apply. After any other failure the applied record is dropped, so the next
  sync (FULL, the runner's rule) reads the table again.
"""
from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace
from typing import TypeVar

from netagent.kernel.families import IpFamily
from netagent.kernel.nftables import tables
from netagent.kernel.nftables.changes import Changes, table_changes
from netagent.kernel.nftables import text as nft_text
from netagent.kernel.nftables.model import Map, Set, Table, set_spec
from netagent.kernel.nftables.runner import Nft, NftError
from netagent.policy.dataplane import ApplyReport, PolicyDataplane
from netagent.policy.pod_plan import PodAdded, PodRemoved
from netagent.policy.nftables.readback import parse_nft_policy
from netagent.policy.nftables.render import BASE_CHAIN, TABLE, NftPolicy, render_nft, render_nft_with_pod, render_nft_without_pod
from netagent.policy.readback import KernelPolicy
from netagent.policy.semantics import NodePlan, PodPlan
from netagent.policy.shared import RenderSettings

log = logging.getLogger("netagent.policy")


class NftablesDataplane(PolicyDataplane[NftPolicy]):
    """Applies wanted states to the policy table through an `Nft` (real or fake)."""

    def __init__(self, nft: Nft, *, family: IpFamily = IpFamily.V4) -> None:
        self.nft = nft
        self.family = family
        self._applied: Table | None = None      # what the last apply left the kernel holding

    def render(self, plan: NodePlan, *, settings: RenderSettings,
               interface_of: Callable[[PodPlan], str | None]) -> NftPolicy:
        return render_nft(plan, settings=settings, interface_of=interface_of, family=self.family)

    def _list(self) -> list[dict] | None:
        return self.nft.list_table(self.family.nft, TABLE)

    def read_policy(self) -> KernelPolicy:
        return parse_nft_policy(self._list() or [])[0]

    def read_sets(self) -> dict[str, frozenset[str]]:
        return parse_nft_policy(self._list() or [])[1]

    def apply(self, wanted: NftPolicy, *, full: bool) -> ApplyReport:
        try:
            if not full and wanted.table is self._applied:
                return ApplyReport()
            if full or self._applied is None:
                held, changes = self._from_kernel(wanted)
            else:
                held = self._applied
                changes = table_changes(*_narrowed(wanted.table, held), read_back=False)
                try:
                    self._write(changes)
                except NftError as error:
                    # refused (the table changed behind our back): nothing of the transaction was
                    # written; the FULL apply reads the table and writes what it lacks
                    log.warning("network policy (nft): the partial write failed (%s); applying from the kernel", error)
                    held, changes = self._from_kernel(wanted)
        except BaseException:
            self._applied = None
            raise
        self._applied = wanted.table
        report = _report(changes, existed=held is not None)
        if report.wrote:
            log.info("network policy (nft): %d chain(s) written, %d removed, %d set(s)/map(s) changed, "
                     "%d destroyed%s", report.chains_written, report.chains_removed, report.sets_changed,
                     report.sets_destroyed, ", base chain repaired" if report.jump_repaired else "")
        return report

    def _from_kernel(self, wanted: NftPolicy) -> tuple[Table | None, Changes]:
        """The FULL apply: the difference from the table read back, written."""
        held = tables.read_table(self.family.nft, TABLE, self._list())
        changes = table_changes(wanted.table, held)
        self._write(changes)
        return held, changes

    def _write(self, changes: Changes) -> None:
        """One transaction: a change of elements only (a CNI ADD of a pod no policy isolates:
        KNOWN and the selector sets it joins; a label change) as netlink messages
        (`Changes.apply`); a table rebuilt as `Changes.apply` writes it; anything else (an
        isolated pod's chains, rules and elements) as one text batch whose elements are added
        by re-declaring their set or map (`_declared_batch`)."""
        if changes.rebuild is not None or changes.element_write() is not None:
            changes.apply(self.nft)
            return
        batch = _declared_batch(changes)
        if batch:
            self.nft.apply(batch)

    def render_with_pod(self, wanted: NftPolicy, added: PodAdded, *, settings: RenderSettings,
                        interface_of: Callable[[PodPlan], str | None]) -> NftPolicy | None:
        """One new pod: its chains, its address in the sets it joined, its map elements and its
        KNOWN element, beside everything of `wanted` reused."""
        return render_nft_with_pod(wanted, added, settings=settings, interface_of=interface_of, family=self.family)

    def render_without_pod(self, wanted: NftPolicy, removed: PodRemoved, *,
                           settings: RenderSettings) -> NftPolicy | None:
        return render_nft_without_pod(wanted, removed)

    def cleanup(self) -> list[str]:
        """Remove the policy table (everything of the policy engine in nft)."""
        self._applied = None
        if not tables.remove_table(self.nft, self.family.nft, TABLE):
            return []
        return [f"nft table {self.family.nft} {TABLE}"]


def _declared_batch(changes: Changes) -> str:
    """`changes.text()` with each `add element` replaced by its set or map declared again with
    `elements = { ... }`: the same transaction, but nft 1.0.6 fetches every interval set's
    elements before an `add element` (one dump per ipBlock set) and not before a declaration
    (measured at 1,000 pods / 200 policies: 12.9 ms of CPU for an isolated pod's batch, 7.2 ms
    declared). A declaration must match the set's (the kernel refuses another type), so
    interval and dynamic sets, and sets without a declaration, keep their `add element`."""
    adds = {holder: elements for holder, elements in changes.add_elements.items() if elements}
    declared = {holder: changes.declared.get(holder) for holder in adds}
    moved = sorted(holder for holder, entry in declared.items() if entry is not None and not entry.flags)
    if not moved:
        return changes.text()
    where = f"{changes.family} {nft_text.name(changes.table)}"
    lines = []
    for holder in moved:
        entry = declared[holder]
        assert entry is not None
        items = nft_text.element_block(element.render() for _, element in sorted(adds[holder].items()))
        lines.append(f"add {'map' if isinstance(entry, Map) else 'set'} {where} {nft_text.name(holder)} "
                     f"{{ {set_spec(entry)} elements = {items} }}")
    rest = replace(changes, add_elements={holder: adds[holder] for holder in adds if holder not in moved})
    return rest.text() + "\n".join(lines) + "\n"


def _narrowed(wanted: Table, held: Table) -> tuple[Table, Table]:
    """`wanted` and `held` (the table applied last) without what they share by identity: the
    chains, sets and elements a render reused (render.py caches them) are as the kernel holds
    them, so `table_changes` of the rest is that of the whole tables, at the cost of what
    changed (a label change, one pod's chains and elements) rather than of every pod. A set
    whose type changed (its chains must be rewritten) leaves both whole."""
    chains, stale = _differing(held.chains, wanted.chains)
    sets: list[Set | Map] = []
    old_sets: list[Set | Map] = []
    held_sets, matched = held.sets, 0         # wanted's sets that held has (by name): none stale when all
    for index, entry in enumerate(wanted.sets):
        old = held_sets[index] if index < len(held_sets) else None    # a render keeps the order
        if old is not entry:
            old = held.set(entry.name)
        if old is None:
            sets.append(entry)
            continue
        matched += 1
        if old is entry:
            continue
        if _shape(old) != _shape(entry):
            return wanted, held
        added, gone = _differing(old.elements, entry.elements)
        sets.append(replace(entry, elements=added))
        old_sets.append(replace(old, elements=gone))
    if matched < len(held_sets):
        old_sets += [entry for entry in held_sets if wanted.set(entry.name) is None]
    return replace(wanted, chains=chains, sets=tuple(sets)), replace(held, chains=stale, sets=tuple(old_sets))


T = TypeVar("T")


def _differing(old: tuple[T, ...], new: tuple[T, ...]) -> tuple[tuple[T, ...], tuple[T, ...]]:
    """(what `new` holds that `old` does not, what `old` holds that `new` does not), by
    identity, in order: the common head and tail first (a pod added appends, one removed
    leaves a gap), then the middle by identity."""
    start, limit = 0, min(len(old), len(new))
    while start < limit and old[start] is new[start]:
        start += 1
    end = 0
    while end < limit - start and old[len(old) - 1 - end] is new[len(new) - 1 - end]:
        end += 1
    old_middle, new_middle = old[start:len(old) - end], new[start:len(new) - end]
    if not old_middle or not new_middle:
        return new_middle, old_middle
    kept, made = {id(item) for item in old_middle}, {id(item) for item in new_middle}
    return (tuple(item for item in new_middle if id(item) not in kept),
            tuple(item for item in old_middle if id(item) not in made))


def _shape(entry: Set | Map) -> tuple[object, ...]:
    return (type(entry), entry.key_type, getattr(entry, "value_type", None), frozenset(entry.flags))


def _report(changes: Changes, *, existed: bool) -> ApplyReport:
    """What one transaction wrote, in the dataplane's terms."""
    if changes.rebuild is not None:
        table = changes.rebuild
        return ApplyReport(sum(chain.base is None for chain in table.chains), 0, len(table.sets), 0, existed)
    touched = {name for name, keys in changes.delete_elements.items() if keys}
    touched |= {name for name, elements in changes.add_elements.items() if elements}
    touched |= set(changes.add_sets)
    return ApplyReport(chains_written=sum(name != BASE_CHAIN for name in changes.rules),
                       chains_removed=len(changes.delete_chains), sets_changed=len(touched),
                       sets_destroyed=len(set(changes.delete_sets) - set(changes.add_sets)),
                       jump_repaired=BASE_CHAIN in changes.rules)
