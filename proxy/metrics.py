"""The service proxy's Prometheus metrics, under kube-proxy's names where the meaning is the same.

Dashboards and alerts written for kube-proxy keep working:

    kubeproxy_sync_proxy_rules_duration_seconds                   histogram, every sync
    kubeproxy_sync_full_proxy_rules_duration_seconds              histogram, full syncs
    kubeproxy_sync_partial_proxy_rules_duration_seconds           histogram, partial syncs
    kubeproxy_sync_proxy_rules_last_timestamp_seconds             gauge, last successful sync (epoch)
    kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds      gauge, last change queued (epoch)
    kubeproxy_network_programming_duration_seconds                histogram, EndpointSlice trigger time -> programmed
    kubeproxy_sync_proxy_rules_endpoint_changes_pending / _total  EndpointSlice changes waiting / seen
    kubeproxy_sync_proxy_rules_service_changes_pending / _total   Service changes waiting / seen
    kubeproxy_sync_proxy_rules_iptables_total{table}              rules programmed (iptables mode: nat)
    kubeproxy_sync_proxy_rules_iptables_restore_failures_total    failed syncs (any backend: the restore, IPVS writes)
    kubeproxy_sync_proxy_rules_iptables_partial_restore_failures_total   failed partial syncs
    kubeproxy_sync_proxy_rules_no_local_endpoints_total{traffic_policy}  Local-policy services with none here

and netagent's own: `netagent_proxy_services` (service ports programmed),
`netagent_proxy_endpoints` (endpoints programmed), `netagent_proxy_conntrack_deleted_total`,
and for a backend with fixed-size kernel tables (eBPF: the pinned maps; kube-proxy has no
such names) `netagent_proxy_bpf_map_entries{map}` and `netagent_proxy_bpf_map_max_entries{map}`,
read from the kernel at scrape time (one batch lookup per 8k entries), so they show what the
programs see, LRU tables included. The sync histograms above are the same for every backend.
The programming-duration buckets are kube-proxy's (0.25 s to about 4.5 h), the sync ones
netagent's shared sync buckets.

A dual-stack node's two proxies (one per IP family, as kube-proxy's proxiers) share one
`ProxyMetrics`: counters and histograms take both families' observations, as kube-proxy's
global metrics do, and the gauges that count (services, endpoints, rules, pending changes,
Local services without endpoints) are set through `of_family`, so they show the sum of both
families rather than whichever synced last. No label is added: IPv4-only scrapes are unchanged.
"""
from __future__ import annotations

import threading
from collections.abc import Callable, Mapping

from netagent.infra.metrics import Gauge, Registry, exponential_buckets
from netagent.kernel.families import IpFamily

PROGRAMMING_BUCKETS = (0.25, 0.5, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 15, 20, 25, 30, 45, 60, 120, 180, 240, 300,
                       *exponential_buckets(360, 2, 6))


class ProxyMetrics:
    def __init__(self, registry: Registry, *,
                 table_fill: Callable[[], Mapping[str, tuple[int, int]]] | None = None) -> None:
        self.registry = registry
        self._lock = threading.Lock()
        self._per_family: dict[tuple[str, tuple[tuple[str, str], ...]], dict[IpFamily, float]] = {}
        self.sync = registry.histogram("kubeproxy_sync_proxy_rules_duration_seconds",
                                       "SyncProxyRules latency in seconds")
        self.sync_full = registry.histogram("kubeproxy_sync_full_proxy_rules_duration_seconds",
                                            "SyncProxyRules latency in seconds for full resyncs")
        self.sync_partial = registry.histogram("kubeproxy_sync_partial_proxy_rules_duration_seconds",
                                               "SyncProxyRules latency in seconds for partial resyncs")
        self.last_sync = registry.gauge("kubeproxy_sync_proxy_rules_last_timestamp_seconds",
                                        "The last time proxy rules were successfully synced")
        self.last_queued = registry.gauge("kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds",
                                          "The last time a sync of proxy rules was queued")
        self.programming = registry.histogram("kubeproxy_network_programming_duration_seconds",
                                              "In Cluster Network Programming Latency in seconds",
                                              buckets=PROGRAMMING_BUCKETS)
        self.endpoint_changes_pending = registry.gauge("kubeproxy_sync_proxy_rules_endpoint_changes_pending",
                                                       "Pending proxy rules Endpoint changes")
        self.endpoint_changes = registry.counter("kubeproxy_sync_proxy_rules_endpoint_changes_total",
                                                 "Cumulative proxy rules Endpoint changes")
        self.service_changes_pending = registry.gauge("kubeproxy_sync_proxy_rules_service_changes_pending",
                                                      "Pending proxy rules Service changes")
        self.service_changes = registry.counter("kubeproxy_sync_proxy_rules_service_changes_total",
                                                "Cumulative proxy rules Service changes")
        self.rules = registry.gauge("kubeproxy_sync_proxy_rules_iptables_total",
                                    "Total number of iptables rules owned by the proxy", labels=("table",))
        self.failures = registry.counter("kubeproxy_sync_proxy_rules_iptables_restore_failures_total",
                                         "Cumulative proxy rules restore failures")
        self.partial_failures = registry.counter(
            "kubeproxy_sync_proxy_rules_iptables_partial_restore_failures_total",
            "Cumulative proxy rules partial restore failures")
        self.no_local_endpoints = registry.gauge("kubeproxy_sync_proxy_rules_no_local_endpoints_total",
                                                 "Number of services with a Local traffic policy and no endpoints",
                                                 labels=("traffic_policy",))
        self.services = registry.gauge("netagent_proxy_services", "Service ports programmed.")
        self.endpoints = registry.gauge("netagent_proxy_endpoints", "Endpoints programmed (all service ports).")
        self.conntrack_deleted = registry.counter("netagent_proxy_conntrack_deleted_total",
                                                  "Stale UDP conntrack entries deleted.")
        if table_fill is not None:
            self._register_table_fill(table_fill)

    def of_family(self, family: IpFamily, gauge: Gauge, value: float, **labels: str) -> None:
        """Set `family`'s part of a counting gauge; the gauge shows the sum over the families."""
        key = (gauge.name, tuple(sorted(labels.items())))
        with self._lock:
            parts = self._per_family.setdefault(key, {})
            parts[family] = value
            total = sum(parts.values())
        (gauge.labels(**labels) if labels else gauge).set(total)

    def _register_table_fill(self, table_fill: Callable[[], Mapping[str, tuple[int, int]]]) -> None:
        capacity: dict[tuple[str, ...], float] = {(name,): size for name, (_, size) in table_fill().items()}
        if not capacity:
            return
        self.registry.callback_gauge("netagent_proxy_bpf_map_entries", "Entries in each BPF map of the proxy.",
                                     lambda: {(name,): entries for name, (entries, _) in table_fill().items()},
                                     labels=("map",))
        self.registry.callback_gauge("netagent_proxy_bpf_map_max_entries",
                                     "Capacity (max_entries) of each BPF map of the proxy.",
                                     lambda: capacity, labels=("map",))
