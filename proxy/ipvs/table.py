"""The IPVS table: virtual servers and their real servers, as values and an interface.

IPVS keeps, per network namespace, a table of virtual servers (address, protocol, port, a
scheduler, optional persistence) each with real servers (address, port, weight, and the
kernel's connection counters). The backend only ever needs the eight operations of
`IpvsTable`; `NetlinkIpvsTable` (proxy/ipvs/netlink.py) speaks them over generic netlink with
pyroute2, `FakeIpvsTable` (fake_table.py) keeps the table in memory and refuses what the kernel refuses
(measured on Debian's 6.1 in the VM tier): adding a virtual or real server that exists
(EEXIST), adding or updating a real server of a missing virtual server (ESRCH), updating a missing real
server (ENOENT), an unknown scheduler (ENOENT), a negative weight. Deleting what is already
gone is quiet in both, because the backend's deletes are idempotent by design.

Real servers are always in NAT ("masquerading") forwarding mode: the backend balances to pod
addresses behind the node, never direct-routing or tunnelling. Persistence (ClientIP session
affinity) is the kernel's persistent flag with a timeout and a host netmask (/32, /128): one
client address sticks to one real server for the timeout after its last connection.

Both families live in one table (the kernel keys a virtual server by family too): a key's
family is its address's (`VirtualServerKey.family`), a real server must be of its virtual
server's family (the backend balances in NAT mode within one family; the fake refuses a mix
with EAFNOSUPPORT as the kernel does), and each family's backend lists the table and keeps
to its own family's virtual servers.

`FakeIpvsTable.writes` records every write, so tests can say "a restart adopts with zero
writes"; `set_connections` stands in for traffic so graceful removal can be tested.
"""
from __future__ import annotations

import abc
import errno
import ipaddress
from dataclasses import dataclass
from enum import Enum

from netagent.kernel.families import IpFamily
from proxy.model import Protocol
from netagent.errors import NetagentError

IP_PROTOCOL_NUMBERS = {Protocol.TCP: 6, Protocol.UDP: 17, Protocol.SCTP: 132}
PROTOCOL_BY_NUMBER = {number: protocol for protocol, number in IP_PROTOCOL_NUMBERS.items()}
MAX_WEIGHT = 65535


class Scheduler(str, Enum):
    """IPVS schedulers the backend may ask for (`--ipvs-scheduler` in kube-proxy terms)."""
    ROUND_ROBIN = "rr"
    WEIGHTED_ROUND_ROBIN = "wrr"
    LEAST_CONNECTION = "lc"
    WEIGHTED_LEAST_CONNECTION = "wlc"
    SOURCE_HASHING = "sh"
    DESTINATION_HASHING = "dh"
    SHORTEST_EXPECTED_DELAY = "sed"
    NEVER_QUEUE = "nq"
    MAGLEV = "mh"


class IpvsError(NetagentError, RuntimeError):
    """An IPVS operation the kernel (or the fake) refused; `code` is the errno."""

    def __init__(self, message: str, *, code: int | None = None):
        super().__init__(message)
        self.code = code


class IpvsUnavailable(IpvsError):
    """The kernel has no IPVS (module not loaded or not built)."""


@dataclass(frozen=True, order=True)
class VirtualServerKey:
    address: str
    protocol: Protocol
    port: int

    def __str__(self) -> str:
        return f"{_bracketed(self.address)}:{self.port}/{self.protocol.value}"

    @property
    def family(self) -> IpFamily:
        return IpFamily.of(self.address)


@dataclass(frozen=True, order=True)
class Destination:
    """A real server's identity within its virtual server."""
    address: str
    port: int

    def __str__(self) -> str:
        return f"{_bracketed(self.address)}:{self.port}"


@dataclass(frozen=True)
class VirtualServer:
    key: VirtualServerKey
    scheduler: str = Scheduler.ROUND_ROBIN.value
    persistence_timeout: int = 0      # seconds; 0: no persistence

    @property
    def persistent(self) -> bool:
        return self.persistence_timeout > 0


@dataclass(frozen=True)
class RealServer:
    destination: Destination
    weight: int = 1


@dataclass(frozen=True)
class RealServerStatus:
    """A real server as the kernel reports it, with its connection counters."""
    destination: Destination
    weight: int
    active_connections: int = 0
    inactive_connections: int = 0

    @property
    def connections(self) -> int:
        return self.active_connections + self.inactive_connections


class IpvsTable(abc.ABC):
    """The IPVS table of one network namespace (address/port services of both families)."""

    @abc.abstractmethod
    def virtual_servers(self) -> list[VirtualServer]:
        """Every address/port virtual server, IPv4 and IPv6 (fwmark services are not listed)."""

    @abc.abstractmethod
    def virtual_server(self, key: VirtualServerKey) -> VirtualServer | None:
        """One virtual server, or None."""

    @abc.abstractmethod
    def real_servers(self, key: VirtualServerKey) -> list[RealServerStatus]:
        """The real servers of a virtual server (none when it does not exist: the kernel's dump
        answers a missing virtual server with nothing)."""

    @abc.abstractmethod
    def add_virtual_server(self, server: VirtualServer) -> None: ...

    @abc.abstractmethod
    def update_virtual_server(self, server: VirtualServer) -> None:
        """Change scheduler and persistence of an existing virtual server (keeps its real servers)."""

    @abc.abstractmethod
    def delete_virtual_server(self, key: VirtualServerKey) -> None:
        """Remove it with its real servers; quiet when already gone."""

    @abc.abstractmethod
    def add_real_server(self, key: VirtualServerKey, real: RealServer) -> None: ...

    @abc.abstractmethod
    def update_real_server(self, key: VirtualServerKey, real: RealServer) -> None:
        """Change the weight of an existing real server."""

    @abc.abstractmethod
    def delete_real_server(self, key: VirtualServerKey, destination: Destination) -> None:
        """Remove a real server; quiet when it (or its virtual server) is already gone."""


def check_virtual_server(server: VirtualServer) -> None:
    """What the kernel checks on add/update, raised as the kernel's errno."""
    _check_address(server.key.address)
    if not 0 <= server.key.port <= 65535:
        raise IpvsError(f"{server.key}: port out of range", code=errno.EINVAL)
    if server.scheduler not in {s.value for s in Scheduler}:
        raise IpvsError(f"{server.key}: scheduler {server.scheduler!r} is not loaded", code=errno.ENOENT)
    if server.persistence_timeout < 0:
        raise IpvsError(f"{server.key}: negative persistence timeout", code=errno.EINVAL)


def check_real_server(key: VirtualServerKey, real: RealServer) -> None:
    _check_address(real.destination.address)
    if IpFamily.of(real.destination.address) is not IpFamily.of(key.address):
        raise IpvsError(f"{key} -> {real.destination}: a real server of another family", code=errno.EAFNOSUPPORT)
    if not 0 <= real.weight <= MAX_WEIGHT:
        raise IpvsError(f"{key} -> {real.destination}: weight {real.weight} out of range", code=errno.ERANGE)
    if not 0 < real.destination.port <= 65535:
        raise IpvsError(f"{key} -> {real.destination}: port out of range", code=errno.EINVAL)


def _check_address(address: str) -> None:
    try:
        parsed = ipaddress.ip_address(address)
    except ValueError:
        raise IpvsError(f"{address!r} is not an IP address", code=errno.EINVAL) from None
    if str(parsed) != address:
        raise IpvsError(f"{address!r} is not in canonical form ({parsed})", code=errno.EINVAL)


def _bracketed(address: str) -> str:
    return f"[{address}]" if IpFamily.V6.holds(address) else address



