"""What the IPVS backend wants in the kernel, computed from a ProxyState: pure, no kernel.

`render_service_port` turns one service port into a `ServicePortPlan`: its virtual servers
(one per address it is reachable at) with the real servers each should have, the addresses
the dummy device must hold, and its members of each ipset (proxy/ipvs/rules.py says what
each set is for). `render_ipvs` does that for every service port of a state. A plan is kept
per service port because a partial sync re-renders only the ports that changed and patches
the previous plan; `PlanIndex` then says whether an address, member or virtual server that a
changed port no longer wants is still wanted by another port (two ports of one Service share
their cluster IP; two Services selecting one pod share its hairpin member).

Virtual servers, per service port (its entry points, `ServicePort.entry_points`; endpoints chosen
once per sync by `ProxyState.selection`):
  cluster IP:port                                  -> the cluster set of endpoints
  each external IP, each load-balancer IP :port    -> the external set
  each NodePort address (NodeContext.nodeport_targets) :nodePort -> the external set
The service addresses are members of ADDRESSES and each (address, port) of CLUSTER-IP, EXTERNAL or
EXTERNAL-LOCAL, so the filter drops what reaches a service address on any other port.
All use the configured scheduler (round robin by default); ClientIP affinity is persistence
with the affinity timeout. Real servers are wanted at weight 1; the ones a sync finds in the
kernel but not in the plan are drained (proxy/ipvs/graceful.py), not cut.

A plan is of one family, its node's (every address of a `ProxyState` is); its members are keyed
by the IPv4 set names, which the backend maps to its family's sets (proxy/ipvs/rules.py,
`family_set`).

When two service ports claim one virtual server (the same external IP and port), the first
by name wins, so the outcome does not depend on dictionary order.
"""
from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from netagent.kernel.ipset import entry
from proxy.ipvs.device import DEFAULT_DEVICE
from proxy.ipvs.rules import (
    CLUSTER_IP_SET,
    EXTERNAL_LOCAL_SET,
    EXTERNAL_SET,
    HAIRPIN_SET,
    IPVS_SETS,
    LB_FIREWALL_SET,
    LB_SOURCES_SET,
    MASQUERADE_MARK,
    NO_ENDPOINTS_SET,
    NODEPORT_LOCAL_SET,
    NODEPORT_SET,
    SERVICE_ADDRESSES_SET,
)
from proxy.ipvs.table import Destination, Scheduler, VirtualServer, VirtualServerKey
from proxy.model import Endpoint, EntryKind, NodeContext, ProxyState, ServicePort, ServicePortName, TrafficPolicy
from proxy.selection import EndpointSelection
from proxy.source_ranges import source_ranges

DEFAULT_GRACEFUL_TIMEOUT = 15.0


@dataclass(frozen=True)
class IpvsSettings:
    scheduler: Scheduler = Scheduler.ROUND_ROBIN
    graceful_timeout: float = DEFAULT_GRACEFUL_TIMEOUT   # seconds a removed TCP/SCTP endpoint may drain
    device: str = DEFAULT_DEVICE
    masquerade_mark: int = MASQUERADE_MARK


@dataclass(frozen=True)
class PlannedVirtualServer:
    server: VirtualServer
    service: ServicePortName
    kind: EntryKind
    destinations: tuple[Destination, ...]

    @property
    def key(self) -> VirtualServerKey:
        return self.server.key


@dataclass(frozen=True)
class ServicePortPlan:
    name: ServicePortName
    virtual_servers: tuple[PlannedVirtualServer, ...]
    addresses: frozenset[str]
    members: Mapping[str, frozenset[str]] = field(default_factory=dict)   # set name -> members

    def __post_init__(self):
        object.__setattr__(self, "members", MappingProxyType({k: v for k, v in self.members.items() if v}))


@dataclass(frozen=True)
class IpvsPlan:
    services: Mapping[ServicePortName, ServicePortPlan]

    def __post_init__(self):
        object.__setattr__(self, "services", MappingProxyType(dict(self.services)))

    def index(self) -> PlanIndex:
        index = PlanIndex()
        for plan in self.services.values():
            index.add(plan)
        return index


def _destinations(endpoints: Iterable[Endpoint]) -> tuple[Destination, ...]:
    unique = {(e.ip, e.port) for e in endpoints}
    return tuple(Destination(ip, port) for ip, port in sorted(unique))


def render_service_port(service: ServicePort, selection: EndpointSelection, *, node: NodeContext,
                        settings: IpvsSettings) -> ServicePortPlan:
    """`selection`: the service port's endpoints as `ProxyState.selection` chose them."""
    cluster = _destinations(selection.cluster)
    external = cluster if selection.external == selection.cluster else _destinations(selection.external)
    protocol = service.protocol
    persistence = service.affinity_timeout or 0
    external_local = service.external_policy is TrafficPolicy.LOCAL
    sources = source_ranges(service.load_balancer_source_ranges, node.family)
    servers: list[PlannedVirtualServer] = []
    members: dict[str, set[str]] = defaultdict(set)
    seen: set[tuple[EntryKind, str | None]] = set()
    addresses: set[str] = set()   # the service addresses (not the NodePort ones)
    for point in service.entry_points(node):
        address = point.address
        if address is None or (point.kind, address) in seen:
            continue
        seen.add((point.kind, address))
        if point.kind is EntryKind.NODE_PORT and address in addresses:
            continue
        servers.append(PlannedVirtualServer(VirtualServer(VirtualServerKey(address, protocol, point.port),
                                                          scheduler=settings.scheduler.value,
                                                          persistence_timeout=persistence),
                                            service.name, point.kind,
                                            external if point.kind.external else cluster))
        entry_member = entry(address, protocol, point.port)
        if point.kind is EntryKind.CLUSTER_IP:
            members[CLUSTER_IP_SET.name].add(entry_member)
        elif point.kind is EntryKind.NODE_PORT:
            members[(NODEPORT_LOCAL_SET if external_local else NODEPORT_SET).name].add(entry_member)
        else:
            members[(EXTERNAL_LOCAL_SET if external_local else EXTERNAL_SET).name].add(entry_member)
        if point.kind is EntryKind.LOAD_BALANCER and sources is not None:
            members[LB_FIREWALL_SET.name].add(entry_member)
            members[LB_SOURCES_SET.name].update(entry(address, protocol, point.port, extra_ip=source)
                                                for source in sources)
        if point.kind is not EntryKind.NODE_PORT:
            addresses.add(address)
    members[SERVICE_ADDRESSES_SET.name].update(addresses)   # other ports of these are dropped (rules.py)
    hairpin = cluster if not external or external is cluster else _destinations(selection.all_selected)
    members[HAIRPIN_SET.name].update(entry(d.address, protocol, d.port, extra_ip=d.address) for d in hairpin)
    if not selection.has_endpoints:
        members[NO_ENDPOINTS_SET.name].update(entry(s.key.address, protocol, s.key.port) for s in servers)
    return ServicePortPlan(service.name, tuple(servers), frozenset(addresses),
                           {name: frozenset(values) for name, values in members.items()})


def render_ipvs(state: ProxyState, settings: IpvsSettings) -> IpvsPlan:
    return IpvsPlan({name: render_service_port(service, state.selection(name), node=state.node, settings=settings)
                     for name, service in sorted(state.services.items())})


class PlanIndex:
    """Who wants what, across service ports: the reverse of a plan, updated per port."""

    def __init__(self) -> None:
        self.addresses: dict[str, set[ServicePortName]] = defaultdict(set)
        self.members: dict[str, dict[str, set[ServicePortName]]] = {spec.name: defaultdict(set) for spec in IPVS_SETS}
        self.servers: dict[VirtualServerKey, dict[ServicePortName, PlannedVirtualServer]] = defaultdict(dict)

    def add(self, plan: ServicePortPlan) -> None:
        for address in plan.addresses:
            self.addresses[address].add(plan.name)
        for set_name, values in plan.members.items():
            for member in values:
                self.members[set_name][member].add(plan.name)
        for planned in plan.virtual_servers:
            self.servers[planned.key][plan.name] = planned

    def remove(self, plan: ServicePortPlan) -> None:
        for address in plan.addresses:
            _discard(self.addresses, address, plan.name)
        for set_name, values in plan.members.items():
            for member in values:
                _discard(self.members[set_name], member, plan.name)
        for planned in plan.virtual_servers:
            owners = self.servers.get(planned.key)
            if owners is not None:
                owners.pop(plan.name, None)
                if not owners:
                    del self.servers[planned.key]

    def wanted_address(self, address: str) -> bool:
        return address in self.addresses

    def wanted_member(self, set_name: str, member: str) -> bool:
        return member in self.members[set_name]

    def set_members(self, set_name: str) -> frozenset[str]:
        return frozenset(self.members[set_name])

    def server(self, key: VirtualServerKey) -> PlannedVirtualServer | None:
        """The planned virtual server at `key`: the claim of the first service port by name."""
        owners = self.servers.get(key)
        return _first_claim(owners) if owners else None

    def all_servers(self) -> list[PlannedVirtualServer]:
        """Every planned virtual server by key (`remove` drops a key with its last claim)."""
        return [_first_claim(self.servers[key]) for key in sorted(self.servers)]


def _first_claim(owners: dict[ServicePortName, PlannedVirtualServer]) -> PlannedVirtualServer:
    """Of the service ports claiming one virtual server, the first by name wins."""
    return owners[min(owners)]


def _discard(index: dict, key, name: ServicePortName) -> None:
    owners = index.get(key)
    if owners is not None:
        owners.discard(name)
        if not owners:
            del index[key]
