"""Where the daemon reports refused objects: Warning Events on them and /healthz's details.

`infra/rejections.py` keeps the records; the components (node agent, proxy, policy engine)
each reject through their own scope of one process-wide `Rejections`. This module connects
that record to the cluster and to the status server, and nothing else:

- `build_rejections` makes the process's `Rejections`, registered in the metrics registry,
  whose notify posts a Warning Event (reason `NetagentRejected`) on the refused object
  through `kube/events.py`'s bounded poster;
- `with_rejections` adds the current rejections to a health report's details (every
  component's in the agent's health, the proxy's own in the proxy's). A refused object does
  not make the node unhealthy (the others are programmed); it is listed so an operator sees
  which object is not served and why. The details are served on loopback only (/healthz on
  the metrics address, 127.0.0.1:10249); 10258 and the proxy's 10256, which every pod and
  load balancer reaches, say healthy or not (`infra/status_server.py`).
"""
from __future__ import annotations

from netagent.infra.metrics import Registry
from netagent.infra.rejections import Rejection, Rejections, RejectionScope
from netagent.infra.status_server import HealthFunction, HealthReport
from netagent.kube.events import EventPoster

EVENT_REASON = "NetagentRejected"
MAX_LISTED = 50


def build_rejections(registry: Registry, *, api_client, node_name: str) -> tuple[Rejections, EventPoster]:
    poster = EventPoster(api_client, component="netagent", host=node_name)

    def notify(rejection: Rejection) -> None:
        poster.post(rejection.ref, reason=EVENT_REASON,
                    message=f"{rejection.component}: {rejection.reason}: {rejection.detail}")
    return Rejections(registry, notify=notify), poster


def with_rejections(base: HealthFunction, rejections: Rejections | RejectionScope) -> HealthFunction:
    """`base` with the current rejections (the process's, or one component's) in its details."""
    def health() -> HealthReport:
        report = base()
        records = rejections.snapshot()
        if not records:
            return report
        listed = [r.describe() for r in records[:MAX_LISTED]]
        if len(records) > MAX_LISTED:
            listed.append(f"... and {len(records) - MAX_LISTED} more")
        return HealthReport(report.healthy, report.reason, {**report.details, "rejected_objects": listed})
    return health
