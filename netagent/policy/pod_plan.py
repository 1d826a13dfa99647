"""One pod's change to the node's plan, computed from that pod alone: the CNI ADD's and DEL's
incremental path (engine.py `bind_pod`/`unbind_pod`; dataplane.py `render_with_pod`,
`render_without_pod`, then the same partial `apply` as any sync).

A new local pod changes its own allows (the policies of its namespace, planned by
semantics.py's own `policy_allows`) and the members of every pod set whose scope means it
(semantics.py's `Planner.in_scope`, the rule `scope_pods` applies to every pod); a pod going
away takes its plan, its address and the sets only its rules named. Nothing else of the plan
depends on one pod, except a set's capacity (its name) and named-port sets: when those
would change, or anything else is not as `plan_node` would leave it, these return None and
the caller plans the whole node. There is no second copy of the policy semantics here.
"""
from __future__ import annotations

import bisect
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass

from netagent.policy.model import PolicyType
from netagent.policy.semantics import (
    Allow,
    ClusterView,
    Member,
    NodePlan,
    Planner,
    PodPlan,
    SetKind,
    SetRef,
    capacity_for,
    member_address,
    pod_plan_of,
    policy_allows,
    set_refs,
)


@dataclass(frozen=True)
class PodAdded:
    """`plan_with_pod`'s answer: the node's plan with one more pod, and what that pod changed."""
    plan: NodePlan
    pod: PodPlan
    grown: Mapping[SetRef, frozenset[Member]]     # sets that existed and gained the pod's address
    new: Mapping[SetRef, frozenset[Member]]       # sets the pod's own rules name that did not exist


def plan_with_pod(view: ClusterView, previous: NodePlan, key: str, *, node_name: str) -> PodAdded | None:
    """`previous` (the plan of `view` without pod `key`) with that new local pod added,
    computing only what the pod changes: its own allows (the policies of its namespace, as
    `plan_node` plans them) and its address in every pod set whose scope means it. None when
    that is not the whole change (a problem plan, the address already someone's, a set whose
    capacity would change, named-port sets the pod could join): the caller plans the node."""
    pod = view.pods.get(key)
    if (pod is None or pod.ip is None or pod.host_network or pod.node_name != node_name or previous.problems
            or not pod.labels_known):
        return None
    at = bisect.bisect_left(previous.pods, key, key=lambda p: p.key)
    if at < len(previous.pods) and previous.pods[at].key == key:
        return None
    mine = set(pod.addresses)   # the plan's pods are the view's: an address someone else holds is in the view
    if any(other is not pod and not other.host_network and not mine.isdisjoint(other.addresses)
           for other in view.pods.values()):
        return None
    if pod.ports and any(ref.kind is SetKind.NAMED for ref in previous.sets):
        return None
    scopes = {scope.key(): scope for policy in view.policies.values() for scope in policy.scopes}
    planner = Planner(view)
    sets = dict(previous.sets)
    grown: dict[SetRef, frozenset[Member]] = {}
    for ref, members in previous.sets.items():
        if ref.kind is not SetKind.PODS:
            continue
        scope = scopes.get(ref.key)
        if scope is None:
            return None
        if planner.in_scope(scope, pod):
            grown[ref] = sets[ref] = members | mine
            if capacity_for(len(grown[ref])) != ref.capacity:
                return None
    planner = Planner(view, known=sets)        # the pod's rules name these as they now are
    allowed: dict[PolicyType, list[Allow]] = {}
    selecting: dict[tuple[str, PolicyType], list[str]] = defaultdict(list)
    for policy in sorted((p for p in view.policies.values() if p.namespace == pod.namespace), key=lambda p: p.key):
        try:
            contribution = policy_allows(planner, policy, (pod,))
        except Exception:
            return None                 # plan_node reports it, isolating the namespace
        for _, direction, allows in contribution:
            selecting[(key, direction)].append(policy.key)
            allowed.setdefault(direction, []).extend(allows)
    plan = pod_plan_of(pod, allowed, selecting)
    new = {ref: planner.sets[ref] for allow in (*(plan.ingress or ()), *(plan.egress or ()))
           for ref in set_refs(allow) if ref not in sets}
    sets.update(new)
    pods = (*previous.pods[:at], plan, *previous.pods[at:])
    return PodAdded(NodePlan(pods, sets, ()), plan, grown, new)


@dataclass(frozen=True)
class PodRemoved:
    """`plan_without_pod`'s answer: the node's plan without one pod, and what that changed."""
    plan: NodePlan
    pod: PodPlan
    shrunk: Mapping[SetRef, frozenset[Member]]    # sets that lost the pod's address (their new members)
    dropped: frozenset[SetRef]                 # sets only the pod's rules named


def plan_without_pod(view: ClusterView, previous: NodePlan, key: str) -> PodRemoved | None:
    """`previous` without local pod `key` (which `view` no longer gives an address): its plan
    gone, its address out of every set, the sets only its rules named gone. None when that is
    not the whole change (its address someone else's, a set whose capacity would change)."""
    at = bisect.bisect_left(previous.pods, key, key=lambda p: p.key)
    if at >= len(previous.pods) or previous.pods[at].key != key or previous.problems:
        return None
    gone = previous.pods[at]
    info = view.pods.get(key)
    if info is not None and info.ip is not None:
        return None
    addresses = frozenset(gone.addresses)
    if any(not other.host_network and not addresses.isdisjoint(other.addresses) for other in view.pods.values()):
        return None
    pods = (*previous.pods[:at], *previous.pods[at + 1:])
    named = {ref for allow in (*(gone.ingress or ()), *(gone.egress or ())) for ref in set_refs(allow)}
    if named:
        distinct = {allow for plan in pods for allows in (plan.ingress or (), plan.egress or ()) for allow in allows}
        named -= {ref for allow in distinct for ref in set_refs(allow)}
    sets = {ref: members for ref, members in previous.sets.items() if ref not in named}
    shrunk: dict[SetRef, frozenset[Member]] = {}
    for ref, members in sets.items():
        if ref.kind is SetKind.NAMED and any(member_address(member) in addresses for member in members):
            return None
        if ref.kind is SetKind.PODS and not addresses.isdisjoint(members):
            shrunk[ref] = sets[ref] = members - addresses
            if capacity_for(len(shrunk[ref])) != ref.capacity:
                return None
    return PodRemoved(NodePlan(pods, sets, ()), gone, shrunk, frozenset(named))
