"""Stale UDP conntrack entries: which to delete when a UDP service's endpoints change, and the deleting.

UDP has no connection to end, so conntrack keeps steering a client's datagrams to the
endpoint it first chose for as long as the client keeps talking (the entry's timeout
restarts with every packet). Two cases break clients, and both are fixed by deleting
entries after the rules changed, as kube-proxy does:

- an endpoint went away: entries whose reply comes from it (`--reply-src`) for the
  service's addresses would keep sending into the void;
- a service that had no endpoints got one: entries created while the service was
  rejecting (no DNAT in them) would keep the client away from the new endpoint.

`stale_flows(previous, current, changed)` is the pure half (unit-tested): the service's
entry points are `ServicePort.entry_points()` (a NodePort is any local address), its
endpoints the states' own selections (`ProxyState.selection`, computed once per sync).
The deleting is a kernel touchpoint, the `Conntrack` interface: `ConntrackCommand` runs the
`conntrack` tool (one `-D` per filter, inside the agent's network namespace through
`exec_prefix`, `-f ipv6` for the IPv6 proxy's, since a filter without an address would
otherwise mean IPv4); `FakeConntrack` (fake_conntrack.py) keeps entries in memory. TCP and SCTP
are left alone: their endpoints end connections themselves, and deleting live entries would
break graceful termination.

Bounded: each filter is one exec, and a hostile (or just large) change multiplies entry
points by gone endpoints. Past `MAX_FLOW_FILTERS` per sync the filters of one entry point
are merged into one without the reply source (all of that service address's UDP entries go:
clients of endpoints that stayed pick again, once), and past that the rest are left to time
out, with a warning.
"""
from __future__ import annotations

import abc
import logging
import re
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass

from netagent.errors import NetagentError
from netagent.kernel.families import IpFamily
from proxy.model import Protocol, ProxyState, ServicePortName

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

    def argv(self, family: IpFamily = IpFamily.V4) -> list[str]:
        argv = ["-D"] + (["-f", "ipv6"] if family is IpFamily.V6 else []) + ["-p", "udp"]
        if self.address is not None:
            argv += ["--orig-dst", self.address]
        argv += ["--orig-port-dst", str(self.port)]
        if self.reply_source is not None:
            argv += ["--reply-src", self.reply_source]
        return argv


def _endpoint_ips(state: ProxyState, name: ServicePortName) -> set[str]:
    if name not in state.services:
        return set()
    return {endpoint.ip for endpoint in state.selection(name).all_selected}


def stale_flows(previous: ProxyState, current: ProxyState, changed: frozenset[ServicePortName]) -> list[FlowFilter]:
    """The entries to delete after `current` replaced `previous` in the kernel."""
    filters: set[FlowFilter] = set()
    for name in changed:
        old, new = previous.services.get(name), current.services.get(name)
        if old is not None and old.protocol is Protocol.UDP:
            gone = _endpoint_ips(previous, name) - _endpoint_ips(current, name)
            for point in old.entry_points():
                filters.update(FlowFilter(port=point.port, address=point.address, reply_source=ip)
                               for ip in sorted(gone))
        if new is not None and new.protocol is Protocol.UDP and _endpoint_ips(current, name):
            if old is None or old.protocol is not Protocol.UDP or not _endpoint_ips(previous, name):
                filters.update(FlowFilter(port=point.port, address=point.address) for point in new.entry_points())
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


class ConntrackError(NetagentError, RuntimeError):
    """The conntrack tool (or its fake) could not delete a filter's entries."""


class Conntrack(abc.ABC):
    """The kernel's connection-tracking table, as far as the proxy touches it: deleting."""

    @abc.abstractmethod
    def delete(self, flow: FlowFilter) -> int:
        """Delete the entries `flow` selects; answer how many went (0 is fine); raise
        ConntrackError (or OSError, SubprocessError) when the deleting failed."""

    def delete_all(self, flows: Sequence[FlowFilter]) -> int:
        """Delete each filter's entries; a failing one is logged and the rest still run."""
        deleted = 0
        for flow in flows:
            try:
                deleted += self.delete(flow)
            except (OSError, subprocess.SubprocessError, ConntrackError) as error:
                log.warning("stale UDP flows not deleted: %s", error)
        return deleted


class ConntrackCommand(Conntrack):
    """Deletes entries with the `conntrack` tool; answers how many went."""

    def __init__(self, *, exec_prefix: Sequence[str] = (), binary: str = "conntrack",
                 family: IpFamily = IpFamily.V4) -> None:
        self._prefix = list(exec_prefix)
        self._binary = binary
        self.family = family

    def delete(self, flow: FlowFilter) -> int:
        argv = flow.argv(self.family)
        completed = subprocess.run([*self._prefix, self._binary, *argv], capture_output=True, text=True, timeout=30)
        found = _DELETED.search(completed.stderr + completed.stdout)
        if found is None:  # the tool failed before counting: no table, bad argument, ...
            raise ConntrackError(f"conntrack {' '.join(argv)}: "
                                 f"{completed.stderr.strip() or completed.returncode}")
        return int(found.group(1))
