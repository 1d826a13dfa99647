"""The node agent's Prometheus metrics: what an operator asks when routes look wrong.

    netagent_node_sync_duration_seconds{kind}     histogram of route syncs (partial, full)
    netagent_node_sync_errors_total               syncs that raised (a full resync follows)
    netagent_node_peers{mode}                     peers programmed, by how they are reached
    netagent_node_peers_refused                   Nodes we will not route to (unreadable, outside the cluster
                                                  CIDR, in conflict, host-gw across subnets; by reason in
                                                  netagent_rejected_objects{kind="Node"})
    netagent_node_peers_pending                   Nodes not announced yet (no public IP, VTEP MAC or CIDR)
    netagent_node_route_changes_total{op}         routes/neighbours/FDB entries added or removed
    netagent_kube_watch_events{resource,type}, netagent_kube_relists{resource},
    netagent_kube_watch_errors{resource}    read at scrape time from the reflectors

The reflector keeps its own counters; this module only exposes them, read at scrape time
(so they are gauges by type and carry no `_total`), and the watch path does no metrics work.
"""
from __future__ import annotations

from netagent.infra.metrics import Registry


class NodeAgentMetrics:
    def __init__(self, registry: Registry) -> None:
        self.registry = registry
        self.sync_duration = registry.histogram("netagent_node_sync_duration_seconds",
                                                "Duration of node route syncs.", labels=("kind",))
        self.sync_errors = registry.counter("netagent_node_sync_errors_total",
                                            "Node route syncs that failed.")
        self.peers = registry.gauge("netagent_node_peers", "Peers programmed, by mode.", labels=("mode",))
        self.refused = registry.gauge("netagent_node_peers_refused", "Peers refused (reasons: netagent_rejected_objects).")
        self.pending = registry.gauge("netagent_node_peers_pending", "Nodes not announced yet.")
        self.changes = registry.counter("netagent_node_route_changes_total",
                                        "Kernel objects added or removed by syncs.", labels=("op",))
        self._reflectors: dict = {}
        self.registry.callback_gauge("netagent_kube_watch_events",
                                     "Watch events received, by resource and type.",
                                     self._read_events, labels=("resource", "type"))
        self.registry.callback_gauge("netagent_kube_relists",
                                     "Full relists (start, 410 Gone, reconnect).",
                                     lambda: self._read_stat("relists"), labels=("resource",))
        self.registry.callback_gauge("netagent_kube_watch_errors",
                                     "Watch or list failures (each retried with backoff).",
                                     lambda: self._read_stat("errors"), labels=("resource",))

    def watch_reflector(self, reflector) -> None:
        self._reflectors[reflector.resource.plural] = reflector

    def _read_events(self) -> dict:
        out = {}
        for resource, reflector in self._reflectors.items():
            for event_type, count in reflector.stats.events_by_type().items():
                out[(resource, event_type)] = count
        return out

    def _read_stat(self, name: str) -> dict:
        return {(resource, ): getattr(reflector.stats, name) for resource, reflector in self._reflectors.items()}

    def record_sync(self, kind: str, seconds: float, report) -> None:
        self.sync_duration.labels(kind=kind).observe(seconds)
        self.changes.labels(op="add").inc(report.added)
        self.changes.labels(op="remove").inc(report.removed)
        if kind == "full":
            self.peers.clear()
        for mode, count in report.peers_by_mode.items():
            self.peers.labels(mode=mode).set(count)
        self.refused.set(len(report.refused))
        self.pending.set(len(report.pending))
