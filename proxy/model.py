"""The service proxy's model: what a node must program, free of Kubernetes objects and kernels.

Trackers turn Services and EndpointSlices into these values; backends (iptables, IPVS, eBPF)
turn them into kernel state. Everything here is a frozen value, so a `ProxyState` snapshot
can be handed to a backend while the watch keeps recording, and two snapshots compare with
`==` (which is how a partial sync finds what changed).

The unit is the *service port* (one Service, one of its ports), as in kube-proxy: each has
its own virtual addresses, its own endpoints (EndpointSlice ports are matched to it by
name) and its own chain, virtual server or map slot.

Every value of one `ProxyState` is of one IP family (`state.family`, its node's): cluster IPs,
external and load-balancer IPs, source ranges, endpoints and node addresses. Dual-stack is two
states side by side, one per family, each programmed by its own backend, as kube-proxy runs one
proxier per family; the parser (`kube_objects.py`) splits a dual-stack Service between them.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from types import MappingProxyType
from typing import TYPE_CHECKING

from netagent.kernel.families import IpFamily

if TYPE_CHECKING:
    from proxy.selection import EndpointSelection

DEFAULT_AFFINITY_TIMEOUT = 10800  # seconds, the Kubernetes default for ClientIP affinity


class Protocol(str, Enum):
    TCP = "TCP"
    UDP = "UDP"
    SCTP = "SCTP"

    @property
    def lowercase(self) -> str:
        """The spelling iptables, ipset and conntrack use."""
        return self.value.lower()


class TrafficPolicy(str, Enum):
    CLUSTER = "Cluster"
    LOCAL = "Local"


class EntryKind(str, Enum):
    """How traffic enters a service port; the word is the one `netagent status` shows and the
    iptables backend writes in its entry rules' comments."""
    CLUSTER_IP = "ClusterIP"
    EXTERNAL_IP = "ExternalIP"
    LOAD_BALANCER = "LoadBalancer"
    NODE_PORT = "NodePort"

    @property
    def external(self) -> bool:
        """NodePort, external and load-balancer traffic: `external_policy` applies."""
        return self is not EntryKind.CLUSTER_IP


@dataclass(frozen=True)
class EntryPoint:
    """One address and port a service port is reachable at. `address` None: a NodePort on
    every local address (the backend spells out where: iptables matches LOCAL, conntrack
    matches any destination)."""
    kind: EntryKind
    address: str | None
    port: int


@dataclass(frozen=True, order=True)
class ServicePortName:
    """Names one port of one Service: `namespace/name:port` (`namespace/name` when unnamed)."""

    namespace: str
    name: str
    port: str = ""

    @property
    def service(self) -> str:
        return f"{self.namespace}/{self.name}"

    def __str__(self) -> str:
        return f"{self.service}:{self.port}" if self.port else self.service


@dataclass(frozen=True)
class ServicePort:
    """One port of one Service, with every address it is reachable at and how to balance it.

    `node_port`, `external_ips` and `load_balancer_ips` are the *external* entry points:
    `external_policy` applies to them; `internal_policy` to the cluster IP. Source ranges
    restrict only the load-balancer IPs, as in Kubernetes.
    """

    name: ServicePortName
    protocol: Protocol
    port: int
    cluster_ip: str
    node_port: int | None = None
    external_ips: tuple[str, ...] = ()
    load_balancer_ips: tuple[str, ...] = ()
    load_balancer_source_ranges: tuple[str, ...] = ()
    affinity_timeout: int | None = None  # seconds of ClientIP affinity; None: no affinity
    internal_policy: TrafficPolicy = TrafficPolicy.CLUSTER
    external_policy: TrafficPolicy = TrafficPolicy.CLUSTER
    health_check_node_port: int | None = None
    prefer_close: bool = False  # trafficDistribution PreferClose or topology-mode Auto: use hints

    @property
    def has_external_addresses(self) -> bool:
        return bool(self.node_port or self.external_ips or self.load_balancer_ips)

    @property
    def external_local(self) -> bool:
        return self.has_external_addresses and self.external_policy is TrafficPolicy.LOCAL

    def entry_points(self, node: NodeContext | None = None) -> tuple[EntryPoint, ...]:
        """Every way in, in the one order every backend writes them: the cluster IP, each
        external IP, each load-balancer IP (all at `port`), then the NodePort: one entry per
        `node.nodeport_targets` address, or one with no address when `node` is None. Not
        deduplicated: a backend that keys entries by address decides who wins a clash."""
        points = [EntryPoint(EntryKind.CLUSTER_IP, self.cluster_ip, self.port)]
        points += [EntryPoint(EntryKind.EXTERNAL_IP, address, self.port) for address in self.external_ips]
        points += [EntryPoint(EntryKind.LOAD_BALANCER, address, self.port) for address in self.load_balancer_ips]
        if self.node_port:
            addresses: tuple[str | None, ...] = (None,) if node is None else node.nodeport_targets
            points += [EntryPoint(EntryKind.NODE_PORT, address, self.node_port) for address in addresses]
        return tuple(points)


@dataclass(frozen=True)
class Endpoint:
    """One backend address of a service port, with its EndpointSlice conditions and placement."""

    ip: str
    port: int
    ready: bool = True
    serving: bool = True
    terminating: bool = False
    node_name: str | None = None
    zone: str | None = None
    zone_hints: frozenset[str] = frozenset()
    node_hints: frozenset[str] = frozenset()

    @property
    def address(self) -> str:
        return f"{self.ip}:{self.port}"

    @property
    def serving_terminating(self) -> bool:
        return self.serving and self.terminating


@dataclass(frozen=True)
class NodeContext:
    """What the proxy knows about its own node.

    `family` is the IP family of the state it belongs to, and every address here is of it:
    `nodeport_addresses` are the local addresses NodePorts answer on (empty: every local
    address, kube-proxy's default); `local_addresses` are all the node's addresses of the
    family (not loopback, not link-local, not a proxy's own service-address device), for
    backends that need NodePort addresses spelled out (IPVS); `cluster_cidr` is the family's
    pod network, used to tell pod traffic (not masqueraded) from host and off-cluster traffic
    (masqueraded) to a cluster IP.
    """

    name: str
    zone: str | None = None
    cluster_cidr: str | None = None
    nodeport_addresses: tuple[str, ...] = ()
    local_addresses: tuple[str, ...] = ()
    family: IpFamily = IpFamily.V4

    @property
    def nodeport_targets(self) -> tuple[str, ...]:
        """The addresses a NodePort answers on, spelled out."""
        return self.nodeport_addresses or self.local_addresses


def _frozen(mapping: Mapping) -> Mapping:
    return MappingProxyType(dict(mapping))


@dataclass(frozen=True)
class ProxyState:
    """A snapshot of everything a backend programs: service ports and their endpoints."""

    node: NodeContext
    services: Mapping[ServicePortName, ServicePort] = field(default_factory=dict)
    endpoints: Mapping[ServicePortName, tuple[Endpoint, ...]] = field(default_factory=dict)

    _selections: dict[ServicePortName, EndpointSelection] = field(default_factory=dict, init=False, repr=False,
                                                                   compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "services", _frozen(self.services))
        object.__setattr__(self, "endpoints", _frozen(self.endpoints))

    @property
    def family(self) -> IpFamily:
        return self.node.family

    def endpoints_of(self, name: ServicePortName) -> tuple[Endpoint, ...]:
        return self.endpoints.get(name, ())

    def selection(self, name: ServicePortName) -> EndpointSelection:
        """`select_endpoints` for one service port of this state, computed once: every renderer,
        conntrack cleanup and the metrics of a sync ask the same snapshot, so a changed port is
        selected once per sync (the state is frozen, so the answer cannot go stale)."""
        found = self._selections.get(name)
        if found is None:
            from proxy.selection import select_endpoints   # selection.py imports this module
            found = select_endpoints(self.services[name], self.endpoints_of(name), self.node)
            self._selections[name] = found
        return found

    def changed_since(self, previous: "ProxyState") -> frozenset[ServicePortName]:
        """Service ports added, removed, or whose definition or endpoints differ from `previous`."""
        names = set(self.services) | set(previous.services)
        return frozenset(
            name
            for name in names
            if self.services.get(name) != previous.services.get(name)
            or self.endpoints_of(name) != previous.endpoints_of(name)
        )
