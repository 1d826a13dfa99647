"""`FakeIpvsTable`: the IPVS table in memory (checked like the kernel checks), recording every write."""
from __future__ import annotations

import errno
from dataclasses import dataclass, field, replace

from proxy.ipvs.table import (
    Destination,
    IpvsError,
    IpvsTable,
    RealServer,
    RealServerStatus,
    VirtualServer,
    VirtualServerKey,
    check_real_server,
    check_virtual_server,
)


@dataclass(frozen=True)
class IpvsWrite:
    """One write, as FakeIpvsTable.writes records it."""
    operation: str                      # "add-vs", "update-vs", "delete-vs", "add-rs", "update-rs", "delete-rs"
    key: VirtualServerKey
    destination: Destination | None = None
    detail: str = ""


@dataclass
class _FakeService:
    server: VirtualServer
    reals: dict[Destination, RealServerStatus] = field(default_factory=dict)


class FakeIpvsTable(IpvsTable):
    def __init__(self) -> None:
        self.services: dict[VirtualServerKey, _FakeService] = {}
        self.writes: list[IpvsWrite] = []

    def _service(self, key: VirtualServerKey) -> _FakeService:
        held = self.services.get(key)
        if held is None:
            raise IpvsError(f"{key}: no such virtual server", code=errno.ESRCH)
        return held

    def virtual_servers(self) -> list[VirtualServer]:
        return [held.server for held in self.services.values()]

    def virtual_server(self, key: VirtualServerKey) -> VirtualServer | None:
        held = self.services.get(key)
        return held.server if held else None

    def real_servers(self, key: VirtualServerKey) -> list[RealServerStatus]:
        held = self.services.get(key)
        return list(held.reals.values()) if held else []

    def add_virtual_server(self, server: VirtualServer) -> None:
        check_virtual_server(server)
        if server.key in self.services:
            raise IpvsError(f"{server.key}: virtual server exists", code=errno.EEXIST)
        self.services[server.key] = _FakeService(server)
        self.writes.append(IpvsWrite("add-vs", server.key, detail=_describe(server)))

    def update_virtual_server(self, server: VirtualServer) -> None:
        check_virtual_server(server)
        self._service(server.key).server = server
        self.writes.append(IpvsWrite("update-vs", server.key, detail=_describe(server)))

    def delete_virtual_server(self, key: VirtualServerKey) -> None:
        if self.services.pop(key, None) is not None:
            self.writes.append(IpvsWrite("delete-vs", key))

    def add_real_server(self, key: VirtualServerKey, real: RealServer) -> None:
        check_real_server(key, real)
        held = self._service(key)
        if real.destination in held.reals:
            raise IpvsError(f"{key} -> {real.destination}: real server exists", code=errno.EEXIST)
        held.reals[real.destination] = RealServerStatus(real.destination, real.weight)
        self.writes.append(IpvsWrite("add-rs", key, real.destination, f"weight {real.weight}"))

    def update_real_server(self, key: VirtualServerKey, real: RealServer) -> None:
        check_real_server(key, real)
        held = self._service(key)
        current = held.reals.get(real.destination)
        if current is None:
            raise IpvsError(f"{key} -> {real.destination}: no such real server", code=errno.ENOENT)
        held.reals[real.destination] = replace(current, weight=real.weight)
        self.writes.append(IpvsWrite("update-rs", key, real.destination, f"weight {real.weight}"))

    def delete_real_server(self, key: VirtualServerKey, destination: Destination) -> None:
        held = self.services.get(key)
        if held is not None and held.reals.pop(destination, None) is not None:
            self.writes.append(IpvsWrite("delete-rs", key, destination))

    # -- test hooks: what traffic would do --------------------------------------------------------

    def set_connections(self, key: VirtualServerKey, destination: Destination, *, active: int = 0,
                        inactive: int = 0) -> None:
        held = self._service(key)
        held.reals[destination] = replace(held.reals[destination], active_connections=active,
                                          inactive_connections=inactive)


def _describe(server: VirtualServer) -> str:
    persistence = f" persistent {server.persistence_timeout}s" if server.persistent else ""
    return f"{server.scheduler}{persistence}"
