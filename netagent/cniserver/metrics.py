"""The CNI server's metrics: how long each request took to answer, by command and outcome.

`netagent_cni_request_duration_seconds{command, plugin, result}` is a histogram of each
executed request, from a worker starting it to its reply being ready (the kernel work of an
ADD, and the policy programming an ADD waits for): what an operator's CNI latency alert and
dashboard read. Requests answered without executing (agent not ready, busy, refused caller)
are not in it. Its labels are bounded whatever a local caller sends: `command` one of the
spec's commands or `other`, `plugin` `main` or `ipam` (the wire's two selectors), `result`
`ok` or `error` (any non-zero exit), so no request can add series.
"""
from __future__ import annotations

from cni import wire
from netagent.infra.metrics import Registry, exponential_buckets

COMMANDS = frozenset({"ADD", "DEL", "CHECK", "VERSION", "GC", "STATUS"})
# 0.5 ms .. ~16 s: an ADD takes a few ms, one waiting for its Pod up to --policy-add-wait
BUCKETS = exponential_buckets(0.0005, 2, 16)


class CniMetrics:
    def __init__(self, registry: Registry) -> None:
        self.duration = registry.histogram(
            "netagent_cni_request_duration_seconds",
            "Seconds from a CNI request's start on a worker to its reply, by command, plugin and result.",
            labels=("command", "plugin", "result"), buckets=BUCKETS)

    def observe(self, command: str, plugin: str, *, code: int, seconds: float) -> None:
        """One answered request (`code`: the exit code the shim returns)."""
        self.duration.labels(command=command if command in COMMANDS else "other",
                             plugin="main" if plugin == wire.PLUGIN_MAIN else "ipam",
                             result="ok" if code == 0 else "error").observe(seconds)
