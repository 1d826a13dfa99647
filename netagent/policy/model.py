"""The frozen values the policy engine reasons about: selectors, peers, ports, rules, policies,
pods and namespaces, as `networking.k8s.io/v1` defines them. Pure: no I/O, no parsing of dicts
(that is kube_objects.py).

Why its own module. The semantics (semantics.py), the renderer (render.py), the status
read-back and the tests all speak these values; keeping them free of API-dict details means
a policy is checked once, when parsed, and everything after works on values that cannot be
wrong. Every value is hashable, so identical selectors collapse into one ipset.
"""
from __future__ import annotations

import enum
import functools
import ipaddress
from dataclasses import dataclass

NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"  # set on every Namespace by the API server


class Protocol(enum.Enum):
    TCP = "TCP"
    UDP = "UDP"
    SCTP = "SCTP"


class PolicyType(enum.Enum):
    INGRESS = "Ingress"
    EGRESS = "Egress"


class Operator(enum.Enum):
    IN = "In"
    NOT_IN = "NotIn"
    EXISTS = "Exists"
    DOES_NOT_EXIST = "DoesNotExist"


Labels = tuple[tuple[str, str], ...]  # sorted (key, value) pairs: hashable labels


def labels_of(mapping: dict[str, str] | None) -> Labels:
    return tuple(sorted((mapping or {}).items()))


@dataclass(frozen=True)
class Requirement:
    key: str
    operator: Operator
    values: tuple[str, ...] = ()

    def matches(self, labels: dict[str, str]) -> bool:
        if self.operator is Operator.EXISTS:
            return self.key in labels
        if self.operator is Operator.DOES_NOT_EXIST:
            return self.key not in labels
        present = self.key in labels and labels[self.key] in self.values
        return present if self.operator is Operator.IN else not present


@dataclass(frozen=True)
class LabelSelector:
    """A metav1.LabelSelector; the empty selector matches everything."""
    match_labels: Labels = ()
    expressions: tuple[Requirement, ...] = ()

    def matches(self, labels: dict[str, str]) -> bool:
        return (all(labels.get(key) == value for key, value in self.match_labels)
                and all(requirement.matches(labels) for requirement in self.expressions))

    @property
    def is_empty(self) -> bool:
        return not self.match_labels and not self.expressions

    def describe(self) -> str:
        parts = [f"{key}={value}" for key, value in self.match_labels]
        for req in self.expressions:
            values = f" ({','.join(req.values)})" if req.values else ""
            parts.append(f"{req.key} {req.operator.value}{values}")
        return ",".join(parts) or "{}"


@dataclass(frozen=True)
class IpBlock:
    cidr: str                           # canonical network text of either family, e.g. 10.0.0.0/8, fd00::/8
    excepts: tuple[str, ...] = ()       # canonical, sorted, of the cidr's family and inside it

    def contains(self, address: str) -> bool:
        ip = ipaddress.ip_address(address)
        if ip not in ipaddress.ip_network(self.cidr):
            return False
        return not any(ip in ipaddress.ip_network(net) for net in self.excepts)


@dataclass(frozen=True)
class PodScope:
    """Which pods a selector peer means: pods matching `pods` in the namespaces matching
    `namespaces`, or (namespaces None) in the policy's own namespace `own_namespace`."""
    pods: LabelSelector
    namespaces: LabelSelector | None
    own_namespace: str

    def key(self) -> str:
        return self._key

    @functools.cached_property
    def _key(self) -> str:
        where = f"ns[{self.namespaces.describe()}]" if self.namespaces is not None else f"ns={self.own_namespace}"
        return f"{where} pods[{self.pods.describe()}]"


@dataclass(frozen=True)
class Peer:
    """One item of `from`/`to`: pods (a scope) or an address block, never both."""
    scope: PodScope | None = None
    ip_block: IpBlock | None = None


@dataclass(frozen=True)
class PortSpec:
    """One item of `ports`. `port` None: every port of the protocol; a str: a named port,
    resolved per destination pod; `end_port`: the last port of a numeric range."""
    protocol: Protocol = Protocol.TCP
    port: int | str | None = None
    end_port: int | None = None


@dataclass(frozen=True)
class Rule:
    """One ingress/egress rule. `peers` None: every peer (the list was missing or empty);
    `ports` None: every port. An empty tuple (all items were unusable) matches nothing."""
    peers: tuple[Peer, ...] | None = None
    ports: tuple[PortSpec, ...] | None = None


@dataclass(frozen=True)
class NetworkPolicy:
    namespace: str
    name: str
    pod_selector: LabelSelector
    policy_types: frozenset[PolicyType]
    ingress: tuple[Rule, ...] = ()
    egress: tuple[Rule, ...] = ()
    closed: str = ""            # why it was read closed (isolates, allows nothing); "" when read fully

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    def rules(self, direction: PolicyType) -> tuple[Rule, ...]:
        return self.ingress if direction is PolicyType.INGRESS else self.egress

    @functools.cached_property
    def scopes(self) -> tuple[PodScope, ...]:
        """The pod scopes its rules' peers name (both directions)."""
        return tuple(peer.scope for rule in (*self.ingress, *self.egress) for peer in rule.peers or ()
                     if peer.scope is not None)


@dataclass(frozen=True)
class ContainerPort:
    name: str
    protocol: Protocol
    port: int


@dataclass(frozen=True)
class PodInfo:
    namespace: str
    name: str
    labels: Labels
    ip: str | None                      # the primary address (IPv4 when it has one); None until it has one
    node_name: str | None
    host_network: bool = False
    ports: tuple[ContainerPort, ...] = ()
    labels_known: bool = True           # False: labels unreadable (isolated by any policy, matched by none)
    ips: tuple[str, ...] = ()           # dual-stack: every address, `ip` first; () when `ip` is the only one

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def addresses(self) -> tuple[str, ...]:
        """Every address of the pod (one per family), none while `ip` is None."""
        return () if self.ip is None else (self.ips or (self.ip,))

    @functools.cached_property
    def label_map(self) -> dict[str, str]:
        return dict(self.labels)

    @functools.cached_property
    def _named_ports(self) -> dict[tuple[str, Protocol], int]:
        found: dict[tuple[str, Protocol], int] = {}
        for port in self.ports:
            found.setdefault((port.name, port.protocol), port.port)
        return found

    def named_port(self, name: str, protocol: Protocol) -> int | None:
        return self._named_ports.get((name, protocol))


@dataclass(frozen=True)
class NamespaceInfo:
    name: str
    labels: Labels
    labels_known: bool = True           # False: labels unreadable (only an empty selector matches it)

    @property
    def label_map(self) -> dict[str, str]:
        labels = dict(self.labels)
        labels[NAMESPACE_NAME_LABEL] = self.name      # as the API server forces it: no namespace claims another's name
        return labels
