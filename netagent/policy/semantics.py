"""What the policies mean for this node's pods: pure, from parsed values to a `NodePlan`.

The rules of `networking.k8s.io/v1`, all decided here and nowhere else:
- a pod is isolated in a direction once some policy selecting it (same namespace, podSelector
  matches) lists that direction in its policyTypes; not isolated means open in that direction;
- an isolated pod accepts what ANY selecting policy's rule of that direction allows (policies
  are additive; there is no deny rule), replies included (the renderer's conntrack rule);
- a rule allows (peer, port) pairs: every peer item times every port item; missing or empty
  `from`/`to` = any peer, missing or empty `ports` = any port; `ingress: []` allows nothing;
- a selector peer is the pods matching `podSelector` in the namespaces matching
  `namespaceSelector` (AND); without namespaceSelector, the policy's own namespace; without
  podSelector, every pod of those namespaces; separate items are OR;
- `ipBlock` matches addresses in `cidr` but not in any `except`, pods included (no NAT
  between pods here, so a pod's address is what a rule sees); a block of one family matches
  no address of the other;
- the plan is family-free: a pod's addresses (one per family) are all set members and its
  plan carries them all; families.py splits the plan per family for the dataplanes;
- a named port is resolved on the DESTINATION pod from its container ports by name and
  protocol: for ingress that is the isolated pod itself (a port number, or nothing when it has
  no such port); for egress every destination may differ, so the rule becomes a set of
  (address, protocol:port) pairs, one per peer pod that has the port.

Fail closed, for what kube_objects.py could not read: a pod whose labels are unknown is
isolated by every policy of its namespace (in that policy's directions) but gets allows only
from policies with an empty podSelector (the ones certain to select it), and it matches a
selector peer only when that selector is empty; a namespace whose labels are unknown matches
only an empty namespaceSelector. Each policy is planned inside a guard: one that fails to
plan isolates every local pod of its namespace both ways, allowing nothing, and is reported
in `NodePlan.problems`; it costs no other policy its rules.

Pod selector peers become `SetRef`s (one ipset per distinct scope, shared by every rule that
names it), so a pod gaining a label changes set members and no rule. Host-network pods and
pods without an address are never set members and never programmed.
"""
from __future__ import annotations

import enum
import functools
import hashlib
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from typing import NamedTuple
from dataclasses import dataclass, field

from netagent.kernel import owned
from netagent.kernel.families import IpFamily
from netagent.kernel.ipset.model import DEFAULT_MAX_ELEMENTS
from netagent.policy.model import (
    IpBlock,
    NamespaceInfo,
    NetworkPolicy,
    Peer,
    PodInfo,
    PodScope,
    PolicyType,
    PortSpec,
    Protocol,
    Rule,
)


class SetKind(enum.Enum):
    PODS = "pods"            # hash:ip, the addresses of a scope's pods
    EXCEPT = "except"        # hash:net, an ipBlock's except list
    NETS = "nets"            # hash:net, a rule's ipBlocks that have no except (two or more)
    NAMED = "named"          # hash:ip,port, a named port resolved on each destination pod


class PortMember(NamedTuple):
    """A named-port set's member: a destination pod's address and the port its name resolved to
    there. Typed, so each dataplane spells it its own way (ipset `addr,proto:port`, an nft
    concatenation) and nothing parses it back."""
    address: str
    protocol: str            # lower case, as both tools spell it: tcp, udp, sctp
    port: int


Member = str | PortMember    # an address or network (PODS, EXCEPT, NETS), or a PortMember (NAMED)


def member_address(member: Member) -> str:
    """The address (or network) a set member is about."""
    return member.address if isinstance(member, PortMember) else member


def capacity_for(members: int) -> int:
    """A set's `maxelem`, sized from its members: the ipset default while that leaves room to
    double, else the power of two that does (the set is then a new one, see `SetRef.name`)."""
    capacity = DEFAULT_MAX_ELEMENTS
    while capacity < 2 * members:
        capacity *= 2
    return capacity


@dataclass(frozen=True)
class SetRef:
    kind: SetKind
    key: str                 # what the set means, in words; the name is derived from it
    capacity: int = DEFAULT_MAX_ELEMENTS      # its maxelem (capacity_for its members)
    family: IpFamily = IpFamily.V4            # the family it is rendered in: the plan's are V4's,
                                              # families.py gives the IPv6 half its own (ipset: global) name

    @functools.cached_property
    def _hash(self) -> int:
        return hash((self.kind.value, self.key, self.capacity, self.family))

    def __hash__(self) -> int:       # computed once: a plan hashes each set reference many times
        return self._hash

    @functools.cached_property
    def name(self) -> str:
        """Derived from what the set means and, above the default, its capacity: a set that
        outgrows its maxelem (which the kernel cannot change in place) becomes a new set, which
        the rules switch to in one restore before the old one is destroyed."""
        size = "" if self.capacity == DEFAULT_MAX_ELEMENTS else f"\0{self.capacity}"
        digest = hashlib.sha256(f"{self.kind.value}\0{self.key}{size}".encode("utf-8", "surrogatepass")).hexdigest()[:16]
        prefix = owned.POLICY_SET_PREFIX if self.family is IpFamily.V4 else owned.POLICY_SET6_PREFIX
        return f"{prefix}{digest}"


@dataclass(frozen=True)
class PortMatch:
    protocol: Protocol
    first: int | None = None  # None: every port of the protocol
    last: int | None = None

    @functools.cached_property
    def _hash(self) -> int:
        return hash((self.protocol.value, self.first, self.last))

    def __hash__(self) -> int:
        return self._hash


@dataclass(frozen=True)
class CidrMatch:
    cidr: str
    excepts: SetRef | None = None


@dataclass(frozen=True)
class Allow:
    """One allowed (peer, port) of one rule. `peer` None: any peer; `port` None: any port;
    `named` (egress named ports): the destination address and port must be in that set.
    Instances are shared by every pod a rule applies to; the hash is computed once."""
    origin: str                                   # "ns/policy ingress[0]"
    peer: SetRef | CidrMatch | None = None
    port: PortMatch | None = None
    named: SetRef | None = None

    @functools.cached_property
    def match(self) -> tuple:
        """What the allow matches (the origin aside): equal allows are one rule."""
        return (self.peer, self.port, self.named)

    @functools.cached_property
    def _hash(self) -> int:
        return hash((self.origin, *self.match))

    @functools.cached_property
    def refs(self) -> tuple[SetRef, ...]:
        """The sets it refers to (`set_refs`): its named-port set, its peer's set or except set."""
        peer = self.peer
        found = () if self.named is None else (self.named,)
        if isinstance(peer, SetRef):
            return (*found, peer)
        if isinstance(peer, CidrMatch) and peer.excepts is not None:
            return (*found, peer.excepts)
        return found

    def __hash__(self) -> int:
        return self._hash


@dataclass(frozen=True)
class PodPlan:
    """A local pod: None per direction = open; a tuple = isolated, allowing only these."""
    key: str
    ip: str                                       # the primary address (per family: that family's)
    ingress: tuple[Allow, ...] | None
    egress: tuple[Allow, ...] | None
    ingress_policies: tuple[str, ...] = ()        # keys of the policies isolating it for ingress
    egress_policies: tuple[str, ...] = ()         # ... for egress
    ips: tuple[str, ...] = ()                     # dual-stack: every address, `ip` first (families.py splits)

    @functools.cached_property
    def _hash(self) -> int:
        return hash((self.key, self.ip, self.ingress, self.egress, self.ingress_policies, self.egress_policies,
                     self.ips))

    def __hash__(self) -> int:       # computed once: the renderers' caches are keyed by pod plans
        return self._hash

    @property
    def addresses(self) -> tuple[str, ...]:
        return self.ips or (self.ip,)

    @property
    def policies(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(self.ingress_policies + self.egress_policies))

    @property
    def isolated(self) -> bool:
        return self.ingress is not None or self.egress is not None


@dataclass(frozen=True)
class NodePlan:
    pods: tuple[PodPlan, ...]
    sets: Mapping[SetRef, frozenset[Member]] = field(default_factory=dict)
    problems: tuple[str, ...] = ()            # policies that could not be planned (read closed)


@dataclass
class ClusterView:
    """The parsed objects the plan is computed from, keyed `ns/name` (namespaces by name)."""
    pods: dict[str, PodInfo] = field(default_factory=dict)
    namespaces: dict[str, NamespaceInfo] = field(default_factory=dict)
    policies: dict[str, NetworkPolicy] = field(default_factory=dict)


class Planner:
    def __init__(self, view: ClusterView, *, known: Mapping[SetRef, frozenset[Member]] | None = None) -> None:
        """`known`: sets whose members are already known for this view (`plan_with_pod`'s)."""
        self.view = view
        self._known = {(ref.kind, ref.key): (ref, members) for ref, members in (known or {}).items()}
        self.sets: dict[SetRef, frozenset[Member]] = {}
        self._refs: dict[tuple[SetKind, str], SetRef] = {}
        self._scope_pods: dict[PodScope, tuple[PodInfo, ...]] = {}
        self._rule_allows: dict[tuple[int, PolicyType], list] = {}
        self._named_allows: dict[tuple[int, int], Allow] = {}

    @functools.cached_property
    def by_namespace(self) -> dict[str, list[PodInfo]]:
        """Pods with an address, by namespace (built when first needed: one pod's plan may not)."""
        found: dict[str, list[PodInfo]] = defaultdict(list)
        for pod in self.view.pods.values():
            if addressed(pod):
                found[pod.namespace].append(pod)
        return found

    @functools.cached_property
    def namespace_labels(self) -> dict[str, dict[str, str] | None]:
        """Each namespace's labels (None: unknown); a namespace not cached has only its name label."""
        labels: dict[str, dict[str, str] | None] = {
            name: info.label_map if info.labels_known else None for name, info in self.view.namespaces.items()}
        for name in self.by_namespace:
            labels.setdefault(name, NamespaceInfo(name, ()).label_map)
        return labels

    def labels_of_namespace(self, name: str) -> dict[str, str] | None:
        info = self.view.namespaces.get(name)
        if info is None:
            return NamespaceInfo(name, ()).label_map
        return info.label_map if info.labels_known else None

    def scope_pods(self, scope: PodScope) -> tuple[PodInfo, ...]:
        found = self._scope_pods.get(scope)
        if found is None:
            if scope.namespaces is None:
                namespaces: Iterable[str] = [scope.own_namespace]
            else:
                selector = scope.namespaces
                namespaces = [name for name, labels in self.namespace_labels.items()
                              if (selector.matches(labels) if labels is not None else selector.is_empty)]
            found = tuple(pod for name in namespaces for pod in self.by_namespace.get(name, ())
                          if _pod_matches(scope, pod))
            self._scope_pods[scope] = found
        return found

    def in_scope(self, scope: PodScope, pod: PodInfo) -> bool:
        """Whether `scope` means `pod` (scope_pods' rule, for one pod)."""
        if scope.namespaces is None:
            if pod.namespace != scope.own_namespace:
                return False
        else:
            labels = self.labels_of_namespace(pod.namespace)
            if not (scope.namespaces.matches(labels) if labels is not None else scope.namespaces.is_empty):
                return False
        return _pod_matches(scope, pod)

    def all_pods(self) -> Iterable[PodInfo]:
        return (pod for pods in self.by_namespace.values() for pod in pods)

    def set_ref(self, kind: SetKind, key: str, members: Callable[[], Iterable[Member]]) -> SetRef:
        """The set meaning `key`, its members computed once per plan."""
        ref = self._refs.get((kind, key))
        if ref is None and (kind, key) in self._known:
            ref, self.sets[ref] = self._known[(kind, key)]
            self._refs[(kind, key)] = ref
        elif ref is None:
            found = frozenset(members())
            ref = self._refs[(kind, key)] = SetRef(kind, key, capacity_for(len(found)))
            self.sets[ref] = found
        return ref

    def peer_match(self, peer: Peer) -> SetRef | CidrMatch:
        if peer.ip_block is not None:
            block = peer.ip_block
            excepts = None
            if block.excepts:
                excepts = self.set_ref(SetKind.EXCEPT, " ".join(block.excepts), lambda: block.excepts)
            return CidrMatch(block.cidr, excepts)
        scope = peer.scope
        assert scope is not None
        return self.set_ref(SetKind.PODS, scope.key(),
                            lambda: (ip for pod in self.scope_pods(scope) for ip in pod.addresses))

    def named_set(self, peer: Peer | None, spec: PortSpec) -> SetRef:
        assert isinstance(spec.port, str)
        port_name, protocol = spec.port, spec.protocol

        def members() -> set[PortMember]:
            if peer is None:
                population: Iterable[PodInfo] = self.all_pods()
            elif peer.scope is not None:
                population = self.scope_pods(peer.scope)
            else:
                block = peer.ip_block
                assert block is not None
                population = self.all_pods()
            found: set[PortMember] = set()
            for pod in population:
                number = pod.named_port(port_name, protocol)
                if number is None:
                    continue
                for ip in pod.addresses:
                    if peer is None or peer.ip_block is None or peer.ip_block.contains(ip):
                        found.add(PortMember(ip, protocol.value.lower(), number))
            return found
        return self.set_ref(SetKind.NAMED, named_key(peer, spec), members)

    def allows(self, rule: Rule, *, direction: PolicyType, pod: PodInfo, origin: str) -> list[Allow]:
        """The rule's allows for `pod`. Everything but an ingress named port is the same for
        every pod the policy selects, so it is built once per rule and plan (same instances)."""
        key = (id(rule), direction)
        shared = self._rule_allows.get(key)
        if shared is None:
            shared = self._rule_allows[key] = self._shared_allows(rule, direction=direction, origin=origin)
        found = []
        for item in shared:
            if isinstance(item, Allow):
                found.append(item)
                continue
            peer_match, spec = item
            assert isinstance(spec.port, str)
            number = pod.named_port(spec.port, spec.protocol)
            if number is not None:   # one instance per (item, number) and plan: pods naming the same number share it
                named_key = (id(item), number)
                allow = self._named_allows.get(named_key)
                if allow is None:
                    allow = self._named_allows[named_key] = Allow(origin, peer_match,
                                                                  PortMatch(spec.protocol, number, number))
                found.append(allow)
        return found

    def _shared_allows(self, rule: Rule, *, direction: PolicyType,
                       origin: str) -> list[Allow | tuple[SetRef | CidrMatch | None, PortSpec]]:
        peers: Iterable[Peer | None] = rule.peers if rule.peers is not None else (None,)
        ports: Iterable[PortSpec | None] = rule.ports if rule.ports is not None else (None,)
        found: list[Allow | tuple[SetRef | CidrMatch | None, PortSpec]] = []
        grouped, nets = self._nets(rule.peers or ())
        first_of_group = True
        for peer in peers:
            in_group = peer in grouped
            for spec in ports:
                named_egress = spec is not None and isinstance(spec.port, str) and direction is PolicyType.EGRESS
                if in_group and not named_egress and not first_of_group:
                    continue                                   # the group's one allow is already there
                match = nets if in_group and not named_egress else None
                if spec is None:
                    found.append(Allow(origin, match or self._peer(peer), None))
                elif not isinstance(spec.port, str):
                    last = spec.end_port if spec.end_port is not None else spec.port
                    found.append(Allow(origin, match or self._peer(peer), PortMatch(spec.protocol, spec.port, last)))
                elif direction is PolicyType.INGRESS:
                    found.append((match or self._peer(peer), spec))     # resolved on each selected pod
                else:
                    found.append(Allow(origin, None, None, named=self.named_set(peer, spec)))
            first_of_group = first_of_group and not in_group
        return found

    def _nets(self, peers: Iterable[Peer]) -> tuple[frozenset[Peer], SetRef | None]:
        """A rule's ipBlocks without except (two or more, /0 aside) as one hash:net set: one
        rule per port for any number of blocks, rather than one per block."""
        plain = frozenset(peer for peer in peers if peer.ip_block is not None and not peer.ip_block.excepts
                          and not peer.ip_block.cidr.endswith("/0"))
        if len(plain) < 2:
            return frozenset(), None
        cidrs = sorted({peer.ip_block.cidr for peer in plain if peer.ip_block is not None})
        text = " ".join(cidrs)
        key = f"ipBlocks {text}" if len(text) <= 160 else \
            f"ipBlocks {len(cidrs)} sha256:{hashlib.sha256(text.encode()).hexdigest()[:32]}"
        return plain, self.set_ref(SetKind.NETS, key, lambda: cidrs)

    def _peer(self, peer: Peer | None) -> SetRef | CidrMatch | None:
        return None if peer is None else self.peer_match(peer)


def addressed(pod: PodInfo) -> bool:
    """Whether the pod counts at all: a set member (and, when local, planned) once it has an address."""
    return pod.ip is not None and not pod.host_network


def named_key(peer: Peer | None, spec: PortSpec) -> str:
    """What an egress named-port set means (its `SetRef.key`): the peer and the port's name."""
    where = "any peer" if peer is None else peer.scope.key() if peer.scope is not None else _block_key(peer.ip_block)
    return f"{where} port {spec.port}/{spec.protocol.value}"


def _pod_matches(scope: PodScope, pod: PodInfo) -> bool:
    return scope.pods.matches(pod.label_map) if pod.labels_known else scope.pods.is_empty


def _block_key(block: IpBlock | None) -> str:
    assert block is not None
    return f"ipBlock {block.cidr}" + (f" except {' '.join(block.excepts)}" if block.excepts else "")


def plan_node(view: ClusterView, *, node_name: str) -> NodePlan:
    """The plan for every pod of `node_name` that has an address (isolated or not)."""
    planner = Planner(view)
    local = sorted((pod for pod in planner.all_pods() if pod.node_name == node_name), key=lambda p: p.key)
    allowed: dict[str, dict[PolicyType, list[Allow]]] = {pod.key: {} for pod in local}
    selecting: dict[tuple[str, PolicyType], list[str]] = defaultdict(list)
    local_by_namespace: dict[str, list[PodInfo]] = defaultdict(list)
    for pod in local:
        local_by_namespace[pod.namespace].append(pod)
    problems = []
    for policy in sorted(view.policies.values(), key=lambda p: p.key):
        candidates = local_by_namespace.get(policy.namespace, ())
        try:
            contribution = policy_allows(planner, policy, candidates)
        except Exception as error:    # the guard: this policy isolates its namespace, allowing nothing
            problems.append(f"NetworkPolicy {policy.key}: cannot be planned ({type(error).__name__}: "
                            f"{str(error)[:120]}); it isolates every pod of {policy.namespace} both ways")
            contribution = [(pod, direction, []) for pod in candidates
                            for direction in (PolicyType.INGRESS, PolicyType.EGRESS)]
        for pod, direction, allows in contribution:
            selecting[(pod.key, direction)].append(policy.key)
            allowed[pod.key].setdefault(direction, []).extend(allows)
    plans = [pod_plan_of(pod, allowed[pod.key], selecting) for pod in local]
    distinct = {allow for plan in plans for allows in (plan.ingress or (), plan.egress or ()) for allow in allows}
    used = {ref for allow in distinct for ref in set_refs(allow)}
    return NodePlan(tuple(plans), {ref: members for ref, members in planner.sets.items() if ref in used},
                    tuple(problems))


def pod_plan_of(pod: PodInfo, directions: Mapping[PolicyType, list[Allow]],
              selecting: Mapping[tuple[str, PolicyType], list[str]]) -> PodPlan:
    assert pod.ip is not None
    return PodPlan(pod.key, pod.ip,
                   _dedup(directions.get(PolicyType.INGRESS)), _dedup(directions.get(PolicyType.EGRESS)),
                   tuple(selecting.get((pod.key, PolicyType.INGRESS), ())),
                   tuple(selecting.get((pod.key, PolicyType.EGRESS), ())), pod.ips)


def policy_allows(planner: Planner, policy: NetworkPolicy,
                   candidates: Iterable[PodInfo]) -> list[tuple[PodInfo, PolicyType, list[Allow]]]:
    """(pod, direction, allows) for each local pod the policy isolates. A pod whose labels are
    unknown is isolated whatever the selector, but allowed only what a policy certain to
    select it (an empty podSelector) allows."""
    found = []
    for pod in candidates:
        certain = policy.pod_selector.matches(pod.label_map) if pod.labels_known else policy.pod_selector.is_empty
        if not certain and pod.labels_known:
            continue
        for direction in (PolicyType.INGRESS, PolicyType.EGRESS):
            if direction not in policy.policy_types:
                continue
            allows: list[Allow] = []
            for index, rule in enumerate(policy.rules(direction) if certain else ()):
                origin = f"{policy.key} {direction.value.lower()}[{index}]"
                allows.extend(planner.allows(rule, direction=direction, pod=pod, origin=origin))
            found.append((pod, direction, allows))
    return found


def _dedup(allows: list[Allow] | None) -> tuple[Allow, ...] | None:
    if allows is None:
        return None
    seen: dict[tuple, Allow] = {}
    for allow in allows:
        seen.setdefault(allow.match, allow)
    return tuple(seen.values())


def set_refs(allow: Allow) -> tuple[SetRef, ...]:
    """The sets an allow refers to (its named-port set, its peer's set or except set)."""
    return allow.refs
