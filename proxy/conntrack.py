"""Stale UDP conntrack entries: which to delete when a UDP service's endpoints change, and the deleting.

UDP has no connection to end, so conntrack keeps steering a client's datagrams to the
endpoint it first chose for as long as the client keeps talking (the entry's timeout
restarts with every packet). Two cases break clients, and both are fixed by deleting
entries after the rules changed, as kube-proxy does:

- an endpoint went away: entries whose reply comes from it (`--reply-src`) for the
  service's addresses would keep sending into the void;
- a service that had no endpoints got one: entries created while the service was
  rejecting (no DNAT in them) would keep the client away from the new endpoint.

`stale_flows(previous, current, changed)` is the pure half (unit-tested);
`ConntrackCommand` runs the `conntrack` tool (one `-D` per filter, inside the agent's
network namespace through `exec_prefix`). TCP and SCTP are left alone: their endpoints end
connections themselves, and deleting live entries would break graceful termination.

Bounded: each filter is one exec, and a hostile (or just large) change multiplies entry
points by gone endpoints. Past `MAX_FLOW_FILTERS` per sync the filters of one entry point
are merged into one without the reply source (all of that service address's UDP entries go:
clients of endpoints that stayed pick again, once), and past that the rest are left to time
out, with a warning.
"""
from __future__ import annotations

import logging
import re
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass

from proxy.model import Protocol, ProxyState, ServicePort, ServicePortName
from proxy.selection import select_endpoints

log = logging.getLogger("netagent.proxy.conntrack")

_DELETED = re.compile(r"(\d+) flow entries have been deleted")
MAX_FLOW_FILTERS = 256   # conntrack execs per sync


@dataclass(frozen=True, order=True)
class FlowFilter:
    """Conntrack entries of one UDP service address: by original destination (address, or any
    local address for a NodePort when `address` is None) and port, optionally by reply source."""

    port: int
    address: str | None = None
    reply_source: str | None = None

    def argv(self) -> list[str]:
        argv = ["-D", "-p", "udp"]
        if self.address is not None:
            argv += ["--orig-dst", self.address]
        argv += ["--orig-port-dst", str(self.port)]
        if self.reply_source is not None:
            argv += ["--reply-src", self.reply_source]
        return argv


def _entry_points(service: ServicePort) -> list[tuple[str | None, int]]:
    points: list[tuple[str | None, int]] = [(service.cluster_ip, service.port)]
    points += [(address, service.port) for address in (*service.external_ips, *service.load_balancer_ips)]
    if service.node_port:
        points.append((None, service.node_port))
    return points


def _endpoint_ips(state: ProxyState, name: ServicePortName) -> set[str]:
    service = state.services.get(name)
    if service is None:
        return set()
    selection = select_endpoints(service, state.endpoints_of(name), state.node)
    return {endpoint.ip for endpoint in selection.all_selected}


def stale_flows(previous: ProxyState, current: ProxyState, changed: frozenset[ServicePortName]) -> list[FlowFilter]:
    """The entries to delete after `current` replaced `previous` in the kernel."""
    filters: set[FlowFilter] = set()
    for name in changed:
        old, new = previous.services.get(name), current.services.get(name)
        if old is not None and old.protocol is Protocol.UDP:
            gone = _endpoint_ips(previous, name) - _endpoint_ips(current, name)
            for address, port in _entry_points(old):
                filters.update(FlowFilter(port=port, address=address, reply_source=ip) for ip in sorted(gone))
        if new is not None and new.protocol is Protocol.UDP and _endpoint_ips(current, name):
            if old is None or old.protocol is not Protocol.UDP or not _endpoint_ips(previous, name):
                filters.update(FlowFilter(port=port, address=address) for address, port in _entry_points(new))
    return bounded(sorted(filters, key=_order))


def _order(flow: FlowFilter) -> tuple[int, str, str]:
    return flow.port, flow.address or "", flow.reply_source or ""


def bounded(filters: list[FlowFilter], *, limit: int = MAX_FLOW_FILTERS) -> list[FlowFilter]:
    """At most `limit` filters (see the module docstring): merged per entry point, then cut."""
    if len(filters) <= limit:
        return filters
    merged = sorted({FlowFilter(port=flow.port, address=flow.address) for flow in filters}, key=_order)
    if len(merged) > limit:
        log.warning("%d service addresses lost UDP endpoints at once: stale flows of %d of them are left to time "
                    "out", len(merged), len(merged) - limit)
        merged = merged[:limit]
    return merged


class ConntrackCommand:
    """Deletes entries with the `conntrack` tool; answers how many went."""

    def __init__(self, *, exec_prefix: Sequence[str] = (), binary: str = "conntrack") -> None:
        self._prefix = list(exec_prefix)
        self._binary = binary

    def delete(self, flow: FlowFilter) -> int:
        completed = subprocess.run([*self._prefix, self._binary, *flow.argv()], capture_output=True, text=True,
                                   timeout=30)
        found = _DELETED.search(completed.stderr + completed.stdout)
        if found is None:  # the tool failed before counting: no table, bad argument, ...
            raise RuntimeError(f"conntrack {' '.join(flow.argv())}: {completed.stderr.strip() or completed.returncode}")
        return int(found.group(1))

    def delete_all(self, flows: Sequence[FlowFilter]) -> int:
        """Delete each filter's entries; a failing one is logged and the rest still run."""
        deleted = 0
        for flow in flows:
            try:
                deleted += self.delete(flow)
            except (OSError, subprocess.SubprocessError, RuntimeError) as error:
                log.warning("stale UDP flows not deleted: %s", error)
        return deleted
