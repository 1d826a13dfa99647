"""The routes BIRD learnt, read from our kernel table (`owned.BGP_ROUTE_TABLE`), and their changes.

`LearntRoutes` is the seam: `dump()` (destination -> `Route`, unicast routes with one next hop;
multipath and unreachable entries are skipped), `ensure_blackholes(cidrs)` (this node's pod CIDRs
as blackhole routes in main, protocol 78, at `owned.BGP_BLACKHOLE_METRIC`, so an address of ours
no pod holds is dropped instead of following the default route, while the bridge's connected
route and routed pods' /32s still win) and `watch(callback)`, which calls `callback` from
a thread of its own each time the kernel reports a route change in that table, so the agent's
runner copies routes as BIRD writes them (event-driven, not polled). `NetlinkLearntRoutes` is the
real one (pyroute2, in the network namespace of the thread that made it: pyroute2 0.9 opens
its sockets in the calling thread's namespace, so every call enters that namespace first, as
`routing/kernel.py`'s `NetlinkKernel` does); `FakeLearntRoutes` in `fake_learnt.py`.
"""
from __future__ import annotations

import abc
import os
import socket
import threading
from ipaddress import IPv4Address, IPv4Network
from typing import Callable

from netagent.kernel.families import IpFamily
from netagent.kernel import namespaces, owned
from netagent.noderoutes.routing.model import Route

RTN_UNICAST = 1
RTN_BLACKHOLE = 6
MAIN_TABLE = 254
RTMGRP_IPV4_ROUTE = 0x40


class LearntRoutes(abc.ABC):
    @abc.abstractmethod
    def dump(self) -> dict:
        """Destination -> Route: what our table holds now."""

    @abc.abstractmethod
    def watch(self, callback: Callable[[], None]) -> None:
        """Call `callback` after each change to our table, until `close()`."""

    @abc.abstractmethod
    def ensure_blackholes(self, cidrs: tuple) -> None:
        """Exactly these IPv4 networks as our blackholes in main (idempotent; others of ours removed)."""

    def gateways(self) -> tuple:
        """The IPv4 next hops of main's routes that are not ours (protocol 78), sorted."""
        return ()

    @abc.abstractmethod
    def flush(self) -> list[str]:
        """Delete every route in our table and our blackholes (`netagent cleanup`); a line per route."""

    def close(self) -> None:
        """Stop watching."""


class NetlinkLearntRoutes(LearntRoutes):
    def __init__(self, *, table: int = owned.BGP_ROUTE_TABLE) -> None:
        from pyroute2 import IPRoute
        self.table = table
        self._netns_fd = os.open(namespaces.THREAD_NETNS, os.O_RDONLY | os.O_CLOEXEC)
        self._netns_identity = namespaces.identity(self._netns_fd)
        self._ipr = IPRoute()
        self._monitor = None
        self._closed = threading.Event()

    def _table_of(self, msg) -> int:
        return msg.get_attr("RTA_TABLE") or msg["table"]

    def _is_ours(self, msg) -> bool:
        """A route message about our table (anything else on the socket is not)."""
        try:
            return msg.get("event") in ("RTM_NEWROUTE", "RTM_DELROUTE") and self._table_of(msg) == self.table
        except (KeyError, TypeError, AttributeError):
            return False

    @namespaces.in_own_netns
    def dump(self) -> dict:
        names = {link["index"]: link.get_attr("IFLA_IFNAME") for link in self._ipr.get_links()}
        found = {}
        for msg in self._ipr.route("dump", family=socket.AF_INET, table=self.table):
            if self._table_of(msg) != self.table or msg["type"] != RTN_UNICAST:
                continue
            gateway, oif = msg.get_attr("RTA_GATEWAY"), msg.get_attr("RTA_OIF")
            if not gateway or oif not in names:
                continue
            dst = IPv4Network(f"{msg.get_attr('RTA_DST') or '0.0.0.0'}/{msg['dst_len']}")
            found[dst] = Route(dst=dst, gateway=IPv4Address(gateway), ifname=names[oif])
        return found

    @namespaces.in_own_netns
    def gateways(self) -> tuple:
        found = set()
        for msg in self._ipr.route("dump", family=socket.AF_INET, table=MAIN_TABLE):
            if self._table_of(msg) != MAIN_TABLE or msg["proto"] == owned.ROUTE_PROTOCOL:
                continue
            gateway = msg.get_attr("RTA_GATEWAY")
            if gateway:
                found.add(IPv4Address(gateway))
        return tuple(sorted(found))

    def _blackholes(self) -> dict:
        found = {}
        for msg in self._ipr.route("dump", family=socket.AF_INET, table=MAIN_TABLE, proto=owned.ROUTE_PROTOCOL):
            if self._table_of(msg) == MAIN_TABLE and msg["type"] == RTN_BLACKHOLE and \
                    msg["proto"] == owned.ROUTE_PROTOCOL:
                found[IPv4Network(f"{msg.get_attr('RTA_DST') or '0.0.0.0'}/{msg['dst_len']}")] = \
                    msg.get_attr("RTA_PRIORITY") or 0
        return found

    @namespaces.in_own_netns
    def ensure_blackholes(self, cidrs: tuple) -> None:
        wanted = {c for c in cidrs if IpFamily.V4.holds(c)}
        have = self._blackholes()
        for cidr, metric in have.items():
            if cidr not in wanted or metric != owned.BGP_BLACKHOLE_METRIC:
                self._ipr.route("del", dst=str(cidr), table=MAIN_TABLE, type=RTN_BLACKHOLE,
                                proto=owned.ROUTE_PROTOCOL, priority=metric)
        for cidr in sorted(wanted - {c for c, m in have.items() if m == owned.BGP_BLACKHOLE_METRIC}, key=str):
            self._ipr.route("replace", dst=str(cidr), table=MAIN_TABLE, type=RTN_BLACKHOLE,
                            proto=owned.ROUTE_PROTOCOL, priority=owned.BGP_BLACKHOLE_METRIC)

    @namespaces.in_own_netns
    def flush(self) -> list[str]:
        removed = []
        for cidr, metric in self._blackholes().items():
            self._ipr.route("del", dst=str(cidr), table=MAIN_TABLE, type=RTN_BLACKHOLE,
                            proto=owned.ROUTE_PROTOCOL, priority=metric)
            removed.append(f"blackhole {cidr}")
        for msg in self._ipr.route("dump", family=socket.AF_INET, table=self.table):
            if self._table_of(msg) != self.table:
                continue
            dst = f"{msg.get_attr('RTA_DST') or '0.0.0.0'}/{msg['dst_len']}"
            self._ipr.route("del", dst=dst, table=self.table, proto=msg["proto"], type=msg["type"])
            removed.append(f"route {dst} table {self.table}")
        return removed

    def watch(self, callback: Callable[[], None]) -> None:
        """The monitor socket is made, bound and read on its own thread (pyroute2 sockets answer
        only on the thread that made them); returns once it is bound, so no change is missed."""
        from pyroute2 import IPRoute
        bound = threading.Event()
        failure: list[BaseException] = []

        def loop() -> None:
            try:
                with namespaces.entered(self._netns_fd):
                    monitor = self._monitor = IPRoute()
                monitor.bind(groups=RTMGRP_IPV4_ROUTE)
            except BaseException as err:  # handed to watch()'s caller
                failure.append(err)
                return
            finally:
                bound.set()
            while not self._closed.is_set():
                try:
                    messages = monitor.get()
                except Exception:  # closed under us
                    return
                if any(self._is_ours(msg) for msg in messages):
                    callback()

        threading.Thread(target=loop, name="bgp-learnt-routes", daemon=True).start()
        bound.wait()
        if failure:
            raise failure[0]

    def close(self) -> None:
        self._closed.set()
        if self._monitor is not None:
            self._monitor.close()
        self._ipr.close()
        os.close(self._netns_fd)
