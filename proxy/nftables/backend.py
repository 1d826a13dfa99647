"""`NftablesProxy`: the nftables service-proxy backend, one nft transaction per sync.

Full sync (the first, the periodic one, every one after a failure): the table is read back
(`Nft.list_table`, libnftables JSON, `tables.read_table`) and only the difference from the
rendered table is written (`changes.table_changes`; a table in a layout this version does not
write is replaced whole in the same transaction), so an agent restarted over its own table
writes NOTHING, and an element or rule deleted by hand comes back at the next full sync.
Partial sync (`changed` given, and the backend remembers what it last wrote): only the changed
service ports are rendered again, and only their elements (and the balancing or affinity
chains they start or stop needing) are written; nothing is read. Either is ONE `Nft.apply`
(one transaction); any failure raises and forgets the memory, so the next sync is full even
if the core did not ask.

How it is written (`Changes.apply`). Chains, rules and set declarations: nft text through
libnftables (`Nft.apply`); a change of elements only (every partial sync that starts or stops
no chain, a full sync repairing elements) and the elements of a table the kernel does not
hold yet (the first sync: skeleton as text, then the elements): netlink messages written by
`netagent/kernel/nftables/netlink.py` (`Nft.apply_elements`), one transaction each. Measured
at 10,000 Services x 10 endpoints (132,000 elements): libnftables parsing the text took
1.2-1.5 s of CPU and left 260 MiB of heap in the process; JSON was no faster; the netlink
batch is encoded in about 0.5 s and the kernel's share is 0.3 s. The text stays the
readable form of every change (`Changes.text`, what `FakeNft` runs and the goldens hold).

Costs that stay (nft 1.0.6): listing the table is about 3 s per 130,000 elements (libnftables'
own listing, text or JSON), paid by every full sync (the periodic one too); and the first
command after a listing pays libnftables' release of that cache (0.2-0.5 s at 10,000 Services),
which a partial sync right after a write-free full sync meets.

Dual-stack: one `NftablesProxy` per family (`family=IpFamily.V6`: the table `ip6 netagent`,
spelled by spelling.py), each fed that family's `ProxyState`, as kube-proxy runs a proxier per
family; the two never touch each other's table, but `cleanup` removes both.

A service port whose values nft text cannot carry (render.UnrenderablePort: an address of the
other family, a string `text` refuses) is left out and reported in
`BackendSyncReport.unprogrammed`, as the iptables backend reports the ports its tool refused;
the core rejects it through the proxy's `RejectionScope` until it changes.
"""
from __future__ import annotations

import logging
from types import MappingProxyType

from netagent.infra.sync_runner import SyncKind
from netagent.kernel.families import IpFamily
from netagent.kernel.nftables.changes import Changes, table_changes
from netagent.kernel.nftables.model import render_delete
from netagent.kernel.nftables.runner import Nft
from netagent.kernel.nftables.tables import read_table
from proxy.backend import BackendSyncReport, ProgrammedService, ProxyBackend, ProxyMode
from proxy.large_sync import collector_paused
from proxy.model import ProxyState, ServicePortName
from proxy.nftables import names as N
from proxy.nftables.assembly import Assembly, assemble, changed_ports
from proxy.nftables.render import NftProxySettings, PortObjects, UnrenderablePort, render_port
from proxy.nftables.status import programmed_services

log = logging.getLogger("netagent.proxy.nftables")


class NftablesProxy(ProxyBackend):
    mode = ProxyMode.NFTABLES

    def __init__(self, *, nft: Nft, settings: NftProxySettings | None = None,
                 family: IpFamily = IpFamily.V4) -> None:
        self.nft = nft
        self.settings = (settings or NftProxySettings()).of_family(family)
        self.family = family
        self._written: Assembly | None = None      # what the last successful sync left in the kernel
        self._refused: dict[ServicePortName, str] = {}
        self.applies = 0                           # transactions written (tests, bench)

    # ---- sync ---------------------------------------------------------------------------------

    def sync(self, state: ProxyState, *, changed: frozenset[ServicePortName] | None) -> BackendSyncReport:
        if state.family is not self.family:   # a wiring error: every port would be refused
            raise ValueError(f"an {state.family.label} ProxyState handed to the {self.family.label} nftables proxy")
        previous, self._written = self._written, None    # forgotten until this sync succeeds
        if changed is not None and previous is not None and previous.node == state.node:
            assembly, changes, written = self._partial(previous, state, changed)
            scope = SyncKind.PARTIAL
        else:
            previous = None   # not kept beside the new one: a 10k-Service assembly is tens of MiB
            with collector_paused():   # hundreds of thousands of short-lived objects (large_sync.py)
                assembly, changes, written = self._full(state)
                self.applies += changes.apply(self.nft)   # the encoding's too (netlink.py)
            scope = SyncKind.FULL
        if scope is SyncKind.PARTIAL:
            self.applies += changes.apply(self.nft)
        self._written = assembly
        contents_size = assembly.size()
        unprogrammed = MappingProxyType(dict(self._refused))
        return BackendSyncReport(scope=scope, services_written=written, rules=contents_size,
                                 detail=f"{scope.value} sync: {written} service port(s) written, "
                                        f"{changes.writes} nft writes, {contents_size} elements and rules"
                                        + (f", {len(unprogrammed)} left out" if unprogrammed else ""),
                                 unprogrammed=unprogrammed)

    def _render(self, state: ProxyState, name: ServicePortName) -> PortObjects | None:
        self._refused.pop(name, None)
        if name not in state.services:
            return None
        try:
            return render_port(state.services[name], state.selection(name), node=state.node, settings=self.settings)
        except UnrenderablePort as error:
            log.warning("%s", error)
            self._refused[name] = f"cannot be written as nft text: {error.reason}"
            return None

    def _full(self, state: ProxyState) -> tuple[Assembly, Changes, int]:
        self._refused.clear()
        ports = [port for port in (self._render(state, name) for name in state.services) if port is not None]
        assembly = assemble(ports, node=state.node, settings=self.settings)
        held = read_table(self.family.nft, N.TABLE, self.nft.list_table(self.family.nft, N.TABLE))
        return assembly, table_changes(assembly.table(), held), len(ports)

    def _partial(self, assembly: Assembly, state: ProxyState,
                 changed: frozenset[ServicePortName]) -> tuple[Assembly, Changes, int]:
        declared = {entry.name: entry for entry in self.settings.spelling.holders}   # element writes encode by type
        changes = Changes(self.family.nft, N.TABLE, declared=declared)
        renders: dict[ServicePortName, tuple[PortObjects | None, PortObjects | None]] = {}
        for name in sorted(changed):
            old, new = assembly.ports.get(name), self._render(state, name)
            if old is not None or new is not None:
                renders[name] = (old, new)
        changed_ports(assembly, renders, changes)
        return assembly, changes, len(renders)

    # ---- read back and clean up ----------------------------------------------------------------

    def programmed(self) -> list[ProgrammedService]:
        table = read_table(self.family.nft, N.TABLE, self.nft.list_table(self.family.nft, N.TABLE))
        return [] if table is None else programmed_services(table, self.family)

    def cleanup(self) -> None:
        """Delete our table (every family's); idempotent."""
        self._written = None
        ours = [(family, name) for family, name in self.nft.tables() if name == N.TABLE and family in N.FAMILIES]
        if ours:
            self.nft.apply("".join(render_delete(family, name) for family, name in ours))
