"""`IpvsProxy`: the IPVS service-proxy backend, reconciling the kernel with a rendered plan.

Four kernel touchpoints, each an interface with a fake: the IPVS table (virtual and real
servers), the dummy device holding service addresses, ipsets, iptables; plus sysctls.

Full sync (`changed` None, the first sync, and whenever the node context changed): render the
whole plan (reusing the plans of service ports unchanged since the last render: rendering is
pure, so that is the same plan), then diff every touchpoint against the kernel and write only
the differences: sysctls, the device, the sets (`sync_sets`: one read, one restore), the
constant rules (rewritten only on drift), the
device's addresses, and every virtual server with its real servers. Virtual servers in the
kernel that no service port wants are deleted when they are ours: their address is on our
device, or they sit on a node address and are listed in our NodePort sets (read before the
sets are synced, so a NodePort removed while the agent was down is still recognised). Anyone
else's virtual servers are never touched. A restarted agent adopts what it finds: the same
state renders the same plan and the sync writes nothing.

Partial sync: re-render only the changed service ports (plus those with draining real
servers), patch the plan and its index, write the set members and addresses that changed
(idempotently: `-exist`, quiet adds), and diff the affected virtual servers against the
kernel. Any failure leaves the backend wanting a full sync (the core's next sync is full).

Real servers are reconciled with graceful removal (proxy/ipvs/graceful.py): wanted ones at
weight 1, unwanted ones drained at weight 0 until idle or timed out. A sync (full or partial,
even with nothing changed) also advances the drains; `reap_drained()` does only that and
`drain_deadline()` says when it is next needed, for a caller that wants drains to end on time
between syncs.

The hairpin set grows with Services x ports x endpoints; it is sized from the state as the
iptables backend's is (proxy/hairpin_set.py): past 7/8 of its capacity a larger set
(`NETAGENT-IPVS-HAIRPIN-<log2 size>`) is filled by the set sync, the rule repaired to match
it, and the old set destroyed; a partial sync that would outgrow it becomes a full one.

Families: one `IpvsProxy` per family (`family=IpFamily.V6`: AF_INET6 virtual servers, /128
addresses on the same device, the same chains in ip6tables, `inet6` sets named
NETAGENT-IPVS6-*, IPv6 forwarding), each fed its family's `ProxyState`, as kube-proxy runs a
proxier per family. Each sees only its own family in every shared touchpoint: the virtual
servers it lists, diffs, reads back and removes are its family's, the device addresses it
reads and removes are its family's (`addresses(family=)`), its sets are the family's by
name; `cleanup` deletes the device only when the other family left no address on it.

Sockets: the netlink objects open sockets per thread (proxy/ipvs/netlink.py), so the backend
may be driven from the sync runner's thread; a lock keeps sync, reap, status and cleanup apart.
"""
from __future__ import annotations

import logging
import threading
from collections import defaultdict
from collections.abc import Iterable

from netagent.infra.clock import Clock, MonotonicClock
from netagent.infra.sync_runner import SyncKind
from netagent.kernel.families import IpFamily
from netagent.kernel import namespaces
from netagent.kernel.ipset import (
    Ipset,
    IpsetError,
    IpsetNotInstalled,
    IpsetRunner,
    SetContents,
    delete_owned_sets,
    entry,
    sync_sets,
)
from netagent.kernel.ipset.model import DEFAULT_MAX_ELEMENTS
from netagent.kernel.iptables.backend import IptablesBackend, detect_backend
from netagent.kernel.iptables.runner import Iptables, IptablesRunner
from netagent.kernel.sysctl import ProcSysctls, Sysctls, ensure_sysctls
from proxy.backend import BackendSyncReport, ProgrammedService, ProxyBackend, ProxyMode
from proxy import hairpin_set as hairpin
from proxy.ipvs.device import AddressDevice
from proxy.ipvs.graceful import GracefulRemovals, Removal
from proxy.ipvs.render import (
    IpvsPlan,
    IpvsSettings,
    PlanIndex,
    PlannedVirtualServer,
    ServicePortPlan,
    render_service_port,
)
from proxy.ipvs.rules import (
    HAIRPIN_SET,
    IPVS_SETS,
    NODEPORT_SETS,
    IpvsChain,
    family_set,
    ensure_ipvs_rules,
    remove_ipvs_rules,
    render_ipvs_chains,
    set_prefix,
)
from proxy.ipvs.sysctls import ipvs_sysctls
from proxy.ipvs.table import IpvsTable, IpvsUnavailable, RealServer, RealServerStatus, VirtualServer, VirtualServerKey
from proxy.model import Endpoint, EntryKind, NodeContext, ProxyState, ServicePort, ServicePortName

log = logging.getLogger("netagent.proxy.ipvs")

READY_WEIGHT = 1
DRAINING_WEIGHT = 0


class IpvsProxy(ProxyBackend):
    mode = ProxyMode.IPVS

    def __init__(self, *, table: IpvsTable, device: AddressDevice, ipset: Ipset, iptables: Iptables,
                 sysctls: Sysctls, settings: IpvsSettings = IpvsSettings(),
                 clock: Clock | None = None, hairpin_minimum: int = DEFAULT_MAX_ELEMENTS,
                 family: IpFamily = IpFamily.V4):
        self.family = family
        self._sets = {spec.name: family_set(spec, family) for spec in IPVS_SETS}
        self.table = table
        self.device = device
        self.ipset = ipset
        self.iptables = iptables
        self.sysctls = sysctls
        self.settings = settings
        self.clock: Clock = clock if clock is not None else MonotonicClock()
        self._graceful = GracefulRemovals(timeout=settings.graceful_timeout)
        self._plan: IpvsPlan | None = None
        self._index: PlanIndex | None = None
        self._node: NodeContext | None = None
        self._rendered: dict[ServicePortName, tuple[ServicePort, tuple[Endpoint, ...], ServicePortPlan]] = {}
        self._lock = threading.RLock()
        self.hairpin_minimum = hairpin_minimum
        self.hairpin_spec = hairpin.hairpin_spec(self._hairpin_base, hairpin_minimum, minimum=hairpin_minimum,
                                                 family=family.ipset)
        self._hairpin_known = False

    @classmethod
    def in_namespace(cls, *, netns: str | None = None, settings: IpvsSettings = IpvsSettings(),
                     iptables_backend: IptablesBackend | None = None,
                     clock: Clock | None = None, family: IpFamily = IpFamily.V4) -> IpvsProxy:
        """The real thing, for the namespace `netns` (None: the caller's, where the agent runs)."""
        from proxy.ipvs.netlink import NetlinkAddressDevice, NetlinkIpvsTable
        prefix = namespaces.exec_prefix(netns)
        backend = iptables_backend or detect_backend(exec_prefix=prefix)
        return cls(table=NetlinkIpvsTable(netns=netns),
                   device=NetlinkAddressDevice(name=settings.device, netns=netns),
                   ipset=IpsetRunner(exec_prefix=prefix),
                   iptables=IptablesRunner(backend=backend, family=family, exec_prefix=prefix),
                   sysctls=ProcSysctls(exec_prefix=prefix), settings=settings, clock=clock, family=family)

    def close(self) -> None:
        for part in (self.table, self.device):
            closer = getattr(part, "close", None)
            if closer is not None:
                closer()

    # ---- sync ------------------------------------------------------------------------------------

    def sync(self, state: ProxyState, *, changed: frozenset[ServicePortName] | None) -> BackendSyncReport:
        with self._lock:
            plan, index = self._plan, self._index  # set together, by a full sync
            try:
                if changed is None or plan is None or index is None or state.node != self._node:
                    return self._sync_full(state)
                return self._sync_partial(state, changed, plan=plan, index=index)
            except BaseException:
                self._plan, self._index = None, None
                raise

    def chains(self, state: ProxyState) -> tuple[IpvsChain, ...]:
        return render_ipvs_chains(cluster_cidr=state.node.cluster_cidr,
                                  ports=self.iptables.port_randomization,
                                  mark=self.settings.masquerade_mark, hairpin_set=self.hairpin_spec.name,
                                  family=self.family)

    @property
    def _hairpin_base(self) -> str:
        return self._sets[HAIRPIN_SET.name].name

    def _virtual_servers(self) -> list[VirtualServer]:
        """The virtual servers of our family (the table holds both)."""
        return [server for server in self.table.virtual_servers() if server.key.family is self.family]

    def _addresses(self) -> frozenset[str]:
        return self.device.addresses(family=self.family)

    def _nodeport_entries(self, sets: dict[str, SetContents]) -> frozenset[str]:
        """Members of our NodePort sets: the virtual servers on node addresses that are ours."""
        names = [self._sets[spec.name].name for spec in NODEPORT_SETS]
        return frozenset(member for name in names if name in sets for member in sets[name].members)

    def _choose_hairpin(self, members: int, sets: dict[str, SetContents]) -> list[str]:
        """Size the hairpin set for `members` (adopting the largest one there is the first
        time); answers the hairpin sets in `sets` that are not the chosen one."""
        base = self._hairpin_base
        found = sorted(name for name in sets if hairpin.is_hairpin_set(base, name))
        if not self._hairpin_known and found:
            name = max(found, key=lambda n: hairpin.capacity_of(base, n, minimum=self.hairpin_minimum))
            self.hairpin_spec = hairpin.hairpin_spec(
                base, hairpin.capacity_of(base, name, minimum=self.hairpin_minimum), minimum=self.hairpin_minimum,
                family=self.family.ipset)
        self._hairpin_known = True
        self.hairpin_spec = hairpin.choose(base, members, current=self.hairpin_spec, minimum=self.hairpin_minimum,
                                           family=self.family.ipset)
        return [name for name in found if name != self.hairpin_spec.name]

    def _wanted_sets(self, index: PlanIndex) -> dict:
        return {(self.hairpin_spec if spec.name == HAIRPIN_SET.name else self._sets[spec.name]):
                index.set_members(spec.name) for spec in IPVS_SETS}

    def _kernel_set(self, set_name: str) -> str:
        """The kernel set of the plan's set `set_name` (plans name the IPv4 sets)."""
        return self.hairpin_spec.name if set_name == HAIRPIN_SET.name else self._sets[set_name].name

    def _render(self, state: ProxyState) -> IpvsPlan:
        """render_ipvs, reusing the plans of service ports whose service and endpoints are
        unchanged since the last render (same node): the same pure result, several times faster
        at 10,000 services."""
        if state.node != self._node:
            self._rendered = {}
        rendered = {}
        for name, service in sorted(state.services.items()):
            endpoints = state.endpoints_of(name)
            cached = self._rendered.get(name)
            if cached is not None and cached[0] == service and cached[1] == endpoints:
                rendered[name] = cached
            else:
                rendered[name] = (service, endpoints, render_service_port(
                    service, state.selection(name), node=state.node, settings=self.settings))
        self._rendered = rendered
        return IpvsPlan({name: plan for name, (_, _, plan) in rendered.items()})

    def _sync_full(self, state: ProxyState) -> BackendSyncReport:
        now = self.clock.now()
        plan = self._render(state)
        index = plan.index()
        written: set[ServicePortName] = set()

        if state.family is not self.family:   # a wiring error: every address would be of the wrong family
            raise ValueError(f"an {state.family.label} ProxyState handed to the {self.family.label} IPVS proxy")
        sysctl_writes = ensure_sysctls(self.sysctls, ipvs_sysctls(self.family))
        self.device.ensure()
        addresses_before = self._addresses()
        sets_before = self.ipset.snapshot()
        nodeports_before = self._nodeport_entries(sets_before)
        obsolete = self._choose_hairpin(len(index.members[HAIRPIN_SET.name]), sets_before)
        counts = sync_sets(self.ipset, self._wanted_sets(index), current=sets_before)
        set_changes = sum(added + removed for added, removed in counts.values())
        repaired = ensure_ipvs_rules(self.iptables, self.chains(state))
        for name in obsolete:   # no rule names it any more
            try:
                self.ipset.destroy(name)
            except IpsetError as error:
                log.warning("could not remove the old hairpin set %s: %s", name, error)
        for address in sorted(set(index.addresses) - addresses_before):
            self.device.add_address(address)

        kernel = {server.key: server for server in self._virtual_servers()}
        for planned in index.all_servers():
            if self._sync_virtual_server(planned, kernel.get(planned.key), now=now):
                written.add(planned.service)
        stale = [key for key in kernel if key not in index.servers
                 and _owned(key, addresses=addresses_before | set(index.addresses), nodeports=nodeports_before)]
        for key in stale:
            log.info("removing stale virtual server %s", key)
            self.table.delete_virtual_server(key)
            self._graceful.forget(key)
        for key in self._graceful.draining() - set(index.servers):
            self._graceful.forget(key)
        for address in sorted(addresses_before - set(index.addresses)):
            self.device.remove_address(address)

        self._plan, self._index, self._node = plan, index, state.node
        detail = (f"{len(index.servers)} virtual servers, {len(stale)} stale removed, {set_changes} set "
                  f"member changes, {len(repaired)} rule repairs, {len(sysctl_writes)} sysctls set")
        return BackendSyncReport(SyncKind.FULL, services_written=len(written), rules=_real_server_count(index),
                                 detail=detail)

    def _sync_partial(self, state: ProxyState, changed: frozenset[ServicePortName], *, plan: IpvsPlan,
                      index: PlanIndex) -> BackendSyncReport:
        """Re-render the `changed` service ports into the last full sync's `plan` and its `index`."""
        now = self.clock.now()
        services = dict(plan.services)
        touched_members: dict[str, set[str]] = defaultdict(set)
        touched_addresses: set[str] = set()
        touched_keys: set[VirtualServerKey] = set(self._graceful.draining())
        rerendered: set[ServicePortName] = set()
        for name in sorted(changed):
            old = services.get(name)
            service = state.services.get(name)
            new = (render_service_port(service, state.selection(name), node=state.node, settings=self.settings)
                   if service is not None else None)
            if old == new:
                continue
            rerendered.add(name)
            old_members = old.members if old else {}
            new_members = new.members if new else {}
            for set_name in set(old_members) | set(new_members):
                touched_members[set_name] |= (old_members.get(set_name, frozenset())
                                              ^ new_members.get(set_name, frozenset()))
            touched_addresses |= (old.addresses if old else frozenset()) ^ (new.addresses if new else frozenset())
            touched_keys |= {s.key for s in (old.virtual_servers if old else ())}
            touched_keys |= {s.key for s in (new.virtual_servers if new else ())}
            if old is not None:
                index.remove(old)
                del services[name]
                self._rendered.pop(name, None)
            if new is not None:
                assert service is not None, "new was rendered from the service"
                index.add(new)
                services[name] = new
                self._rendered[name] = (service, state.endpoints_of(name), new)
        self._plan = IpvsPlan(services)
        if not hairpin.fits(self.hairpin_spec, len(index.members[HAIRPIN_SET.name])):
            return self._sync_full(state)   # a larger hairpin set: filled, then the rule repaired to use it

        set_changes = {}
        for set_name, members in sorted(touched_members.items()):
            wanted = {m for m in members if index.wanted_member(set_name, m)}
            set_changes[self._kernel_set(set_name)] = (wanted, members - wanted)
        self.ipset.update_many(set_changes, types={self._kernel_set(spec.name): spec.type for spec in IPVS_SETS})
        for address in sorted(a for a in touched_addresses if index.wanted_address(a)):
            self.device.add_address(address)
        written = set(rerendered)
        for key in sorted(touched_keys):
            planned = index.server(key)
            current = self.table.virtual_server(key)
            if planned is None:
                if current is not None:
                    self.table.delete_virtual_server(key)
                self._graceful.forget(key)
            elif self._sync_virtual_server(planned, current, now=now):
                written.add(planned.service)
        for address in sorted(a for a in touched_addresses if not index.wanted_address(a)):
            self.device.remove_address(address)
        return BackendSyncReport(SyncKind.PARTIAL, services_written=len(written), rules=_real_server_count(index),
                                 detail=f"{len(rerendered)} service ports re-rendered, {len(touched_keys)} "
                                        f"virtual servers checked")

    def _sync_virtual_server(self, planned: PlannedVirtualServer, current: VirtualServer | None, *,
                             now: float) -> bool:
        """Make one virtual server and its real servers as planned; returns whether it wrote."""
        key = planned.key
        if current is None:
            self.table.add_virtual_server(planned.server)
            for destination in planned.destinations:
                self.table.add_real_server(key, RealServer(destination, READY_WEIGHT))
            self._graceful.forget(key)
            return True
        wrote = False
        if current != planned.server:
            self.table.update_virtual_server(planned.server)
            wrote = True
        reals = {real.destination: real for real in self.table.real_servers(key)}
        wanted = set(planned.destinations)
        for destination in planned.destinations:
            real = reals.get(destination)
            if real is None:
                self.table.add_real_server(key, RealServer(destination, READY_WEIGHT))
                wrote = True
            elif real.weight != READY_WEIGHT:
                self.table.update_real_server(key, RealServer(destination, READY_WEIGHT))
                self._graceful.forget(key, destination)
                wrote = True
        for destination, real in reals.items():
            if destination not in wanted:
                wrote |= self._retire(key, real, now=now)
        return wrote

    def _retire(self, key: VirtualServerKey, real: RealServerStatus, *, now: float) -> bool:
        if self._graceful.decide(key, real, now=now) is Removal.DELETE:
            log.debug("deleting real server %s of %s (%d connections)", real.destination, key, real.connections)
            self.table.delete_real_server(key, real.destination)
            return True
        if real.weight != DRAINING_WEIGHT:
            log.debug("draining real server %s of %s (%d connections)", real.destination, key, real.connections)
            self.table.update_real_server(key, RealServer(real.destination, DRAINING_WEIGHT))
            return True
        return False

    # ---- drains between syncs --------------------------------------------------------------------

    def drain_deadline(self) -> float | None:
        """When (on `clock`) the next draining real server times out; None when nothing drains."""
        with self._lock:
            return self._graceful.deadline()

    def next_sync_due(self) -> float | None:
        """Drains end by timing out as well as by going idle: a sync at the deadline reaps them."""
        return self.drain_deadline()

    def reap_drained(self) -> int:
        """Advance the drains: delete real servers that are idle or timed out. Returns how many
        virtual servers were written. Needs a plan (does nothing before the first sync)."""
        with self._lock:
            if self._index is None:
                return 0
            now = self.clock.now()
            count = 0
            for key in sorted(self._graceful.draining()):
                planned = self._index.server(key)
                current = self.table.virtual_server(key)
                if planned is None or current is None:
                    self._graceful.forget(key)
                    continue
                count += self._sync_virtual_server(planned, current, now=now)
            return count

    # ---- read back and clean up ------------------------------------------------------------------

    def programmed(self) -> list[ProgrammedService]:
        with self._lock:
            addresses = self._addresses()
            nodeports = self._nodeport_entries(self.ipset.snapshot())
            found = []
            for server in sorted(self._virtual_servers(), key=lambda s: s.key):
                if not _owned(server.key, addresses=addresses, nodeports=nodeports):
                    continue
                planned = self._index.server(server.key) if self._index is not None else None
                reals = sorted(self.table.real_servers(server.key), key=lambda r: r.destination)
                found.append(ProgrammedService(
                    name=str(planned.service) if planned else "(not in the current plan)",
                    address=str(server.key),
                    kind=planned.kind.value if planned else ("ServiceAddress" if server.key.address in addresses
                                                             else EntryKind.NODE_PORT.value),
                    backends=tuple(_describe_real(real) for real in reals)))
            return found

    def cleanup(self) -> None:
        """Remove our family's virtual servers (and only ours), rules, sets and device addresses,
        and the device when the other family has no address left on it. Idempotent; works on a
        kernel without IPVS or a host without ipset (then there is nothing of that kind to remove)."""
        with self._lock:
            addresses = self._addresses()
            try:
                nodeports = self._nodeport_entries(self.ipset.snapshot())
            except IpsetNotInstalled:
                nodeports = frozenset()
            try:
                servers = self._virtual_servers()
            except IpvsUnavailable:
                servers = []
            for server in servers:
                if _owned(server.key, addresses=addresses, nodeports=nodeports):
                    self.table.delete_virtual_server(server.key)
            remove_ipvs_rules(self.iptables, render_ipvs_chains(cluster_cidr=None, family=self.family))
            try:
                delete_owned_sets(self.ipset, prefix=set_prefix(self.family))
            except IpsetNotInstalled:
                pass
            other = IpFamily.V6 if self.family is IpFamily.V4 else IpFamily.V4
            if self.device.addresses(family=other):
                for address in sorted(addresses):
                    self.device.remove_address(address)
            else:
                self.device.delete()
            self._graceful.clear()
            self._plan, self._index, self._node, self._rendered = None, None, None, {}
            self._hairpin_known = False


def _owned(key: VirtualServerKey, *, addresses: Iterable[str], nodeports: frozenset[str]) -> bool:
    return key.address in addresses or entry(key.address, key.protocol, key.port) in nodeports


def _describe_real(real: RealServerStatus) -> str:
    if real.weight == READY_WEIGHT:
        return str(real.destination)
    return f"{real.destination} (weight {real.weight}, {real.connections} connections)"


def _real_server_count(index: PlanIndex) -> int:
    return sum(len(planned.destinations) for planned in index.all_servers())
