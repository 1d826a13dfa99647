"""The node agent in cluster mode: from watched Nodes to this node's routes, and back.

Start-up, in order, each step failing loudly rather than guessing:
1. list and watch Nodes (one reflector); wait for the first complete list;
2. read this node's lease (`spec.podCIDR(s)`, inside `--cluster-cidr`), waiting a bounded
   time for the controller to assign one;
3. choose the underlay interface and address (`node_address`);
4. create or adopt the backend's device, then announce this node (annotations) - only
   when they differ, so a restart writes nothing;
5. report the lease (pod CIDRs and the pods' MTU) to `on_lease` (the daemon writes the CNI
   network config from it, so pods get addresses from the lease with no per-node configuration);
6. program masquerade (iptables, or nftables when `HostAccess.nft` is given), every peer's routes
   and, in a tunnel mode, the tunnel source filter (`tunnel_filter.py`), then serve.

Dual-stack and IPv6-only: `--cluster-cidr` once per family; the node's `spec.podCIDRs` holds at
most one CIDR per family, and each family with both a cluster CIDR and a pod CIDR is routed by
its own `RoutedFamily` (`routed`, as kube-proxy runs one proxier per family): its `RouteManager`
(which holds the family's peer bounds) and its masquerade manager (through the family's runner
`HostAccess.iptables[family]`, or `ip6 netagent-masq`), with its forwarding sysctl on. The
underlay interface carries both families' addresses (announced as
`public-ip` and `public-ipv6`); the lease reports every pod CIDR. `--backend bgp` routes IPv4
only: with an IPv6 cluster CIDR it refuses to start, saying so (ipip's IPv6 form is `na-ipip6`).

Everything outside the process is handed in (`host.py`): the kernel (`HostAccess`: netlink,
sysctls, iptables, the kernel release) and the API (`NodeApi`), so unit tests run `start()`
on the fakes.

After that the seams of ARCHITECTURE.md hold: watch handlers only record which Nodes
changed (a `ChangeRecorder`, `node_changes`) and poke the runner; the runner's one thread applies the
recorded changes (partial sync) or reconciles everything (periodic full sync, which is
also the drift repair). Nothing is flushed on exit: a restarted agent adopts the kernel
state it finds, so established connections never notice.

Every other Node is untrusted: each is read alone (`read_peer`, which never raises) and the
planner admits only peers inside `bounds()` (the cluster CIDR, clear of `--service-cidr` and
this node's own networks) that take no claim from an older Node. Every Node refused either
way is rejected in `rejections` with its reason (and accepted again once usable or deleted),
so one bad Node costs no other its routes and /healthz lists it. When another writer changes
our own announcement, the sync that sees it patches back the keys that differ.
"""
from __future__ import annotations

import dataclasses
import ipaddress
import logging
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from netagent.infra.rejections import ObjectRef, RejectionScope, standalone
from netagent.infra.sync_runner import SyncKind
from netagent.kernel.families import IpFamily
from netagent.kernel.sysctl import ensure_sysctls, forwarding
from netagent.kube.changes import FanOut
from netagent.kube.reflector import EventHandler
from netagent.noderoutes import node_objects as nodes
from netagent.noderoutes.agent_inputs import (  # noqa: F401  (re-exported: the agent's inputs)
    DEFAULT_SERVICE_CIDRS,
    ROUTING_METADATA,
    AgentSettings,
    AgentStartError,
    auto_checksum_offload,
    checksum_offload,
    kernel_release_at_least,
    node_changes,
    own_networks,
    parse_cluster_cidrs,
    peer_bounds,
    parse_service_cidrs,
    routing_inputs_differ,
)
from netagent.noderoutes.host import HostAccess, Lease, Masquerade, NodeApi, NodeWatch
from netagent.noderoutes.routing.model import LocalNode, Mode, PeerBounds, RefusalReason, Refused, pod_mtu
from netagent.noderoutes.tunnel_filter import TunnelFilterLoop
from netagent.noderoutes.underlay import Underlay, choose_underlay

if TYPE_CHECKING:  # imported where used, at start-up
    from netagent.infra.status_server import HealthFunction, HealthReport
    from netagent.infra.sync_runner import SyncRunner
    from netagent.noderoutes.masquerade import MasqueradeManager
    from netagent.noderoutes.masquerade_nft import NftMasqueradeManager
    from netagent.noderoutes.routing.model import SyncReport
    from netagent.noderoutes.routing.routes import RouteManager

log = logging.getLogger("netagent.node")
NODE = "Node"  # the rejected objects' kind
REASSERT_MIN_INTERVAL = 5.0  # seconds between two restorations of our announcement (see _reassert_announcement)


@dataclass(frozen=True)
class RoutedFamily:
    """One routed family's managers: its routes (and the bounds its peers must keep) and its masquerade."""
    routes: RouteManager
    masquerade: MasqueradeManager | NftMasqueradeManager | None = None  # None with Masquerade.OFF


class NodeAgent:
    """Owns the node-routing half of the agent; the CLI composes it with the CNI server."""

    def __init__(self, settings: AgentSettings, *, api: NodeApi, host: HostAccess, registry,
                 node_listeners: Sequence[EventHandler] = (), rejections: RejectionScope | None = None,
                 on_lease: Callable[[Lease], None] = lambda lease: None) -> None:
        """`node_listeners` share this agent's Node watch (the service proxy's own-Node recorder):
        one process, one Node reflector. `rejections` records the Nodes refused as peers (the
        process's scope in the daemon; a private one otherwise). `on_lease` hears the lease once,
        during `start()`, before the first route sync; what it raises fails the start."""
        from netagent.noderoutes.metrics import NodeAgentMetrics
        self.settings = settings
        self.api = api
        self.host = host
        self.on_lease = on_lease
        self.metrics = NodeAgentMetrics(registry)
        self.tracker = node_changes(on_change=self._request_partial)
        self.node_listeners = tuple(node_listeners)
        self.reflector: NodeWatch | None = None
        self.routed: dict[IpFamily, RoutedFamily] = {}  # one per routed family, IPv4 first
        self.filter_loop = TunnelFilterLoop(host, resync_interval=settings.resync_interval)
        self.tunnel_filters = self.filter_loop.filters  # IpFamily -> TunnelFilter, built at the first sync
        self.runner: SyncRunner | None = None
        self.underlay: Underlay | None = None
        self.pod_cidrs: tuple = ()
        self.last_report: SyncReport | None = None
        self._runner_health: tuple[HealthFunction, ...] = ()  # the route runner's, the tunnel filter's
        self.rejections = rejections if rejections is not None else standalone("noderoutes")
        self.host_networks: tuple = ()  # (network, what): this node's own, read again at every sync
        self._unusable: dict[str, nodes.Unusable] = {}  # Nodes read_peer refused, by name
        self._rejected: set[str] = set()  # Node names currently rejected in self.rejections
        self._announcement: dict[str, str] = {}  # what start() announced; re-asserted when changed
        self._reasserted_at: float | None = None  # time.monotonic() of the last restoration
        self.monotonic: Callable[[], float] = time.monotonic  # tests hold time still

    # ------------------------------------------------------------ start-up
    def start(self) -> None:
        from netagent.infra.sync_runner import SyncResult, SyncRunner

        self.prepare()
        runner = self.runner = SyncRunner(name="node-routes", sync=self._sync,
                                          min_interval=self.settings.min_sync_interval,
                                          max_interval=self.settings.resync_interval, retry_interval=1.0)
        self.filter_loop.runner.start()
        runner.start()
        if runner.run_now_and_wait(timeout=120, kind=SyncKind.FULL) is not SyncResult.SUCCEEDED:
            raise AgentStartError(f"the first route sync failed: {runner.status().last_error}")
        if self.filter_loop.runner.run_now_and_wait(timeout=120) is not SyncResult.SUCCEEDED:
            raise AgentStartError(f"the first tunnel filter sync failed: {self.filter_loop.runner.status().last_error}")
        report = self.last_report
        assert report is not None, "a succeeded sync records its report"
        log.info("first sync: %d peer(s) %s (added %d, removed %d, unchanged %d); refused %s; pending %s",
                 sum(report.peers_by_mode.values()), report.peers_by_mode, report.added, report.removed,
                 report.unchanged, report.refused or "none", report.pending or "none")

    def prepare(self) -> None:
        """Steps 1 to 5 of the module docstring: everything `start()` does before its runner's
        first sync (unit tests stop here and run `_sync` themselves)."""
        reflector = self.reflector = self.api.watch(FanOut(self.tracker, *self.node_listeners))
        self.metrics.watch_reflector(reflector)
        reflector.start()
        own = self._wait_for_lease(reflector)
        underlay = self.underlay = self._choose_underlay(own)
        log.info("underlay: %s %s (%s), MTU %d", underlay.ifname, underlay.public_ip,
                 underlay.reason, underlay.mtu)
        self._enable_forwarding()
        self.routed = {family: self._build_managers(underlay, family, own) for family in self.families()}
        for family, routed in self.routed.items():
            routed.routes.keep_devices = frozenset(device.ifname for other, peer in self.routed.items()
                                                   if other is not family for device in peer.routes.devices)
            routed.routes.ipv6_routed = IpFamily.V6 in self.routed
        if self.host.bgp is not None:  # BIRD's writes to our table poke the runner (event-driven)
            self.host.bgp.watch_learnt(self._request_partial)
            self.host.bgp.register_metrics(self.metrics.registry)
        backend_data: dict[str, str] = {}
        for routed in self.routed.values():
            backend_data.update(routed.routes.ensure_local())
        self._announce(own, backend_data, underlay)
        self._report_lease(underlay)

    def _request_partial(self) -> None:
        if self.runner is not None:
            self.runner.request(SyncKind.PARTIAL)

    def health(self) -> HealthReport:
        from netagent.infra.status_server import HealthReport, health_from_sync_runner
        if self.runner is None:
            return HealthReport(healthy=False, reason="starting: waiting for the lease and the first sync",
                                details={})
        if not self._runner_health:
            self._runner_health = tuple(health_from_sync_runner(runner, stale_after=max(
                60.0, 2 * self.settings.resync_interval)) for runner in (self.runner, self.filter_loop.runner))
        bird_down = self.host.bgp.health_error() if self.host.bgp is not None else ""
        if bird_down:
            return HealthReport(healthy=False, reason=bird_down, details={})
        reports = [health() for health in self._runner_health]  # refused Nodes: the daemon lists every rejection
        return next((report for report in reports if not report.healthy), reports[0])

    def stop(self) -> None:
        if self.runner is not None:
            self.runner.stop(timeout=5)
        self.filter_loop.runner.stop(timeout=5)
        if self.reflector is not None:
            self.reflector.stop()
        if self.host.bgp is not None:  # peers hold our routes while the next agent starts BIRD again
            self.host.bgp.stop(withdraw=False)

    def families(self) -> tuple[IpFamily, ...]:
        """The families this node routes: those with a cluster CIDR and a pod CIDR (IPv4 first)."""
        cluster = {IpFamily.of(c) for c in self.settings.cluster_cidrs}
        return tuple(family for family in IpFamily
                     if family in cluster and any(family.holds(c) for c in self.pod_cidrs))

    def _wait_for_lease(self, reflector: NodeWatch) -> dict:
        name = self.settings.node_name
        if not reflector.synced.wait(timeout=self.settings.lease_timeout):
            raise AgentStartError(f"could not list Nodes from the API server within "
                                  f"{self.settings.lease_timeout:.0f} s")
        deadline = self.monotonic() + self.settings.lease_timeout
        said = None
        while True:
            own = reflector.store.get(name)
            if own is None:
                problem = f"node {name} does not exist in the API (check --node-name / NODE_NAME)"
            else:
                try:
                    self.pod_cidrs = nodes.node_pod_cidrs(own, cluster_cidrs=list(self.settings.cluster_cidrs))
                    log.info("lease: node %s, pod CIDR(s) %s", name, ", ".join(map(str, self.pod_cidrs)))
                    return own
                except nodes.LeaseError as exc:
                    if nodes.pod_cidr_strings(own):  # set but wrong: waiting will not fix it
                        raise AgentStartError(str(exc)) from None
                    problem = str(exc)
            if self.monotonic() >= deadline:
                raise AgentStartError(problem)
            if problem != said:
                log.warning("waiting: %s", problem)
                said = problem
            time.sleep(0.2)

    def _choose_underlay(self, own: dict) -> Underlay:
        from netagent.noderoutes.underlay import UnderlayError
        snapshot = self.host.kernel.underlay_snapshot()
        self.host_networks = own_networks(snapshot)
        families = self.families()
        if not families:
            raise AgentStartError(f"node {self.settings.node_name}: no pod CIDR ({', '.join(map(str, self.pod_cidrs))}) "
                                  f"is of a family with a --cluster-cidr")
        try:
            return choose_underlay(snapshot, iface=self.settings.iface, iface_regex=self.settings.iface_regex,
                                   public_ip_override=nodes.node_annotations(own).get(nodes.PUBLIC_IP_OVERWRITE),
                                   families=families)
        except UnderlayError as exc:
            raise AgentStartError(str(exc)) from None

    def _enable_forwarding(self) -> None:
        """Pods' traffic is routed through this node: forwarding must be on in its namespace (per family)."""
        ensure_sysctls(self.host.sysctls, [forwarding(family) for family in self.families()])

    def _build_managers(self, underlay: Underlay, family: IpFamily = IpFamily.V4, own: dict | None = None) \
            -> RoutedFamily:
        """`family`'s route manager and, when masquerading is on, its masquerade manager."""
        from netagent.noderoutes.masquerade import MasqueradeManager
        from netagent.noderoutes.routing.routes import RouteManager
        address = underlay.address_of(family)
        assert address is not None, "choose_underlay holds an address of every routed family"
        local = LocalNode(name=self.settings.node_name, public_ip=address[0],
                          underlay_ifname=underlay.ifname, underlay_network=address[1],
                          underlay_mtu=underlay.mtu,
                          pod_cidrs=tuple(c for c in self.pod_cidrs if family.holds(c)),
                          vtep_mac=self._vtep_mac(own, family))
        routing = dataclasses.replace(self.settings.routing, vxlan_checksum_offload=checksum_offload(
            self.settings.checksum_offload, kernel_release=self.host.kernel_release, behind_nat=underlay.behind_nat))
        bgp = self.host.bgp
        if IpFamily.V6 in self.families() and (routing.mode is Mode.BGP or bgp is not None):
            raise AgentStartError("--backend bgp (and --auto-bgp) route IPv4 only: BIRD's configuration here has no "
                                  "IPv6 channel; with an IPv6 --cluster-cidr use vxlan, host-gw or auto")
        if routing.mode is Mode.BGP and bgp is None:
            raise AgentStartError("--backend bgp needs BIRD (the daemon hands the agent a BgpSpeaker)")
        try:
            route_manager = RouteManager(kernel=self.host.kernel, settings=routing, local=local,
                                         bounds=self.bounds(family), learnt=bgp.learnt if bgp is not None else None)
        except ValueError as exc:  # e.g. an encapsulation device without a pod CIDR of its family
            raise AgentStartError(f"{family.label} pod CIDR {', '.join(map(str, local.pod_cidrs))}: {exc}") from None
        masquerade: MasqueradeManager | NftMasqueradeManager | None = None
        cluster_cidrs = [c for c in self.settings.cluster_cidrs if family.holds(c)]
        pod_cidrs = list(local.pod_cidrs)
        iptables = self.host.iptables.get(family)
        if self.settings.masquerade is Masquerade.ON and self.host.nft is not None:
            from netagent.noderoutes.masquerade_nft import NftMasqueradeManager
            masquerade = NftMasqueradeManager(nft=self.host.nft, forward_iptables=iptables,
                                              cluster_cidrs=cluster_cidrs, pod_cidrs=pod_cidrs, family=family)
        elif self.settings.masquerade is Masquerade.ON:
            if iptables is None:
                raise AgentStartError(f"masquerade is on but no {family.command} runner was given")
            masquerade = MasqueradeManager(runner=iptables, cluster_cidrs=cluster_cidrs, pod_cidrs=pod_cidrs)
        return RoutedFamily(route_manager, masquerade)

    def _vtep_mac(self, own: dict | None, family: IpFamily) -> str | None:
        """Our `family` VTEP MAC (vxlan): the device's, else our Node's announced one, never another
        Node's (`routes.choose_vtep_mac`); random on a new node, so no Node can squat it in advance."""
        from netagent.noderoutes.routing.routes import choose_vtep_mac
        from netagent.noderoutes.routing.vxlan import vxlan_ifname
        if self.settings.routing.encap is not Mode.VXLAN or self.reflector is None:
            return None
        store, v6 = self.reflector.store, family is IpFamily.V6
        taken = {nodes.announced_vtep_mac(store.get(n), ipv6=v6) for n in store.keys() if n != self.settings.node_name}
        return choose_vtep_mac(self.host.kernel, vxlan_ifname(self.settings.routing, family),
                               announced=nodes.announced_vtep_mac(own, ipv6=v6), taken=taken)

    def bounds(self, family: IpFamily = IpFamily.V4) -> PeerBounds:
        """Where peers' pod CIDRs of `family` may lie (`agent_inputs.peer_bounds`)."""
        return peer_bounds(self.settings, family, pod_cidrs=self.pod_cidrs, host_networks=self.host_networks)

    def _refresh_own_networks(self, *, always: bool = True) -> None:
        """Read this node's own addresses again (full syncs; partial ones after the kernel announced a
        link or address change): one added after start is no peer's either."""
        if not self.host.kernel.addresses_changed() and not always:  # called every sync: drains the news
            return
        networks = own_networks(self.host.kernel.underlay_snapshot())
        if networks != self.host_networks:
            if self.host_networks:
                log.info("this node's own addresses changed: %s", ", ".join(sorted({str(n) for n, _ in networks})))
            self.host_networks = networks
            for family, routed in self.routed.items():
                routed.routes.bounds = self.bounds(family)

    def _announce(self, own: dict, backend_data: dict, underlay: Underlay) -> None:
        self._announcement = nodes.render_announcement(backend_type=self.settings.routing.mode.value,
                                                       public_ip=underlay.public_ip, backend_data=backend_data,
                                                       public_ipv6=underlay.public_ipv6)
        changed = self._announcement_drift(own)
        if not changed:
            return
        deadline = self.monotonic() + self.settings.lease_timeout
        while True:
            try:
                self.api.annotate(self.settings.node_name, changed)
                break
            except Exception as exc:  # the API server may be restarting: retry, then give up loudly
                if self.monotonic() >= deadline:
                    raise AgentStartError(f"could not annotate node {self.settings.node_name}: {exc}") from None
                log.warning("annotating node %s failed (%s); retrying", self.settings.node_name, exc)
                time.sleep(1.0)
        log.info("announced: %s", ", ".join(f"{k}={v}" for k, v in sorted(changed.items())))

    def _announcement_drift(self, own: object) -> dict:
        """Our announcement's keys whose value on our Node differs from what we announced."""
        current = nodes.node_annotations(own)
        return {key: value for key, value in self._announcement.items() if current.get(key) != value}

    def _reassert_announcement(self) -> None:
        """Another writer changed our announcement under us: patch it back. Only keys that differ
        are written and our own write comes back equal, so there is no patch loop with ourselves;
        against a writer that keeps fighting (a second agent with our node name) restorations are
        at least REASSERT_MIN_INTERVAL apart, the ones in between left to a later sync (every full
        sync looks). A failure is logged and retried the same way; routing goes on either way."""
        assert self.reflector is not None, "the reflector exists before any sync"
        own = self.reflector.store.get(self.settings.node_name)
        if own is None or not self._announcement:
            return
        changed = self._announcement_drift(own)
        if not changed:
            return
        now = self.monotonic()
        if self._reasserted_at is not None and now - self._reasserted_at < REASSERT_MIN_INTERVAL:
            log.debug("announcement drift on node %s: restored %.1f s ago, waiting", self.settings.node_name,
                      now - self._reasserted_at)
            return
        self._reasserted_at = now
        log.warning("node %s: our announcement was changed by another writer (%s); restoring it",
                    self.settings.node_name, ", ".join(sorted(changed)))
        try:
            self.api.annotate(self.settings.node_name, changed)
        except Exception as exc:  # the API may be down: the next sync retries, routing goes on
            log.warning("restoring the announcement on node %s failed: %s", self.settings.node_name, exc)

    def _report_lease(self, underlay: Underlay) -> None:
        routing = self.settings.routing
        self.on_lease(Lease(node_name=self.settings.node_name, pod_cidrs=tuple(self.pod_cidrs),
                            mtu=pod_mtu(routing.mode, routing.auto_encap, underlay.mtu,
                                        underlay_families=self.families())))

    # ------------------------------------------------------------ sync
    def peers(self, names: Iterable[str] | None = None) -> tuple[list, list]:
        """(peers, removed names) for the given Node names, or for all Nodes. Each Node is read on
        its own (`read_peer` is total): one that cannot be read is remembered as unusable and
        removed from routing, and costs no other Node anything."""
        assert self.reflector is not None, "start() creates the reflector before anything asks for peers"
        store = self.reflector.store
        wanted = store.keys() if names is None else names
        if names is None:
            self._unusable.clear()
        peers, removed, pending = [], [], {}
        for name in wanted:
            if name == self.settings.node_name:
                continue
            self._unusable.pop(name, None)
            node = store.get(name)
            if node is None:
                removed.append(name)
                continue
            found = nodes.read_peer(node)
            if isinstance(found, nodes.Unusable):
                self._unusable[name] = found
                removed.append(name)
            elif isinstance(found, nodes.NotYet):
                pending[name] = found.detail
                removed.append(name)  # whatever we programmed for it is no longer right
            elif found.name != name:  # the store's key is the truth; a mismatch is not this Node
                self._unusable[name] = nodes.Unusable(RefusalReason.MALFORMED,
                                                      f"metadata.name {found.name!r} is not its key")
                removed.append(name)
            else:
                peers.append(found)
        if pending:
            log.debug("pending peers: %s", pending)
        return peers, removed

    def _sync(self, kind: SyncKind) -> None:
        assert self.routed, "start() builds the managers before the runner that syncs"
        started = time.monotonic()
        try:
            self._refresh_own_networks(always=kind is SyncKind.FULL)
            if kind is SyncKind.FULL:
                self.tracker.drain()
                self._reassert_announcement()
                for routed in self.routed.values():
                    routed.routes.ensure_local()
                peers, _ = self.peers()
                report = self._each_family(lambda manager: manager.sync_all(peers))
                for routed in self.routed.values():
                    if routed.masquerade is not None:
                        routed.masquerade.ensure()
            else:
                changed = set(self.tracker.drain())
                if self.settings.node_name in changed:
                    self._reassert_announcement()
                peers, removed = self.peers(changed)
                report = self._each_family(lambda manager: manager.apply_changes(upserts=peers, removals=removed))
        except Exception as exc:
            self.metrics.sync_errors.inc()
            partial = getattr(exc, "report", None)
            if partial is not None:  # RoutingApplyError: the plan stands, its refusals are known
                self._record_rejections(partial)
            raise
        self._record_rejections(report)
        self._configure_bgp(report)
        self.filter_loop.hand({f: r.routes for f, r in self.routed.items()}, report, kind)  # its own runner writes
        self.last_report = report  # refused and pending peers are logged by the RouteManager, once per reason
        self.metrics.record_sync(kind.name.lower(), time.monotonic() - started, report)

    def _each_family(self, sync: Callable[[RouteManager], SyncReport]) -> SyncReport:
        """Run `sync` on every family's manager (each even when another failed) and merge the reports:
        counts add up, a peer refused in any family is refused (the first family's refusal, carrying its family)."""
        from netagent.noderoutes.routing.model import RoutingApplyError, SyncReport
        merged, failures = SyncReport(), dict[str, str]()
        for family, routed in self.routed.items():
            try:
                report = sync(routed.routes)
            except RoutingApplyError as exc:
                report = exc.report
                failures.update((f"{family.label} {what}", why) for what, why in exc.failures.items())
            merged.added += report.added
            merged.removed += report.removed
            merged.unchanged += report.unchanged
            for name, refused in report.refused.items():
                merged.refused.setdefault(name, refused if refused.family is not None
                                          else dataclasses.replace(refused, family=family))
            merged.pending = sorted(set(merged.pending) | set(report.pending))
            for mode, count in report.peers_by_mode.items():
                merged.peers_by_mode[mode] = merged.peers_by_mode.get(mode, 0) + count
        if failures:
            raise RoutingApplyError(failures, merged)
        return merged

    def _configure_bgp(self, report: SyncReport) -> None:
        """BIRD's configuration from this sync's view: the peers the IPv4 plan admitted (`noderoutes/bgp/`)."""
        bgp, underlay, reflector, routed = self.host.bgp, self.underlay, self.reflector, self.routed.get(IpFamily.V4)
        if bgp is None or underlay is None or reflector is None or routed is None:
            return
        if not isinstance(underlay.public_ip, ipaddress.IPv4Address) or \
                not isinstance(underlay.network, ipaddress.IPv4Network):
            return  # BGP is IPv4 only (refused at start with an IPv6 cluster CIDR)
        admitted = [p for p in routed.routes.known_peers() if p.name not in report.refused and p.pod_cidrs]
        bgp.configure_from_cluster(node_name=self.settings.node_name, address=underlay.public_ip,
                                   pod_cidrs=self.pod_cidrs, admitted=admitted, nodes=reflector.store.get,
                                   local_network=underlay.network)

    def _record_rejections(self, report: SyncReport) -> None:
        """Every Node refused now (unreadable, added to `report.refused` here, or refused by the
        plan) is rejected with its reason; one refused before and usable or gone now is accepted."""
        assert self.reflector is not None, "the reflector exists before any sync"
        store = self.reflector.store
        report.refused.update((name, Refused(bad.detail, bad.reason)) for name, bad in self._unusable.items())
        now = {name: (refused.label.value, refused.detail) for name, refused in report.refused.items()}
        for name, (reason, detail) in now.items():
            ref = dataclasses.replace(ObjectRef.of(NODE, store.get(name), key=name), namespace="", name=name)
            self.rejections.reject(ref, reason=reason, detail=detail)
        for name in self._rejected - now.keys():
            self.rejections.accept(kind=NODE, key=name)
        self._rejected = set(now)
