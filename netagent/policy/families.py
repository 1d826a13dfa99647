"""Dual-stack policy: the family-free plan split per IP family, and one dataplane per family.

Why. The semantics (semantics.py) do not depend on the family: a pod is isolated or not,
a selector means the same pods, whatever their addresses. What differs is what each family's
dataplane can hold: ip6tables and an `inet6` ipset, or the `ip6 netagent-policy` table, take
only IPv6 addresses. So the engine plans once, and `plan_for_family` gives each family's
dataplane the plan as that family sees it, as kube-proxy runs one proxier per family:
- a pod is programmed in a family only when it has an address of that family (`ip` is then
  that address); a pod without one is not in that family's plan, so the KNOWN guard of that
  family keeps its traffic there closed;
- a set keeps its members of the family, under its family's name (`SetRef.family`; the
  capacity stays the one planned from both families' members);
- an allow whose peer is an `ipBlock` of the other family matches nothing in this family and
  is dropped (a policy with only IPv4 ipBlocks allows no IPv6 peer), as is one whose ipBlocks
  set holds nothing of this family; the pod stays isolated.
For an IPv4-only cluster the projection of an all-IPv4 plan returns the same values, so the
rendered rules are unchanged. `added_for_family`/`removed_for_family` do the same for the CNI
ADD's one-pod path (pod_plan.py's values), from the family's previous plan.

`FamilyDataplanes` is the engine's one `PolicyDataplane` over the per-family ones: render and
apply each family in turn (IPv4 first), the one-pod path per family (a family the pod has no
address in is left as it was), cleanup and read-back of both.
"""
from __future__ import annotations

import bisect
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

from netagent.kernel.families import IpFamily
from netagent.policy.dataplane import ApplyReport, PolicyDataplane, Rendered
from netagent.policy.pod_plan import PodAdded, PodRemoved
from netagent.policy.readback import KernelPolicy
from netagent.policy.shared import RenderSettings
from netagent.policy.semantics import Allow, CidrMatch, Member, NodePlan, PodPlan, SetKind, SetRef, member_address, set_refs


def in_family(member: Member, family: IpFamily) -> bool:
    """Whether an address, network or set member (a named port's by its address) is of `family`."""
    return IpFamily.of(member_address(member)) is family


class _Projector:
    """One family's view of one plan's values; allows and set references memoised, so values
    shared in the plan stay shared (and unchanged ones are the plan's own)."""

    def __init__(self, family: IpFamily, sets: Mapping[SetRef, frozenset[Member]]) -> None:
        self.family = family
        self.sets = sets
        self._members: dict[SetRef, frozenset[Member]] = {}
        self._allows: dict[Allow, Allow | None] = {}

    def ref(self, ref: SetRef) -> SetRef:
        return ref if ref.family is self.family else replace(ref, family=self.family)

    def members(self, ref: SetRef, held: frozenset[Member] | None = None) -> frozenset[Member]:
        found = self._members.get(ref) if held is None else None
        if found is None:
            held = self.sets.get(ref, frozenset()) if held is None else held
            kept = frozenset(member for member in held if in_family(member, self.family))
            found = held if len(kept) == len(held) else kept
            self._members[ref] = found
        return found

    def allow(self, allow: Allow) -> Allow | None:
        if allow in self._allows:
            return self._allows[allow]
        peer = allow.peer
        projected: Allow | None = allow
        if isinstance(peer, CidrMatch):
            if not in_family(peer.cidr, self.family):
                projected = None
            elif peer.excepts is not None and peer.excepts.family is not self.family:
                projected = replace(allow, peer=CidrMatch(peer.cidr, self.ref(peer.excepts)))
        elif isinstance(peer, SetRef):
            if peer.kind is SetKind.NETS and not self.members(peer):
                projected = None            # every block of the rule is of the other family
            elif peer.family is not self.family:
                projected = replace(allow, peer=self.ref(peer))
        if projected is not None and projected.named is not None and projected.named.family is not self.family:
            projected = replace(projected, named=self.ref(projected.named))
        self._allows[allow] = projected
        return projected

    def allows(self, allows: tuple[Allow, ...] | None) -> tuple[Allow, ...] | None:
        if not allows:
            return allows
        found = tuple(projected for allow in allows if (projected := self.allow(allow)) is not None)
        return allows if len(found) == len(allows) and all(a is b for a, b in zip(found, allows)) else found

    def pod(self, pod: PodPlan) -> PodPlan | None:
        if pod.ips:
            address = next((ip for ip in pod.ips if in_family(ip, self.family)), None)
        else:
            address = pod.ip if in_family(pod.ip, self.family) else None
        if address is None:
            return None
        ingress, egress = self.allows(pod.ingress), self.allows(pod.egress)
        if address == pod.ip and not pod.ips and ingress is pod.ingress and egress is pod.egress:
            return pod
        return replace(pod, ip=address, ingress=ingress, egress=egress, ips=())

    def changed(self, changes: Mapping[SetRef, frozenset[Member]],
                sets: dict[SetRef, frozenset[Member]]) -> dict[SetRef, frozenset[Member]]:
        """The family's part of a one-pod change to sets' members (pod_plan.py's `grown`,
        `shrunk`): those of the family's sets whose members of the family changed, updated in `sets`."""
        found: dict[SetRef, frozenset[Member]] = {}
        for ref, members in changes.items():
            mine = self.ref(ref)
            if mine in sets:
                kept = self.members(ref, members)
                if kept != sets[mine]:
                    found[mine] = sets[mine] = kept
        return found

    def used(self, pods: Sequence[PodPlan]) -> dict[SetRef, frozenset[Member]]:
        """The family's sets the pods' allows name, with the family's members."""
        distinct = {allow for pod in pods for allows in (pod.ingress, pod.egress) if allows for allow in allows}
        used = {ref for allow in distinct for ref in set_refs(allow)}
        if not used:
            return {}
        by_name = {self.ref(ref): ref for ref in self.sets}
        return {ref: self.members(by_name[ref]) for ref in used if ref in by_name}


def plan_for_family(plan: NodePlan, family: IpFamily) -> NodePlan:
    """What `family`'s dataplane programs of `plan` (the module docstring says how)."""
    projector = _Projector(family, plan.sets)
    pods = tuple(projected for pod in plan.pods if (projected := projector.pod(pod)) is not None)
    sets = projector.used(pods)
    if pods == plan.pods and sets.keys() == plan.sets.keys() and all(sets[r] is plan.sets[r] for r in sets):
        return plan
    return NodePlan(pods, sets, plan.problems)


def added_for_family(added: PodAdded, previous: NodePlan, family: IpFamily) -> PodAdded | None:
    """`added` in `family`, given the family's plan before it (`previous`); None when the pod has
    no address of the family (that family's plan does not change)."""
    projector = _Projector(family, added.plan.sets)
    pod = projector.pod(added.pod)
    if pod is None:
        return None
    sets = dict(previous.sets)
    grown = projector.changed(added.grown, sets)
    new: dict[SetRef, frozenset[Member]] = {}
    originals = {projector.ref(ref): ref for ref in added.plan.sets}
    for allow in (*(pod.ingress or ()), *(pod.egress or ())):
        for ref in set_refs(allow):
            if ref not in sets:
                new[ref] = sets[ref] = projector.members(originals[ref])
    at = bisect.bisect_left(previous.pods, pod.key, key=lambda p: p.key)
    pods = (*previous.pods[:at], pod, *previous.pods[at:])
    return PodAdded(NodePlan(pods, sets, previous.problems), pod, grown, new)


def removed_for_family(removed: PodRemoved, previous: NodePlan, family: IpFamily) -> PodRemoved | None:
    """`removed` in `family`, from the family's plan before it; None when the pod was not in it."""
    at = bisect.bisect_left(previous.pods, removed.pod.key, key=lambda p: p.key)
    if at >= len(previous.pods) or previous.pods[at].key != removed.pod.key:
        return None
    projector = _Projector(family, removed.plan.sets)
    gone = previous.pods[at]
    pods = (*previous.pods[:at], *previous.pods[at + 1:])
    dropped = {ref for allow in (*(gone.ingress or ()), *(gone.egress or ())) for ref in set_refs(allow)}
    if dropped:
        dropped -= {ref for plan in pods for allows in (plan.ingress or (), plan.egress or ())
                    for allow in allows for ref in set_refs(allow)}
    sets = {ref: members for ref, members in previous.sets.items() if ref not in dropped}
    shrunk = projector.changed(removed.shrunk, sets)
    return PodRemoved(NodePlan(pods, sets, previous.problems), gone, shrunk, frozenset(dropped))


def settings_for_family(settings: RenderSettings, family: IpFamily) -> RenderSettings:
    cidrs = tuple(cidr for cidr in settings.local_cidrs if in_family(cidr, family))
    if family is settings.family and cidrs == settings.local_cidrs:
        return settings
    return replace(settings, family=family, local_cidrs=cidrs)


@dataclass(frozen=True)
class FamilyState:
    """One family's part of the engine's rendered state: its plan and its dataplane's state."""
    family: IpFamily
    plan: NodePlan
    wanted: Rendered


@dataclass(frozen=True)
class DualWanted:
    """The rendered state of every family (the engine reads pending and refused of all)."""
    parts: tuple[FamilyState, ...]

    @property
    def pending(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(key for part in self.parts for key in part.wanted.pending))

    @property
    def refused(self) -> tuple[str, ...]:
        if len(self.parts) == 1:
            return self.parts[0].wanted.refused          # one family: said as before
        return tuple(f"{part.family.label}: {why}" for part in self.parts for why in part.wanted.refused)


class FamilyDataplanes(PolicyDataplane[DualWanted]):
    """The engine's dataplane in a cluster of one or two families: one dataplane per family,
    each built with its family (`IptablesDataplane(family=...)`, `NftablesDataplane(family=...)`)."""

    def __init__(self, dataplanes: Mapping[IpFamily, PolicyDataplane]) -> None:
        if not dataplanes:
            raise ValueError("a policy dataplane needs at least one family")
        self.dataplanes = {family: dataplanes[family] for family in IpFamily if family in dataplanes}

    def render(self, plan: NodePlan, *, settings: RenderSettings,
               interface_of: Callable[[PodPlan], str | None]) -> DualWanted:
        parts = []
        for family, dataplane in self.dataplanes.items():
            mine = plan_for_family(plan, family)
            parts.append(FamilyState(family, mine, dataplane.render(
                mine, settings=settings_for_family(settings, family), interface_of=interface_of)))
        return DualWanted(tuple(parts))

    def apply(self, wanted: DualWanted, *, full: bool) -> ApplyReport:
        reports = [self.dataplanes[part.family].apply(part.wanted, full=full) for part in wanted.parts]
        return _sum(reports)

    def render_with_pod(self, wanted: DualWanted, added: PodAdded, *, settings: RenderSettings,
                        interface_of: Callable[[PodPlan], str | None]) -> DualWanted | None:
        return self._one_pod(wanted, lambda part, dataplane: (
            None if (mine := added_for_family(added, part.plan, part.family)) is None
            else (mine.plan, dataplane.render_with_pod(part.wanted, mine, interface_of=interface_of,
                                                       settings=settings_for_family(settings, part.family)))))

    def render_without_pod(self, wanted: DualWanted, removed: PodRemoved, *,
                           settings: RenderSettings) -> DualWanted | None:
        return self._one_pod(wanted, lambda part, dataplane: (
            None if (mine := removed_for_family(removed, part.plan, part.family)) is None
            else (mine.plan, dataplane.render_without_pod(part.wanted, mine,
                                                          settings=settings_for_family(settings, part.family)))))

    def _one_pod(self, wanted: DualWanted, step: Callable) -> DualWanted | None:
        """Each family's one-pod render (a family the pod has no address in keeps its state);
        None (the engine renders the whole plan) as soon as one family's does not apply."""
        parts = []
        for part in wanted.parts:
            done = step(part, self.dataplanes[part.family])
            if done is None:
                parts.append(part)
                continue
            plan, rendered = done
            if rendered is None:
                return None
            parts.append(FamilyState(part.family, plan, rendered))
        return DualWanted(tuple(parts))

    def cleanup(self) -> list[str]:
        return [item for family in reversed(self.dataplanes) for item in self.dataplanes[family].cleanup()]

    def read_policy(self) -> KernelPolicy:
        merged = KernelPolicy()
        for dataplane in self.dataplanes.values():
            read = dataplane.read_policy()
            merged.pods.extend(read.pods)
            merged.guard.extend(read.guard)
            merged.local.update(read.local)
        return merged

    def read_sets(self) -> dict[str, frozenset[str]]:
        merged: dict[str, frozenset[str]] = {}
        for dataplane in self.dataplanes.values():
            for name, members in dataplane.read_sets().items():
                merged[name] = merged.get(name, frozenset()) | members
        return merged


def _sum(reports: Sequence[ApplyReport]) -> ApplyReport:
    return ApplyReport(sum(r.chains_written for r in reports), sum(r.chains_removed for r in reports),
                       sum(r.sets_changed for r in reports), sum(r.sets_destroyed for r in reports),
                       any(r.jump_repaired for r in reports))
