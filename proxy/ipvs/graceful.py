"""Graceful endpoint removal: a real server that leaves the plan drains before it is deleted.

Deleting a real server cuts its connections (with expire_nodest_conn their next packet ends
them). So when an endpoint becomes terminating or disappears, its real server first gets
weight 0: the scheduler sends it nothing new, and the connections it has go on. It is deleted
once the kernel counts no connection on it (active + inactive) or when `timeout` seconds have
passed since the drain began, whichever comes first.

UDP real servers are deleted at once: a UDP "connection" is only a timer that every datagram
restarts, so a client that keeps sending would keep a dead endpoint alive until the timeout;
the client must move on to a live endpoint instead.

The drain start times are kept in memory. After a restart a real server found at weight 0 and
not wanted starts its drain when it is first seen, so the timeout is never shorter than asked.
`deadline()` says when the next drain times out; the owner of the sync loop re-runs a sync by
then (proxy/ipvs/proxy.py, `IpvsProxy.reap_drained`).
"""
from __future__ import annotations

from enum import Enum

from proxy.ipvs.table import Destination, RealServerStatus, VirtualServerKey
from proxy.model import Protocol


class Removal(str, Enum):
    DELETE = "delete"     # delete the real server now
    DRAIN = "drain"       # keep it, at weight 0


class GracefulRemovals:
    def __init__(self, *, timeout: float):
        self.timeout = timeout
        self._started: dict[tuple[VirtualServerKey, Destination], float] = {}

    def decide(self, key: VirtualServerKey, real: RealServerStatus, *, now: float) -> Removal:
        """For a real server the plan no longer wants."""
        held = (key, real.destination)
        if key.protocol is Protocol.UDP or real.connections == 0:
            self._started.pop(held, None)
            return Removal.DELETE
        started = self._started.setdefault(held, now)
        if now - started >= self.timeout:
            del self._started[held]
            return Removal.DELETE
        return Removal.DRAIN

    def forget(self, key: VirtualServerKey, destination: Destination | None = None) -> None:
        """The real server is wanted again (or gone with its virtual server: destination None)."""
        if destination is not None:
            self._started.pop((key, destination), None)
            return
        for held in [held for held in self._started if held[0] == key]:
            del self._started[held]

    def draining(self) -> frozenset[VirtualServerKey]:
        return frozenset(key for key, _ in self._started)

    def deadline(self) -> float | None:
        """When the earliest drain times out (on the clock `decide` was given), or None."""
        return min(self._started.values()) + self.timeout if self._started else None

    def clear(self) -> None:
        self._started.clear()
