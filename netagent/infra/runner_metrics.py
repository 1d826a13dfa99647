"""Every sync runner's state as metrics, one series per runner (`runner` label: `node-routes`,
`proxy`, `proxy-ipv6`, `network-policy`, `cni-deferred-delete`, ...): when it last succeeded (wall
clock, as kube-proxy's `kubeproxy_sync_proxy_rules_last_timestamp_seconds`), how many syncs
failed in all and in a row. /healthz says unhealthy; these say since when and how often, for
every loop that writes the kernel, so an alert on staleness or failures needs no knowledge
of each component. Read from `SyncRunner.status()` at scrape time; runners that have not
started yet, or are gone, simply have no series.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable

from netagent.infra.metrics import Registry
from netagent.infra.sync_runner import SyncRunner


def register_runner_metrics(registry: Registry, runners: Callable[[], Iterable[SyncRunner]]) -> None:
    """`runners()`: the process's runners at scrape time."""
    def per_runner(read: Callable) -> Callable[[], dict[tuple[str, ...], float]]:
        def reading() -> dict[tuple[str, ...], float]:
            values: dict[tuple[str, ...], float] = {}
            for runner in runners():
                value = read(runner.status())
                if value is not None:
                    values[(runner.name,)] = float(value)
            return values
        return reading

    registry.callback_gauge("netagent_sync_last_success_timestamp_seconds",
                            "Unix time of the runner's last successful sync.",
                            per_runner(lambda stats: stats.last_success_wall), labels=("runner",))
    registry.callback_counter("netagent_sync_failures_total", "Syncs of the runner that failed.",
                              per_runner(lambda stats: stats.failures), labels=("runner",))
    registry.callback_gauge("netagent_sync_consecutive_failures",
                            "Syncs of the runner that failed since its last success.",
                            per_runner(lambda stats: stats.consecutive_failures), labels=("runner",))
