"""The service proxy: Services and EndpointSlices in, one backend's kernel state out.

Shape (ARCHITECTURE.md's seams, kube-proxy's behaviour):

- three reflectors (Services, EndpointSlices, and this node's own Node for its zone label;
  inside `netagent run` the Node events come from the node agent's reflector instead,
  `NodeSource.SHARED`, so one process watches Nodes once) feed `ChangeRecorder`s, which only record and ask the `SyncRunner` for a run;
- nothing is programmed before all three have listed once: the first request is made by
  whichever of them syncs last, so a restarting agent never writes a ruleset computed from
  half a cache (which would briefly delete services);
- each run (`_sync`) drains the recorders into the `ServiceCatalog`, hands the backend the
  new snapshot plus the service ports that changed (or `None`: a full sync, the first, the
  periodic one every `sync_period`, and every one after a failure), then deletes stale UDP
  conntrack entries, updates the health-check node ports and the metrics;
- a backend that needs a sync at a given time with nothing changed (IPVS, when a draining
  real server's timeout ends) says so through `next_sync_due()`, and a timer asks for one;
- runs are at least `min_sync_period` apart (with a burst of 2 as kube-proxy), so a storm
  of endpoint changes becomes a few syncs, each writing only what changed.

One `ServiceProxy` programs one IP family (`ProxySettings.family`), as kube-proxy runs one
proxier per family: a dual-stack node runs two, each with its own catalog, backend and sync
runner (`proxy`, `proxy-ipv6`), sharing one `ProxyMetrics` (kube-proxy's names; the gauges
add up both families). An IPv4-only node runs exactly one, named `proxy`.

Services and slices carrying `service.kubernetes.io/service-proxy-name` belong to another
proxy and are not watched, as with kube-proxy; nor are headless services' slices.

Nothing is lost on the way: the catalog parses each object alone and rejects a bad one
(`rejections`, the proxy's `RejectionScope`) without costing any other its change; drained
changes go back to their recorders (`requeue`) should `apply` ever raise; a failed backend sync
keeps the catalog's state, and the next (full) sync programs it. A service port the backend
could not program (`BackendSyncReport.unprogrammed`: iptables-restore refused its lines
while the rest went in) is rejected as `unprogrammable` until it is programmed; the sync
succeeds, so the node stays healthy for everything else and its health details name it.
"""
from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, replace
from enum import Enum

from netagent.infra.metrics import Registry
from netagent.infra.rejections import ObjectRef, RejectionScope, standalone
from netagent.infra.sync_runner import SyncKind, SyncRunner
from netagent.kernel.families import IpFamily
from netagent.kube.changes import ChangeRecorder
from netagent.kube.config import api_server_addresses
from netagent.kube.reflector import Reflector
from netagent.kube.resources import ENDPOINT_SLICES, NODES, SERVICES
from proxy.backend import BackendSyncReport, ProxyBackend
from proxy.catalog import ServiceCatalog
from proxy.conntrack import Conntrack, stale_flows
from proxy.healthcheck import HealthCheckAnswer, HealthCheckPorts
from proxy.kube_objects import node_zone
from proxy.limits import DEFAULT_LIMITS, ProxyLimits
from proxy.local_addresses import LocalAddresses
from proxy.metrics import ProxyMetrics
from proxy.model import NodeContext, ProxyState, ServicePortName, TrafficPolicy
from proxy.nodeport_addresses import nodeport_addresses, of_family

log = logging.getLogger("netagent.proxy")

OTHER_PROXY_SELECTOR = "!service.kubernetes.io/service-proxy-name"
SLICE_SELECTOR = f"{OTHER_PROXY_SELECTOR},!service.kubernetes.io/headless"


class NodeSource(Enum):
    """Where the proxy hears about its own Node."""
    OWN_WATCH = "own-watch"  # its own reflector, field-selected to this node (the proxy alone)
    SHARED = "shared"        # the caller feeds `proxy.node` from a Node reflector it already runs


@dataclass(frozen=True)
class ProxySettings:
    node_name: str
    cluster_cidr: str | None = None
    nodeport_cidrs: tuple[str, ...] = ()  # NodePorts answer on local addresses in these; empty: on all
    min_sync_period: float = 1.0
    sync_period: float = 30.0
    retry_period: float = 5.0
    limits: ProxyLimits = DEFAULT_LIMITS
    family: IpFamily = IpFamily.V4   # cluster_cidr and nodeport_cidrs of this family only


def runner_name(family: IpFamily) -> str:
    """The proxy's sync runner name in /healthz: `proxy` (IPv4, as always), `proxy-ipv6`."""
    return "proxy" if family is IpFamily.V4 else f"proxy-{family.label.lower()}"


def _is_node(name: str):
    """The own-Node filter, reading defensively: it runs on a watch thread (the node agent's,
    with a shared Node watch), where a malformed Node must not raise."""
    def accept(node: dict) -> bool:
        metadata = node.get("metadata") if isinstance(node, dict) else None
        return isinstance(metadata, dict) and metadata.get("name") == name
    return accept


class ServiceProxy:
    def __init__(
        self,
        *,
        api_client,
        settings: ProxySettings,
        backend: ProxyBackend,
        registry: Registry,
        conntrack: Conntrack | None = None,
        healthcheck: HealthCheckPorts | None = None,
        local_addresses: LocalAddresses | None = None,   # None: the node's addresses are not read
        node_source: NodeSource = NodeSource.OWN_WATCH,
        rejections: RejectionScope | None = None,
        metrics: ProxyMetrics | None = None,   # shared by the proxies of a dual-stack node
    ) -> None:
        self.settings = settings
        self.family = settings.family
        self.backend = backend
        self.metrics = metrics if metrics is not None else ProxyMetrics(registry, table_fill=backend.table_fill)
        self._conntrack = conntrack
        self._healthcheck = healthcheck
        self._local_addresses = local_addresses
        self.services = ChangeRecorder("services", on_change=self._on_change)
        self.slices = ChangeRecorder("endpointslices", on_change=self._on_change)
        self.node = ChangeRecorder("node", on_change=self._on_change, accept=_is_node(settings.node_name))
        self.reflectors = [
            Reflector(api_client=api_client, resource=SERVICES, handler=self.services,
                      label_selector=OTHER_PROXY_SELECTOR),
            Reflector(api_client=api_client, resource=ENDPOINT_SLICES, handler=self.slices,
                      label_selector=SLICE_SELECTOR),
        ]
        if node_source is NodeSource.OWN_WATCH:
            self.reflectors.append(Reflector(api_client=api_client, resource=NODES, handler=self.node,
                                             field_selector=f"metadata.name={settings.node_name}"))
        self.rejections = rejections if rejections is not None else standalone("proxy")
        self.catalog = ServiceCatalog(NodeContext(name=settings.node_name, cluster_cidr=settings.cluster_cidr,
                                                  family=self.family),
                                      family=self.family, limits=settings.limits, rejections=self.rejections,
                                      api_servers=[str(a) for a in api_server_addresses(api_client)])
        self._unprogrammable: dict[str, str] = {}   # service key -> why the backend could not program it
        self._programmed = self.catalog.state()  # what the kernel holds, as far as we know
        self._trigger_times: list[float] = []    # of slice changes not yet programmed
        self.last_report: BackendSyncReport | None = None
        self._missing_local: dict[ServicePortName, frozenset[str]] = {}
        self._wake_up: threading.Timer | None = None
        self.runner = SyncRunner(name=runner_name(self.family), sync=self._sync, min_interval=settings.min_sync_period,
                                 max_interval=settings.sync_period, retry_interval=settings.retry_period, burst=2)

    # -- lifecycle -------------------------------------------------------------------------------
    def start(self) -> None:
        self.runner.start()
        for reflector in self.reflectors:
            reflector.start()

    def stop(self) -> None:
        self._wake_up_at(None)
        for reflector in self.reflectors:
            reflector.stop()
        self.runner.stop()
        if self._healthcheck is not None:
            self._healthcheck.close()

    @property
    def synced(self) -> bool:
        return all(recorder.synced.is_set() for recorder in (self.services, self.slices, self.node))

    def wait_synced(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        for recorder in (self.services, self.slices, self.node):
            if not recorder.synced.wait(max(0.0, deadline - time.monotonic())):
                return False
        return True

    def _on_change(self) -> None:
        self.metrics.last_queued.set(time.time())
        if self.synced:
            self.runner.request(SyncKind.PARTIAL)

    # -- one run ---------------------------------------------------------------------------------
    def _node_context(self, kind: SyncKind) -> NodeContext:
        node_object = None
        for _, current in self.node.drain().values():
            node_object = current
        node = self.catalog.node
        if node_object is not None:
            node = replace(node, zone=node_zone(node_object))
        if kind is SyncKind.FULL:
            local = self._local_addresses.of_family(self.family) if self._local_addresses is not None else ()
            node = replace(node, local_addresses=local)
            cidrs = of_family(self.settings.nodeport_cidrs, self.family)
            if cidrs:
                chosen = nodeport_addresses(local, cidrs)
                if chosen:
                    node = replace(node, nodeport_addresses=chosen)
                else:
                    log.warning("no local address is inside --nodeport-addresses %s (local: %s); NodePorts keep "
                                "answering on %s", ",".join(cidrs), ", ".join(local) or "none",
                                ", ".join(node.nodeport_addresses) or "no address")
        return node

    def _sync(self, kind: SyncKind) -> None:
        started = time.monotonic()
        node_changed = self.catalog.set_node(self._node_context(kind))
        service_changes, slice_changes = self.services.drain(), self.slices.drain()
        self.metrics.service_changes.inc(len(service_changes))
        self.metrics.endpoint_changes.inc(len(slice_changes))
        try:
            update = self.catalog.apply(service_changes, slice_changes)
        except BaseException:   # none lost: the next sync applies them
            self.services.requeue(service_changes)
            self.slices.requeue(slice_changes)
            raise
        self._trigger_times.extend(update.trigger_times)
        full = kind is SyncKind.FULL or node_changed
        try:
            report = self.backend.sync(update.state, changed=None if full else update.changed)
        except Exception:
            self.metrics.failures.inc()
            if not full:
                self.metrics.partial_failures.inc()
            raise
        finally:
            self.metrics.of_family(self.family, self.metrics.service_changes_pending, self.services.pending())
            self.metrics.of_family(self.family, self.metrics.endpoint_changes_pending, self.slices.pending())
        changed = update.state.changed_since(self._programmed) if full else update.changed
        previous, self._programmed = self._programmed, update.state
        self.last_report = report
        self._report_unprogrammable(report)
        self._wake_up_at(self.backend.next_sync_due())
        self._after_sync(previous, update.state, changed)
        self._observe(report, full=full, changed=changed, seconds=time.monotonic() - started)

    def _report_unprogrammable(self, report: BackendSyncReport) -> None:
        """Reject the Services the backend left out, accept the ones it programs again (unless
        the catalog itself rejects them: its record stands)."""
        now: dict[str, list[str]] = {}
        for name, reason in sorted(report.unprogrammed.items()):
            now.setdefault(name.service, []).append(f"port {name.port or '(unnamed)'}: {reason}")
        catalog_rejected = {key for kind, key in self.catalog.rejected() if kind == "Service"}
        for key in set(self._unprogrammable) - set(now):
            if key not in catalog_rejected:
                self.rejections.accept(kind="Service", key=key)
        details = {key: "the kernel refused its rules (the other Services are programmed): " + "; ".join(reasons)
                   for key, reasons in now.items()}
        for key, detail in details.items():
            if self._unprogrammable.get(key) != detail:
                self.rejections.reject(ObjectRef.of("Service", None, key=key), reason="unprogrammable",
                                       detail=detail)
        self._unprogrammable = details

    def _wake_up_at(self, due: float | None) -> None:
        """Ask for a sync at `due` (monotonic), replacing an earlier wake-up."""
        if self._wake_up is not None:
            self._wake_up.cancel()
            self._wake_up = None
        if due is not None:
            self._wake_up = threading.Timer(max(0.0, due - time.monotonic()) + 0.05, self.runner.request,
                                            args=(SyncKind.PARTIAL,))
            self._wake_up.daemon = True
            self._wake_up.start()

    def _after_sync(self, previous: ProxyState, current: ProxyState, changed: frozenset[ServicePortName]) -> None:
        if self._conntrack is not None and changed:
            flows = stale_flows(previous, current, changed)
            if flows:
                self.metrics.conntrack_deleted.inc(self._conntrack.delete_all(flows))
        if self._healthcheck is not None:
            self._healthcheck.sync(health_check_answers(current))

    def _count_missing_local(self, *, full: bool, changed: frozenset[ServicePortName]) -> None:
        """Which service ports have a Local policy and no endpoint here (kept per port, so a
        partial sync recounts only what changed)."""
        state = self._programmed
        names = state.services.keys() if full else changed
        if full:
            self._missing_local.clear()
        for name in names:
            service = state.services.get(name)
            self._missing_local.pop(name, None)
            if service is None:
                continue
            selection = state.selection(name)
            missing = set()
            if service.internal_policy is TrafficPolicy.LOCAL and not selection.cluster:
                missing.add("internal")
            if service.external_local and not selection.external:
                missing.add("external")
            if missing:
                self._missing_local[name] = frozenset(missing)

    def _observe(self, report: BackendSyncReport, *, full: bool, changed: frozenset[ServicePortName],
                 seconds: float) -> None:
        now = time.time()
        self.metrics.sync.observe(seconds)
        (self.metrics.sync_full if full else self.metrics.sync_partial).observe(seconds)
        self.metrics.last_sync.set(now)
        for trigger in self._trigger_times:
            self.metrics.programming.observe(max(0.0, now - trigger))
        self._trigger_times.clear()
        state = self._programmed
        family, metrics = self.family, self.metrics
        metrics.of_family(family, metrics.rules, report.rules, table="nat")
        metrics.of_family(family, metrics.services, len(state.services))
        metrics.of_family(family, metrics.endpoints, sum(len(endpoints) for endpoints in state.endpoints.values()))
        self._count_missing_local(full=full, changed=changed)
        for policy in ("internal", "external"):
            metrics.of_family(family, metrics.no_local_endpoints,
                              sum(1 for missing in self._missing_local.values() if policy in missing),
                              traffic_policy=policy)
        log.log(logging.INFO if full else logging.DEBUG, "%s%s sync: %d service ports, %d written, %d rules in %.3fs%s",
                "" if family is IpFamily.V4 else f"{family.label} ", report.scope.value, len(state.services),
                report.services_written, report.rules, seconds,
                f" ({report.detail})" if report.detail else "")


def health_check_answers(state: ProxyState) -> dict[int, HealthCheckAnswer]:
    """The health-check node ports a state needs, each with the number of distinct local ready
    endpoints of its service (a service's ports share one health-check port)."""
    owners: dict[int, ServicePortName] = {}
    local: dict[int, set[str]] = {}
    for name, service in state.services.items():
        port = service.health_check_node_port
        if port is None:
            continue
        owners.setdefault(port, name)
        local.setdefault(port, set()).update(
            e.ip for e in state.endpoints_of(name) if e.ready and e.node_name == state.node.name)
    return {port: HealthCheckAnswer(namespace=name.namespace, name=name.name, local_endpoints=len(local[port]))
            for port, name in owners.items()}
