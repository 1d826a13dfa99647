"""What the eBPF backend wants in its maps, computed from a ProxyState: pure, no kernel.

Per service port (`render_service_port`), endpoints chosen by proxy.selection:
- one `na_svc` entry per address it is reachable at: the cluster IP; each external IP and
  load-balancer IP at the service port; each NodePort address (NodeContext.nodeport_targets)
  at the node port. Every entry carries two backend sets: the *cluster* set, which the socket
  load balancer uses (every connection it sees is made on this node, and kube-proxy sends
  node- and pod-originated traffic to external addresses by the cluster policy too), and the
  *external* set (externalTrafficPolicy applied) for packets arriving from outside. When the
  two sets are equal they are one set.
- one `na_slots` entry per backend of each set: `(set id, slot) -> backend`, slots 0..n-1.
  Weights are slots (every endpoint has weight 1 today). Slot positions are kept from the
  previous layout (`assign_slots`): a removed endpoint's slot is refilled by a new one or by
  the last slot, so one endpoint change writes O(1) entries however many the service has.
- one `na_setname` entry per set: its id -> the service port's name and the set's role, which
  is how a restarted agent finds its ids again (adoption) and how read-back names services.
- one `na_lbsrc` entry per `loadBalancerSourceRanges` range of the family, keyed by the external set
  (the tc path checks a client against them on the load-balancer IPs).
Backends on this node are flagged (the tc path SNATs only traffic to other nodes).

Per family (`family`, the backend's, whose ProxyState holds addresses of that family only):
entries go to that family's maps (ebpf/maps.py packs by the address), source ranges included;
an address of the other family is skipped rather than packed at the wrong width.

Set ids are given by the caller (`SetIds`, kept by the backend), so rendering stays pure.
When two service ports claim one address (the same external IP and port), the first by name
wins, as in the IPVS backend.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

from ebpf import maps as M
from netagent.kernel.families import IpFamily
from proxy.model import Endpoint, EntryKind, NodeContext, ServicePort, ServicePortName
from proxy.selection import EndpointSelection
from proxy.source_ranges import source_ranges

SetIdFor = Callable[[ServicePortName, M.SetRole], int]


@dataclass(frozen=True)
class PortEntries:
    """Everything one service port owns in the maps, as packed bytes."""

    name: ServicePortName
    svc: Mapping[bytes, bytes]                 # na_svc key -> value
    sets: Mapping[int, tuple[bytes, ...]]      # set id -> packed backends in slot order
    set_names: Mapping[int, bytes]             # set id -> packed na_setname value
    lbsrc: Mapping[bytes, bytes] = field(default_factory=dict)   # allowed source ranges (na_lbsrc)

    def __post_init__(self) -> None:
        # read-only views of the dicts render_service_port built for this entry alone (not copied)
        for attr in ("svc", "sets", "set_names", "lbsrc"):
            object.__setattr__(self, attr, MappingProxyType(getattr(self, attr)))

    @property
    def slot_count(self) -> int:
        return sum(len(backends) for backends in self.sets.values())


def assign_slots(previous: Sequence[bytes], wanted: Iterable[bytes]) -> tuple[bytes, ...]:
    """`wanted` in slots, moving as few as possible from `previous`: survivors keep their slot,
    new backends fill the holes first, then the tail is moved into the remaining holes."""
    wanted = list(dict.fromkeys(wanted))
    if not previous or list(previous) == wanted:
        return tuple(wanted)
    keep = set(wanted)
    slots: list[bytes | None] = [b if b in keep else None for b in previous]
    present = set(previous)
    new = [b for b in wanted if b not in present]
    holes = [i for i, b in enumerate(slots) if b is None]
    for position, backend in zip(holes, new):
        slots[position] = backend
    slots.extend(new[len(holes):])
    while slots and slots[-1] is None:
        slots.pop()
    position = 0
    while position < len(slots):
        if slots[position] is None:   # the tail is never None here, and lies beyond `position`
            slots[position] = slots.pop()
            while slots and slots[-1] is None:
                slots.pop()
        position += 1
    return tuple(b for b in slots if b is not None)


def _backends(endpoints: Iterable[Endpoint], node: NodeContext, family: IpFamily) -> list[bytes]:
    """Packed backends of `family`, one per distinct address (sorted, so a first layout is
    deterministic), flagged when on this node."""
    distinct = sorted({(e.ip, e.port, e.node_name == node.name) for e in endpoints})
    packed = (M.backend(ip, port, local=local) for ip, port, local in distinct)
    return [b for b in packed if M.backend_family(b) is family]   # the family told by the packed size


# the map's code for each way in (ebpf/maps.py keeps the numbers the C programs read)
MAP_KIND = {EntryKind.CLUSTER_IP: M.AddressKind.CLUSTER_IP, EntryKind.EXTERNAL_IP: M.AddressKind.EXTERNAL_IP,
            EntryKind.LOAD_BALANCER: M.AddressKind.LOAD_BALANCER, EntryKind.NODE_PORT: M.AddressKind.NODE_PORT}


def render_service_port(service: ServicePort, selection: EndpointSelection, *, node: NodeContext,
                        set_id: SetIdFor, old_sets: Mapping[int, Sequence[bytes]] | None = None,
                        family: IpFamily = IpFamily.V4) -> PortEntries:
    """`selection`: the service port's endpoints as `ProxyState.selection` chose them;
    `old_sets`: the slot layouts the maps hold now, by set id (empty on a first sync)."""
    old_sets = old_sets or {}
    name = service.name
    cluster_id = set_id(name, M.SetRole.CLUSTER)
    sets = {cluster_id: assign_slots(old_sets.get(cluster_id, ()), _backends(selection.cluster, node, family))}
    set_names = {cluster_id: M.set_name(str(name), M.SetRole.CLUSTER)}
    ext_id = cluster_id
    # the external set is its own only when it differs (same endpoints: same backends, not packed again)
    if service.has_external_addresses and selection.external != selection.cluster:
        external = _backends(selection.external, node, family)
        if sorted(external) != sorted(sets[cluster_id]):
            ext_id = set_id(name, M.SetRole.EXTERNAL)
            sets[ext_id] = assign_slots(old_sets.get(ext_id, ()), external)
            set_names[ext_id] = M.set_name(str(name), M.SetRole.EXTERNAL)
    flags = 0 if selection.has_endpoints else M.F_NO_ENDPOINTS
    if service.external_local:
        flags |= M.F_EXTERNAL_LOCAL
    protocol = service.protocol.value
    affinity = service.affinity_timeout or 0

    def value(kind: M.AddressKind, extra: int = 0) -> bytes:
        return M.svc_value(set_id=cluster_id, count=len(sets[cluster_id]), ext_set_id=ext_id,
                           ext_count=len(sets[ext_id]), affinity_timeout=affinity, flags=flags | extra, kind=kind)

    allowed = source_ranges(service.load_balancer_source_ranges, family) if service.load_balancer_ips else None
    ranges = M.F_SOURCE_RANGES if allowed is not None else 0

    svc: dict[bytes, bytes] = {}
    for point in service.entry_points(node):   # spelled out: every entry has an address
        if point.address is not None:
            key = M.svc_key(point.address, point.port, protocol)
            if M.svc_key_family(key) is family:
                extra = ranges if point.kind is EntryKind.LOAD_BALANCER else 0
                svc.setdefault(key, value(MAP_KIND[point.kind], extra))
    lbsrc = {M.lbsrc_key(ext_id, network): M.ALLOWED for network in allowed or ()}
    return PortEntries(name, svc, sets, set_names, lbsrc)


@dataclass
class SetIds:
    """Set ids by (service port, role): kept across syncs, recovered from `na_setname` on adoption,
    freed when a service port goes away; new ids are the smallest free ones (from 1)."""

    ids: dict[tuple[ServicePortName, M.SetRole], int] = field(default_factory=dict)
    reserved: set[int] = field(default_factory=set)   # ids still in the maps for stale ports: not reused yet
    _used: set[int] = field(default_factory=set)
    _next: int = 1
    _free: list[int] = field(default_factory=list)   # released ids, largest first

    def adopt(self, name: ServicePortName, role: M.SetRole, set_id: int) -> None:
        self.ids[(name, role)] = set_id
        self._used.add(set_id)

    def __call__(self, name: ServicePortName, role: M.SetRole) -> int:
        key = (name, role)
        found = self.ids.get(key)
        if found is not None:
            return found
        while self._free and (self._free[-1] in self._used or self._free[-1] in self.reserved):
            self._free.pop()
        if self._free:
            set_id = self._free.pop()
        else:
            while self._next in self._used or self._next in self.reserved:
                self._next += 1
            set_id = self._next
        self.adopt(name, role, set_id)
        return set_id

    def release(self, names: Iterable[ServicePortName], keep: Callable[[ServicePortName, M.SetRole], bool]) -> None:
        """Forget the ids of `names` that `keep` rejects, for reuse."""
        for name in names:
            for role in M.SetRole:
                set_id = self.ids.get((name, role))
                if set_id is not None and not keep(name, role):
                    del self.ids[(name, role)]
                    self._used.discard(set_id)
                    self._free.append(set_id)
        self._free.sort(reverse=True)


Contents = dict[bytes, bytes]


def flatten(ports: Mapping[ServicePortName, PortEntries]) -> tuple[Contents, Contents, Contents, Contents]:
    """The maps' whole wanted contents: svc (first service port by name wins a shared
    address), slots, set names, source ranges."""
    svc: Contents = {}
    slots: Contents = {}
    names: Contents = {}
    lbsrc: Contents = {}
    for name in sorted(ports):
        entries = ports[name]
        for key, value in entries.svc.items():
            svc.setdefault(key, value)
        for sid, backends in entries.sets.items():
            slots.update((M.slot_key(sid, i), b) for i, b in enumerate(backends))
        names.update((M.set_id_key(sid), value) for sid, value in entries.set_names.items())
        lbsrc.update(entries.lbsrc)
    return svc, slots, names, lbsrc
