"""`EbpfProxy`: the eBPF service-proxy backend, writing render.py's entries into the pinned maps.

Full sync (the first, the periodic one, every one after a failure): the three maps the agent
owns (`na_svc`, `na_slots`, `na_setname`) are read whole (batch lookups); set ids are
recovered from `na_setname` and slot layouts from `na_slots`, so an agent that restarts over
pinned maps renders exactly what is there and writes nothing when nothing changed (its
connections never notice). Only the entries that differ are written, and stale ones deleted,
in an order that never lets a service entry point at slots not yet written: set names and
slots first, then service entries, then deletions of service entries, slots, set names.

Partial sync (`changed` given, and this backend remembers what it last wrote): only the
changed service ports are re-rendered, starting from their previous slot layouts, so one
endpoint change writes O(1) entries (a slot and the service entries' counts) and costs O(1)
work here too (the memory is updated in place). Nothing is read from the kernel. Any failure
raises and forgets the memory, so the next sync is full (and rebuilds it from the maps).

Room (proxy/ebpf/capacity.py): the maps have a fixed size (`--bpf-map-max`). A full sync
writes the service ports that fit, each whole (all its entries or none), and rejects the
others with reason `map-full` through `rejections` (a Warning Event, the
`netagent_rejected_objects` gauge, /healthz's details); while any is rejected every sync is
full, so room freed by a deleted Service is used at once. A partial sync whose additions
would not fit becomes a full one. A map passing 90 % of its capacity is warned about.

The LRU maps (`na_affinity`, `na_ct`, `na_ct_new`) and the socket storage `na_sock_revnat` are
the programs' own: never written here; an affinity entry whose slot no longer holds its backend
is ignored by the program.

Families: one backend per IP family, as kube-proxy runs one proxier per family. `family=V4`
(the default) writes the IPv4 maps exactly as before; `family=V6` writes the IPv6 ones
(`na_svc6`, `na_slots6`, `na_setname6`, `na_lbsrc6`, `na_config6`: `MapSet.of`), with set ids
of its own. Each renders only its family's addresses (render.py); the tc path's SNAT address
(`na_config6`) is the node's IPv6 address outside the pod network. A state of the other family
is a wiring error (ValueError), as in the nftables backend.
"""
from __future__ import annotations

import ipaddress
from collections import Counter, defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field

from ebpf import maps as M
from ebpf.loader import LoadReport
from ebpf.mapset import MapSet
from ebpf.pod_veths import PodVethAttacher
from ebpf.sizes import DEFAULT_SIZES, MapSizes
from netagent.kernel.families import IpFamily
from netagent.infra.rejections import ObjectRef, RejectionScope, standalone
from netagent.infra.sync_runner import SyncKind
from proxy.backend import BackendSyncReport, ProgrammedService, ProxyBackend, ProxyMode
from proxy.ebpf.capacity import Fill, admit, capacities
from proxy.ebpf.readback import programmed_services, slot_layouts
from proxy.ebpf.render import PortEntries, SetIds, flatten, render_service_port
from proxy.large_sync import collector_paused
from proxy.model import NodeContext, ProxyState, ServicePortName


@dataclass(frozen=True)
class EbpfPaths:
    """Where the agent was told its dataplane lives (`--bpf-root`, `--cgroup-root`, and the
    device of the tc path for traffic from outside, `--bpf-nodeport-device`; the tc path on pod
    host veths for pods outside the cgroup, `--bpf-pod-veths`), and the maps' capacities
    (`--bpf-map-max`)."""

    bpf_root: str
    cgroup: str
    tc_device: str | None = None
    pod_veths: bool = False
    map_sizes: MapSizes = DEFAULT_SIZES


@dataclass
class MapWrites:
    """What one sync writes, per map: updates and deletions (packed bytes)."""

    svc: dict[bytes, bytes] = field(default_factory=dict)
    slots: dict[bytes, bytes] = field(default_factory=dict)
    names: dict[bytes, bytes] = field(default_factory=dict)
    lbsrc: dict[bytes, bytes] = field(default_factory=dict)
    config: dict[bytes, bytes] = field(default_factory=dict)
    svc_gone: set[bytes] = field(default_factory=set)
    slots_gone: set[bytes] = field(default_factory=set)
    names_gone: set[bytes] = field(default_factory=set)
    lbsrc_gone: set[bytes] = field(default_factory=set)
    config_gone: set[bytes] = field(default_factory=set)   # never filled: an array's entries stay
    added: Counter[str] = field(default_factory=Counter)   # partial syncs: new keys, by map name

    @property
    def entries(self) -> int:
        return sum(len(part) for part in (self.svc, self.slots, self.names, self.lbsrc, self.config, self.svc_gone,
                                          self.slots_gone, self.names_gone, self.lbsrc_gone))

    def diff(self, attr: str, wanted: Mapping[bytes, bytes], present: Mapping[bytes, bytes]) -> None:
        getattr(self, attr).update({k: v for k, v in wanted.items() if present.get(k) != v})
        getattr(self, f"{attr}_gone").update(k for k in present if k not in wanted)

    @property
    def removed(self) -> Counter[str]:
        return Counter({M.SVC_MAP: len(self.svc_gone), M.SLOTS_MAP: len(self.slots_gone),
                        M.SETNAME_MAP: len(self.names_gone), M.LBSRC_MAP: len(self.lbsrc_gone)})

    def apply(self, maps: MapSet) -> None:
        if maps.config is not None:
            maps.config.update(self.config)
        maps.setname.update(self.names)
        maps.slots.update(self.slots)
        if maps.lbsrc is not None:
            maps.lbsrc.update(self.lbsrc)
        maps.svc.update(self.svc)
        maps.svc.delete(self.svc_gone)
        if maps.lbsrc is not None:
            maps.lbsrc.delete(self.lbsrc_gone)
        maps.slots.delete(self.slots_gone)
        maps.setname.delete(self.names_gone)


class EbpfProxy(ProxyBackend):
    mode = ProxyMode.EBPF

    def __init__(self, *, maps: MapSet, paths: EbpfPaths | None = None, load_report: LoadReport | None = None,
                 tc_snat: bool = False, pod_veths: PodVethAttacher | None = None,
                 rejections: RejectionScope | None = None, family: IpFamily = IpFamily.V4):
        self.family = family
        self.root_maps = maps   # the pinned set both families' backends share
        self.maps = maps.of(family)   # this family's maps (the IPv4 set carries the IPv6 one)
        self.rejections = rejections if rejections is not None else standalone("proxy")
        self._capacity = capacities(self.maps)
        self._fill = Fill()
        self._rejected: dict[str, str] = {}   # Service "namespace/name" -> why (ports left out for want of room)
        self.pod_veths = pod_veths   # attaching the tc path to pod veths as they appear (a thread)
        self.tc_snat = tc_snat   # the tc path SNATs to remote backends itself (False: the node's masquerade does)
        self.paths = paths
        self.load_report = load_report   # bcc compile and load times at start, for the log and the bench
        self._ids = SetIds()
        self._ports: dict[ServicePortName, PortEntries] | None = None  # what the last successful sync left
        self._owners: dict[bytes, set[ServicePortName]] = defaultdict(set)   # svc key -> ports claiming it
        self._slots = 0   # slot entries programmed
        self._node: NodeContext | None = None

    # ---- sync ---------------------------------------------------------------------------------

    def sync(self, state: ProxyState, *, changed: frozenset[ServicePortName] | None) -> BackendSyncReport:
        if state.family is not self.family:   # a wiring error: nothing of it belongs in these maps
            raise ValueError(f"an {state.family.label} ProxyState handed to the {self.family.label} eBPF proxy")
        with collector_paused():
            return self._sync(state, changed)

    def _sync(self, state: ProxyState, changed: frozenset[ServicePortName] | None) -> BackendSyncReport:
        previous, self._ports = self._ports, None   # forgotten until this sync succeeds
        partial = None
        if changed is not None and previous is not None and self._node == state.node and not self._rejected:
            names = sorted(set(changed))
            partial = self._partial(state, previous, names)   # updates `previous` in place
            if not self._fill.fits(partial[1].added, self._capacity):
                partial = None   # no room for its additions: a full sync admits what fits
        if partial is not None:
            ports, writes = partial
            scope = SyncKind.PARTIAL
            self._fill.entries = {m: n + partial[1].added[m] - writes.removed[m] for m, n in self._fill.entries.items()}
            rejected: dict[ServicePortName, str] = {}
        else:
            ports, writes, rejected = self._full(state)
            if rejected and sum(writes.removed.values()):
                writes.apply(self.maps)   # stale entries took room until now: admit again without them
                ports, writes, rejected = self._full(state)
            names = sorted(set(ports) | set(rejected) | {name for name, _ in self._ids.ids})
            scope = SyncKind.FULL
        writes.apply(self.maps)
        self._ids.release(names, lambda name, role: name in ports and self._ids.ids[(name, role)] in ports[name].sets)
        self._ids.reserved.clear()
        self._ports, self._node = ports, state.node
        self._report_rejections(rejected)
        self._fill.warn_near_capacity(self._capacity)
        entries = len(self._owners) + self._slots
        left_out = f", {len(rejected)} left out for want of room" if rejected else ""
        return BackendSyncReport(scope=scope, services_written=len(names), rules=entries,
                                 detail=f"{scope.value} sync: {len(names)} service port(s) rendered, "
                                        f"{writes.entries} map entries written, {entries} programmed{left_out}")

    def _report_rejections(self, rejected: Mapping[ServicePortName, str]) -> None:
        """Reject each Service with a port left out (`map-full`); accept again the ones no longer."""
        by_service: dict[str, list[str]] = defaultdict(list)
        for name in sorted(rejected):
            by_service[name.service].append(f"port {name.port or '(unnamed)'}: {rejected[name]}")
        ours = {r.ref.key for r in self.rejections.snapshot() if r.ref.kind == "Service" and r.reason == "map-full"}
        for key in (ours | set(self._rejected)) - set(by_service):
            self.rejections.accept(kind="Service", key=key)
        for key, reasons in by_service.items():
            namespace, _, service = key.partition("/")
            self.rejections.reject(ObjectRef(kind="Service", namespace=namespace, name=service), reason="map-full",
                                   detail="not programmed, no room in the eBPF maps (--bpf-map-max): "
                                          + "; ".join(reasons))
        self._rejected = {key: "; ".join(reasons) for key, reasons in by_service.items()}

    def _full(self, state: ProxyState) -> tuple[dict[ServicePortName, PortEntries], MapWrites,
                                                 dict[ServicePortName, str]]:
        present_svc = self.maps.svc.read_all()
        present_slots = self.maps.slots.read_all()
        present_names = self.maps.setname.read_all()
        by_text = {str(name): name for name in state.services}
        ids = SetIds()
        for key, value in present_names.items():
            sid = M.parse_set_id(key)
            text, role = M.parse_set_name(value)
            name = by_text.get(text)
            if name is not None and (name, role) not in ids.ids:
                ids.adopt(name, role, sid)
            else:
                ids.reserved.add(sid)
        for key, value in present_svc.items():
            entry = M.parse_svc(key, value)
            ids.reserved.update((entry.set_id, entry.ext_set_id))
        ids.reserved -= set(ids.ids.values())
        self._ids = ids
        programmed = frozenset(name for name, _ in ids.ids)
        layouts = slot_layouts(present_slots)
        rendered = {name: render_service_port(service, state.selection(name), node=state.node, set_id=ids,
                                              old_sets=layouts, family=self.family)
                    for name, service in sorted(state.services.items())}
        present_lbsrc = self.maps.lbsrc.read_all() if self.maps.lbsrc is not None else {}
        admission = admit(rendered, capacity=self._capacity, first=programmed, present={
            M.SVC_MAP: present_svc, M.SLOTS_MAP: present_slots, M.SETNAME_MAP: present_names,
            M.LBSRC_MAP: present_lbsrc})
        ports = dict(sorted(admission.admitted.items()))
        self._owners = defaultdict(set)
        self._slots = sum(entries.slot_count for entries in ports.values())
        for name, entries in ports.items():
            for key in entries.svc:
                self._owners[key].add(name)
        svc, slots, names, lbsrc = flatten(ports)
        writes = MapWrites()
        writes.diff("svc", svc, present_svc)
        writes.diff("slots", slots, present_slots)
        writes.diff("names", names, present_names)
        writes.diff("lbsrc", lbsrc, present_lbsrc)
        if self.maps.config is not None:
            config_key = M.set_id_key(0)
            config = M.config_value(snat_address(state.node, self.family), snat=self.tc_snat,
                                    width=M.address_width(self.family))
            if self.maps.config.lookup(config_key) != config:
                writes.config[config_key] = config
        self._fill.entries = {M.SVC_MAP: len(svc), M.SLOTS_MAP: len(slots), M.SETNAME_MAP: len(names),
                              M.LBSRC_MAP: len(lbsrc)}
        return ports, writes, admission.rejected

    def _partial(self, state: ProxyState, ports: dict[ServicePortName, PortEntries],
                 names: list[ServicePortName]) -> tuple[dict[ServicePortName, PortEntries], MapWrites]:
        writes = MapWrites()
        touched = {key for name in names if name in ports for key in ports[name].svc}
        before = {key: ports[min(self._owners[key])].svc[key] for key in touched if self._owners.get(key)}
        for name in names:
            old = ports.pop(name, None)
            service = state.services.get(name)
            new = None if service is None else render_service_port(
                service, state.selection(name), node=state.node, set_id=self._ids,
                old_sets=old.sets if old is not None else None, family=self.family)
            if new is not None:
                ports[name] = new
                touched.update(new.svc)
            self._slots += (new.slot_count if new is not None else 0) - (old.slot_count if old is not None else 0)
            for key in old.svc if old is not None else ():
                self._owners[key].discard(name)
            for key in new.svc if new is not None else ():
                self._owners[key].add(name)
            _diff_sets(writes, old, new)
        for key in touched:
            owners = self._owners.get(key)
            if owners:
                value = ports[min(owners)].svc[key]
                if before.get(key) != value:
                    writes.svc[key] = value
                    writes.added[M.SVC_MAP] += key not in before
            else:
                self._owners.pop(key, None)
                writes.svc_gone.add(key)
        return ports, writes

    # ---- read back and clean up ----------------------------------------------------------------

    def programmed(self) -> list[ProgrammedService]:
        return programmed_services(self.maps)

    def table_fill(self) -> dict[str, tuple[int, int]]:
        return {name: (bpf_map.count(), bpf_map.max_entries) for name, bpf_map in self.maps.by_name().items()}

    def cleanup(self) -> None:
        """Real maps: detach our programs from the cgroup (and our tc filters from this
        namespace's devices) and unpin the maps. Without paths
        (a fake map set): empty every map."""
        self._ports, self._owners = None, defaultdict(set)
        if self.paths is None:
            for bpf_map in self.maps.by_name().values():
                bpf_map.delete(list(bpf_map.read_all()))
            return
        from ebpf.loader import detach_owned, remove_pins
        from ebpf.tc import detach_tc
        if self.pod_veths is not None:
            self.pod_veths.stop()
            self.pod_veths = None
        self.maps.close()
        detach_owned(self.paths.cgroup)
        if self.paths.tc_device or self.paths.pod_veths:
            detach_tc()
        remove_pins(self.paths.bpf_root)


def snat_address(node: NodeContext, family: IpFamily = IpFamily.V4) -> str | None:
    """The address the tc path SNATs external- and load-balancer-IP traffic to: the node's
    lowest address of `family` outside the pod network (stable while pods and devices come and go)."""
    cidr = ipaddress.ip_network(node.cluster_cidr) if node.cluster_cidr else None
    mine = [ipaddress.ip_address(a) for a in node.local_addresses if IpFamily.of(a) is family]
    outside = sorted(a for a in mine if cidr is None or a not in cidr)   # `in` is False across families
    return str(outside[0]) if outside else None


def _diff_sets(writes: MapWrites, old: PortEntries | None, new: PortEntries | None) -> None:
    """Slot and set-name writes turning `old`'s sets into `new`'s, position by position."""
    old_sets = old.sets if old is not None else {}
    new_sets = new.sets if new is not None else {}
    for sid in set(old_sets) | set(new_sets):
        before, after = old_sets.get(sid, ()), new_sets.get(sid, ())
        writes.slots.update((M.slot_key(sid, i), b) for i, b in enumerate(after)
                            if i >= len(before) or before[i] != b)
        writes.slots_gone.update(M.slot_key(sid, i) for i in range(len(after), len(before)))
        writes.added[M.SLOTS_MAP] += max(0, len(after) - len(before))
    old_src = old.lbsrc if old is not None else {}
    new_src = new.lbsrc if new is not None else {}
    writes.lbsrc.update((k, v) for k, v in new_src.items() if old_src.get(k) != v)
    writes.added[M.LBSRC_MAP] += sum(1 for k in new_src if k not in old_src)
    writes.lbsrc_gone.update(k for k in old_src if k not in new_src)
    old_names = old.set_names if old is not None else {}
    new_names = new.set_names if new is not None else {}
    writes.names.update((M.set_id_key(sid), v) for sid, v in new_names.items() if old_names.get(sid) != v)
    writes.added[M.SETNAME_MAP] += sum(1 for sid in new_names if sid not in old_names)
    writes.names_gone.update(M.set_id_key(sid) for sid in old_names if sid not in new_names)
