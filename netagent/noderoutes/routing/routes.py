"""`RouteManager`: keeps the kernel's routing objects equal to the plan, touching only the difference.

Two ways in, both ending in the same diff-and-apply (`plan.diff_objects`):

* `sync_all(peers)` - the full reconcile and the drift repair: ensure the devices, dump
  what is ours from the kernel (routes by our protocol, neighbours and FDB entries on our
  VXLAN device), diff with the plan, write what is missing or different, delete what
  nobody wants. A correct object is left alone, so an agent restart adopts the kernel
  state without a single write (no flush, no blip).
* `apply_changes(upserts=..., removals=...)` - one watch event's worth: the changed peers
  alone are planned (`incremental.py`; a full re-render when only that can tell) and
  compared with the state this manager last programmed, kept in memory per peer. A new
  node among 1,000 costs its own planning, its three netlink writes and no dump.

Writes go in programming order (neighbour, FDB, route per peer) and before deletes, so a
peer that changes mode gets its new route before its old next hop disappears. When a
write fails the rest of that peer is skipped (a route without its neighbour would
blackhole), everything else is still applied, and `RoutingApplyError` is raised at the
end so the caller schedules a full sync. Called from one sync thread: no locking.

One manager per IP family (its `local`'s): it dumps, diffs and writes only routes and
neighbours of its family and only its own devices (`na-vxlan`/`na-ipip` for IPv4, `na-vxlan6`
for IPv6); `keep_devices` names the other family's devices, which it never removes.
"""
from __future__ import annotations

import dataclasses
import logging
from collections import Counter
from operator import attrgetter
from typing import Callable, Container, Iterable, Mapping

from netagent.kernel.errors import KernelError
from netagent.kernel.families import IpFamily
from netagent.noderoutes.routing.model import (
    DEVICE_PREFIX,
    ENCAP_KINDS,
    DeviceChange,
    FdbEntry,
    LocalNode,
    Mode,
    Neighbour,
    Peer,
    PeerBounds,
    PeerPlan,
    Plan,
    Route,
    RoutingApplyError,
    RoutingKernel,
    RoutingSettings,
    SyncReport,
    VxlanDevice,
)
from netagent.noderoutes.routing.incremental import IncrementalPlanner
from netagent.noderoutes.routing.plan import ObjectChanges, describe, diff_objects, render_devices
from netagent.noderoutes.routing.vxlan import is_vtep_mac, normalize_mac, random_vtep_mac, vxlan_ifname

_log = logging.getLogger("netagent.noderoutes.routing")
_MODE_OF = attrgetter("mode")
_CONCRETE_MODES = (Mode.HOST_GW, Mode.VXLAN, Mode.IPIP)  # always reported; bgp where it may occur


class RouteManager:
    def __init__(self, *, kernel: RoutingKernel, settings: RoutingSettings, local: LocalNode,
                 bounds: PeerBounds, log: logging.Logger = _log,
                 learnt: Callable[[], Mapping] | None = None) -> None:
        """`learnt` reads the routes BIRD learnt (`noderoutes/bgp/learnt.py`) for bgp and auto modes."""
        self.kernel = kernel
        self.learnt = learnt
        self.settings = settings
        if settings.encap is Mode.VXLAN and local.vtep_mac is None:
            local = dataclasses.replace(local, vtep_mac=choose_vtep_mac(kernel, vxlan_ifname(settings, local.family)))
        self.local = local
        self.bounds = bounds
        self.log = log
        self.family = local.family
        self.devices = render_devices(local, settings)  # fails now, not mid-sync, without a pod CIDR of the family
        self.keep_devices: frozenset[str] = frozenset()  # the other family's manager's devices
        self.ipv6_routed = False  # an IPv6 manager exists: the IPv4 plan's skipped IPv6 CIDRs are not news
        self._peers: dict[str, Peer] = {}
        self._programmed: dict[str, PeerPlan] = {}
        self._planner = IncrementalPlanner()
        self._unsure: set[str] = set()  # peers whose programmed objects may differ from their plan
        self._logged_status: dict[str, str] = {}  # peer -> its last logged pending/refused reason
        self._ipv6_logged = False

    # ------------------------------------------------------------ public API
    def ensure_local(self) -> dict[str, str]:
        """Create or repair our devices (and remove other modes'); return the announcement's backend data.

        When a device had to be emptied (recreated, or its MAC fixed), the peers already
        known are re-programmed onto it at once rather than at the next sync.
        """
        if self._ensure_devices() and self._peers:
            self.apply_changes(upserts=(), removals=())
        return self.backend_data()

    def known_peers(self) -> list[Peer]:
        """Every peer the last sync was given (admitted or not)."""
        return list(self._peers.values())

    def backend_data(self) -> dict[str, str]:
        key = "vtepMAC" if self.family is IpFamily.V4 else "vtepMAC6"
        return {key: device.mac for device in self.devices if isinstance(device, VxlanDevice)}

    def sync_all(self, peers: Iterable[Peer]) -> SyncReport:
        """Full reconcile of devices and every peer against a kernel dump; repairs any drift."""
        self._peers = {peer.name: peer for peer in peers}
        plan = self._render()
        self._ensure_devices()
        changes = diff_objects(plan.peers.values(), self._dump_ours())
        report, failures, failed_peers = self._apply(changes)
        self._programmed = {name: peer for name, peer in plan.peers.items() if name not in failed_peers}
        self._unsure = set(failed_peers)
        return self._finish(report, plan, failures)

    def apply_changes(self, *, upserts: Iterable[Peer], removals: Iterable[str]) -> SyncReport:
        """Program only what these peers' changes alter, against memory (assumes a prior sync_all)."""
        upserts, removals = list(upserts), list(removals)
        for peer in upserts:
            self._peers[peer.name] = peer
        for name in removals:
            self._peers.pop(name, None)
        changed = {peer.name for peer in upserts} | set(removals)
        plan = self._planner.change(self.local, self._peers, self.settings, bounds=self.bounds, names=changed) \
            if self.learnt is None else None
        if plan is not None:  # only the changed peers' outcomes moved (incremental.py)
            self._log_status(plan)
            touched = changed | self._unsure
        else:  # a change can also move another peer (e.g. a removed node frees a CIDR another claimed)
            plan = self._render()
            touched = changed | {name for name in plan.peers.keys() | self._programmed.keys()
                                 if plan.peers.get(name) != self._programmed.get(name)}
        desired = [plan.peers[name] for name in sorted(touched) if name in plan.peers]
        current = [obj for name in touched if name in self._programmed for obj in self._programmed[name].objects()]
        report, failures, failed_peers = self._apply(diff_objects(desired, current))
        for name in touched:
            if name in plan.peers and name not in failed_peers:
                self._programmed[name] = plan.peers[name]
            else:
                self._programmed.pop(name, None)
        self._unsure = set(failed_peers)
        return self._finish(report, plan, failures)

    def cleanup(self) -> None:
        """Remove every route of our protocol and every device of ours (with their neighbours and FDB)."""
        remove_owned_routing(self.kernel)
        self._programmed.clear()
        self._peers.clear()
        self.log.info("routing cleaned up: our routes (protocol %d) and devices removed", self.kernel.protocol)

    # ------------------------------------------------------------ devices
    def _ensure_devices(self) -> bool:
        """Make the devices right; True when objects on them were lost (and forgotten)."""
        emptied = False
        wanted = {device.ifname for device in self.devices}
        for name, kind in self.kernel.links_with_prefix(DEVICE_PREFIX).items():
            if kind in ENCAP_KINDS and name not in wanted and name not in self.keep_devices:
                self.log.info("removing %s (%s): not used in %s mode", name, kind, self.settings.mode.value)
                self.kernel.delete_link(name)
                self._forget_objects_on(name)
        for device in self.devices:
            ensure = self.kernel.ensure_vxlan if isinstance(device, VxlanDevice) else self.kernel.ensure_ipip
            if ensure(device) is DeviceChange.EMPTIED:
                self.log.info("%s is new or was reset: %s", device.ifname, describe(device))
                self._forget_objects_on(device.ifname)
                emptied = True
        return emptied

    def _forget_objects_on(self, ifname: str) -> None:
        """A device went away with everything on it: stop believing those objects are programmed."""
        def kept(objects: tuple) -> tuple:
            return tuple(obj for obj in objects if obj.ifname != ifname)
        self._programmed = {name: dataclasses.replace(peer, neighbours=kept(peer.neighbours), fdb=kept(peer.fdb),
                                                      routes=kept(peer.routes))
                            for name, peer in self._programmed.items()}
        self._unsure |= self._programmed.keys()

    # ------------------------------------------------------------ objects
    def _render(self) -> Plan:
        plan = self._planner.full(self.local, self._peers, self.settings, bounds=self.bounds,
                                  learnt=self.learnt() if self.learnt is not None else None)
        self._log_status(plan)
        return plan

    def _dump_ours(self) -> list:
        objects: list[Route | Neighbour | FdbEntry] = list(self.kernel.dump_routes(self.family))
        for device in self.devices:
            if isinstance(device, VxlanDevice):
                objects += self.kernel.dump_neighbours(device.ifname, self.family)
                objects += self.kernel.dump_fdb(device.ifname)
        return objects

    def _write(self, obj) -> None:
        if isinstance(obj, Route):
            self.kernel.replace_route(obj)
        elif isinstance(obj, Neighbour):
            self.kernel.replace_neighbour(obj)
        elif isinstance(obj, FdbEntry):
            self.kernel.replace_fdb(obj)

    def _delete(self, obj) -> None:
        if isinstance(obj, Route):
            self.kernel.delete_route(obj)
        elif isinstance(obj, Neighbour):
            self.kernel.delete_neighbour(obj)
        elif isinstance(obj, FdbEntry):
            self.kernel.delete_fdb(obj)

    def _apply(self, changes: ObjectChanges) -> tuple[SyncReport, dict, set]:
        report = SyncReport(unchanged=changes.unchanged)
        failures, failed_peers = {}, set()
        for owner, obj in changes.writes:
            if owner in failed_peers:
                continue
            try:
                self._write(obj)
                report.added += 1
            except KernelError as exc:
                failed_peers.add(owner)
                failures[f"peer {owner}: {describe(obj)}"] = str(exc)
        for obj in changes.deletes:
            try:
                self._delete(obj)
                report.removed += 1
            except KernelError as exc:
                failures[f"stale {describe(obj)}"] = str(exc)
        return report, failures, failed_peers

    def _finish(self, report: SyncReport, plan: Plan, failures: dict) -> SyncReport:
        report.refused = dict(plan.refused)
        report.pending = sorted(plan.pending)
        report.peers_by_mode = {mode.value: 0 for mode in _CONCRETE_MODES}
        if self.settings.mode is Mode.BGP or self.learnt is not None:
            report.peers_by_mode[Mode.BGP.value] = 0
        for mode, count in Counter(map(_MODE_OF, self._programmed.values())).items():  # C speed: 1,000 peers each sync
            report.peers_by_mode[mode.value] = report.peers_by_mode.get(mode.value, 0) + count
        if report.added or report.removed:
            self.log.info("routing: %d written, %d removed, %d unchanged", report.added, report.removed,
                          report.unchanged)
        if failures:
            raise RoutingApplyError(failures, report)
        return report

    def _log_status(self, plan: Plan) -> None:
        """Log a peer's pending or refused reason when it first appears or changes, not every sync."""
        status = {name: f"pending: {why}" for name, why in plan.pending.items()}
        status.update((name, f"refused: {why.detail}") for name, why in plan.refused.items())
        for name, text in status.items():
            if self._logged_status.get(name) != text:
                level = logging.WARNING if text.startswith("refused") else logging.INFO
                self.log.log(level, "%speer %s %s", "" if self.family is IpFamily.V4 else "IPv6: ", name, text)
        self._logged_status = status
        if plan.ignored_ipv6 and not self._ipv6_logged and not self.ipv6_routed:
            self._ipv6_logged = True
            shown = ", ".join(plan.ignored_ipv6[:3]) + (" ..." if len(plan.ignored_ipv6) > 3 else "")
            self.log.warning("IPv6 pod CIDRs are not routed: no IPv6 --cluster-cidr; ignoring %s", shown)


def choose_vtep_mac(kernel: RoutingKernel, ifname: str, *, announced: str | None = None,
                    taken: Container[str] = ()) -> str:
    """This node's VTEP MAC for `ifname` (`vxlan.py` says why random): the MAC of our device
    already there (a restarted agent keeps what its peers' FDBs hold), else the one our Node
    announces (`announced`: after a reboot), else a fresh random one; never one in `taken`
    (another Node's announced MAC, which an older Node would win)."""
    observed = kernel.observe(ifname)
    for candidate in (observed.mac if observed is not None and observed.kind == "vxlan" else None, announced):
        mac = normalize_mac(candidate) if candidate and is_vtep_mac(candidate) else None
        if mac is not None and mac not in taken:
            return mac
    return random_vtep_mac()


def remove_owned_routing(kernel) -> list[str]:
    """Delete our routes (by protocol) and our encapsulation devices; what `netagent cleanup`
    and `RouteManager.cleanup` share. Returns a line per thing removed."""
    removed = []
    for family in IpFamily:
        for route in kernel.dump_routes(family):
            kernel.delete_route(route)
            removed.append(f"route {route.dst}")
    for name, kind in kernel.links_with_prefix(DEVICE_PREFIX).items():
        if kind in ENCAP_KINDS:
            kernel.delete_link(name)
            removed.append(f"device {name} ({kind})")
    return removed
