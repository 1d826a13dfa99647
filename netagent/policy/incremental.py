"""Incremental planning: the node's plan after a change, from the last plan and only what the
change can reach (issue 31: a label change at 1,000 pods / 200 policies re-planned every pod
and every set, most of a sync's time).

What one changed object can reach, by semantics.py's rules (the only rules; nothing of them
is restated here, only which of its values a change can alter):
- a pod (added, removed, labels, address, node, ports): its own plan when it is local, and the
  members of each pod set (PODS, NAMED) whose scope may mean it, before or after the change;
- a namespace's labels: the members of each set whose namespaceSelector matched it before or
  matches it after (a pod's own plan never reads namespace labels);
- a policy: the plans of the local pods of its namespace (the sets their rules name come and
  go with them: a plan holds the sets its pods' allows name);
- a set whose capacity changes is another `SetRef`: the pods whose allows name it re-planned.
Everything else of the previous plan is kept as the same objects, so the dataplanes' renders
hit their caches and their partial applies skip it by identity.

`replan` equals `plan_node` of the same view (tests/unit/policy/test_policy_replan.py holds
this over random sequences of changes; the engine checks it again on every FULL sync). It
answers None, and the caller plans the whole node, whenever that is simpler than being sure:
a previous plan with problems (a policy that failed to plan isolates its namespace: the whole
plan reports it), a policy failing to plan now, or a change to more than a quarter of the pods.
`Basis` is a plan with a snapshot of the view it was made from: the engine's view is changed
in place by each drain, so the next change is found by comparing the two.
"""
from __future__ import annotations

from collections import defaultdict
from collections.abc import Container, Iterable, Mapping
from dataclasses import dataclass
from typing import TypeVar

from netagent.policy.model import LabelSelector, NetworkPolicy, Peer, PodInfo, PodScope, PolicyType, PortSpec
from netagent.policy.semantics import (
    Allow,
    ClusterView,
    Member,
    NodePlan,
    Planner,
    PodPlan,
    SetKind,
    SetRef,
    addressed,
    named_key,
    pod_plan_of,
    policy_allows,
    set_refs,
)

MIN_CHANGED = 16           # a change to at most max(this, a quarter of the pods) is planned incrementally
Recipe = tuple[Peer | None, PortSpec | None]     # how a PODS (peer, None) or NAMED (peer, port) set is made
K = TypeVar("K")
V = TypeVar("V")


@dataclass(frozen=True)
class Basis:
    """A plan and the view it was made from (`snapshot`: dicts of its own)."""
    view: ClusterView
    plan: NodePlan


def snapshot(view: ClusterView) -> ClusterView:
    """The view as it is now: its values are frozen, its dicts are copied."""
    return ClusterView(dict(view.pods), dict(view.namespaces), dict(view.policies))


def changed_keys(old: Mapping[K, V], new: Mapping[K, V]) -> list[K]:
    """Keys added, removed or holding another value (the same object first, then by value)."""
    found = [key for key, value in new.items() if (was := old.get(key)) is not value and was != value]
    found += [key for key in old if key not in new]
    return found


def recipes(policies: Iterable[NetworkPolicy]) -> dict[tuple[SetKind, str], Recipe]:
    """Every pod set the policies' rules can name, by (kind, key): a PODS set by its peer, an
    egress named-port set by its peer (None: any peer) and port (semantics.py's `Planner`
    makes both from these: `peer_match`, `named_set`)."""
    found: dict[tuple[SetKind, str], Recipe] = {}
    for policy in policies:
        for direction in PolicyType:
            for rule in policy.rules(direction):
                for peer in rule.peers or ():
                    if peer.scope is not None:
                        found.setdefault((SetKind.PODS, peer.scope.key()), (peer, None))
                if direction is not PolicyType.EGRESS:
                    continue
                for spec in rule.ports or ():
                    if isinstance(spec.port, str):
                        for named_peer in rule.peers if rule.peers is not None else (None,):
                            found.setdefault((SetKind.NAMED, named_key(named_peer, spec)), (named_peer, spec))
    return found


def _matches(selector: LabelSelector, labels: dict[str, str] | None) -> bool:
    """semantics.py's rule for a namespace selector: unknown labels match only an empty one."""
    return selector.matches(labels) if labels is not None else selector.is_empty


class _Reach:
    """Which sets a change reaches: the changed pods (each version with the planner of its
    view, for its namespace's labels then) and the changed namespaces' labels before and after."""

    def __init__(self, pods: list[tuple[PodInfo, Planner]], namespaces: list[tuple[dict | None, dict | None]]) -> None:
        self.pods = pods
        self.namespaces = namespaces

    def reaches(self, recipe: Recipe) -> bool:
        peer, _ = recipe
        scope: PodScope | None = peer.scope if peer is not None else None
        if scope is None:                          # a named port of any peer, or of an ipBlock: every pod
            return bool(self.pods)
        if any(planner.in_scope(scope, pod) for pod, planner in self.pods):
            return True
        selector = scope.namespaces
        return selector is not None and any(_matches(selector, old) or _matches(selector, new)
                                            for old, new in self.namespaces)


def replan(basis: Basis, view: ClusterView, *, node_name: str) -> NodePlan | None:
    """The plan of `view` (what `plan_node` gives), from `basis`: the previous plan itself when
    nothing it reads changed, else a new one sharing every value the change cannot reach.
    None: plan the whole node (see the module docstring)."""
    old, previous = basis.view, basis.plan
    if previous.problems:
        return None
    pods, namespaces = changed_keys(old.pods, view.pods), changed_keys(old.namespaces, view.namespaces)
    policies = changed_keys(old.policies, view.policies)
    if not (pods or namespaces or policies):
        return previous
    if len(pods) > max(MIN_CHANGED, len(view.pods) // 4):
        return None
    before, now = Planner(old), Planner(view)
    reach = _Reach([(pod, planner) for keyed, planner in ((old.pods, before), (view.pods, now))
                    for pod in (keyed.get(key) for key in pods) if pod is not None and addressed(pod)],
                   [(before.labels_of_namespace(name), now.labels_of_namespace(name)) for name in namespaces])

    # the sets the change reaches, made again; the others kept as they are
    made = recipes(view.policies.values())
    stale = {ref: recipe for ref in previous.sets if ref.kind in (SetKind.PODS, SetKind.NAMED)
             and (recipe := made.get((ref.kind, ref.key))) is not None and reach.reaches(recipe)}
    after = Planner(view, known={ref: members for ref, members in previous.sets.items() if ref not in stale})
    renamed: set[SetRef] = set()
    for ref, (peer, spec) in stale.items():
        ref_now = after.named_set(peer, spec) if spec is not None else after.peer_match(peer) if peer else ref
        if ref_now != ref:
            renamed.add(ref)                   # its capacity changed: the pods naming it are planned again

    # the pods whose own plans the change reaches, planned again
    again = set(pods)
    spaces = {policy.namespace for key in policies for policy in (old.policies.get(key), view.policies.get(key))
              if policy is not None}
    by_key = {plan.key: plan for plan in previous.pods}
    if spaces or renamed:
        for plan in previous.pods:
            info = view.pods.get(plan.key) or old.pods.get(plan.key)
            if (info is not None and info.namespace in spaces) or (
                    renamed and any(ref in renamed for allows in (plan.ingress, plan.egress) for allow in allows or ()
                                    for ref in set_refs(allow))):
                again.add(plan.key)
    planned = _plan_pods(after, view, sorted(again), node_name=node_name)
    if planned is None:
        return None
    same = not renamed
    for key, replanned in planned.items():
        if replanned is None:
            if by_key.pop(key, None) is not None:
                same = False
        elif by_key.get(key) != replanned:
            by_key[key], same = replanned, False
    if same:                                   # every pod's plan as before (an equal plan stays the same object)
        return NodePlan(previous.pods, _used_sets(None, previous.sets, after.sets), ())
    plans = tuple(by_key[key] for key in sorted(by_key))
    return NodePlan(plans, _used_sets(plans, previous.sets, after.sets), ())


def _plan_pods(planner: Planner, view: ClusterView, keys: list[str], *,
               node_name: str) -> dict[str, PodPlan | None] | None:
    """Each pod's plan as `plan_node` makes it (None: no longer a local pod with an address);
    None when a policy fails to plan (the whole plan reports it)."""
    found: dict[str, PodPlan | None] = {}
    by_namespace: dict[str, list[NetworkPolicy]] | None = None
    for key in keys:
        pod = view.pods.get(key)
        if pod is None or not addressed(pod) or pod.node_name != node_name:
            found[key] = None
            continue
        if by_namespace is None:
            by_namespace = defaultdict(list)
            for policy in sorted(view.policies.values(), key=lambda p: p.key):
                by_namespace[policy.namespace].append(policy)
        allowed: dict[PolicyType, list[Allow]] = {}
        selecting: dict[tuple[str, PolicyType], list[str]] = defaultdict(list)
        for policy in by_namespace.get(pod.namespace, ()):
            try:
                contribution = policy_allows(planner, policy, (pod,))
            except Exception:
                return None
            for _, direction, allows in contribution:
                selecting[(key, direction)].append(policy.key)
                allowed.setdefault(direction, []).extend(allows)
        found[key] = pod_plan_of(pod, allowed, selecting)
    return found


def _used_sets(plans: tuple[PodPlan, ...] | None, previous: Mapping[SetRef, frozenset[Member]],
               made: Mapping[SetRef, frozenset[Member]]) -> dict[SetRef, frozenset[Member]]:
    """The sets the plans' allows name (None: the pods' plans are the previous ones, so are their
    sets), in the previous plan's order (new ones after), each keeping its previous members'
    object when they are equal."""
    if plans is None:
        used: Container[SetRef] = previous
    else:
        distinct = {allow for plan in plans for allows in (plan.ingress, plan.egress) if allows for allow in allows}
        used = {ref for allow in distinct for ref in set_refs(allow)}
    found: dict[SetRef, frozenset[Member]] = {}
    for ref, members in previous.items():
        if ref in used:
            now = made.get(ref, members)
            found[ref] = members if now is members or now == members else now
    for ref, members in made.items():
        if ref in used and ref not in found:
            found[ref] = members
    return found
