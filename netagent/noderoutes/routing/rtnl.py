"""The per-peer hot path's rtnetlink requests, packed here, and the address-change listener.

A Node change becomes at most three writes (neighbour, FDB entry, route) and the agent waits
for each one's acknowledgement before the next, so a failure skips the rest of that peer
(`routes.py`). Through pyroute2 each such request cost about 1.7 ms of CPU (its message
classes, its per-thread socket bookkeeping), more than the rest of a partial sync together;
packed with `struct` on one plain netlink socket it costs tens of microseconds. Only these
fixed shapes live here: dumps, links, `encap ip6` routes and everything else stay with
pyroute2 in `kernel.py`, which owns the seam and its error wording.

`AddressEvents` is a socket subscribed to the kernel's link and address notifications: the
agent re-reads this node's own networks (`own_networks`, a dump of every link and address
through pyroute2, about 20 ms of CPU) on a partial sync only when the kernel said something
changed since the last look, instead of on every sync. An overflowed socket (ENOBUFS) counts
as a change.

Both sockets belong to the network namespace of the thread that opens them, for good: the
kernel binds a socket to its creator's namespace.
"""
from __future__ import annotations

import errno
import os
import socket
import struct
from ipaddress import IPv4Address, IPv6Address

from netagent.kernel.errors import KernelError

NETLINK_ROUTE = 0
NLMSG_ERROR = 2
NLM_F_REQUEST, NLM_F_ACK, NLM_F_REPLACE, NLM_F_CREATE = 0x1, 0x4, 0x100, 0x400
RTM_NEWROUTE, RTM_DELROUTE, RTM_NEWNEIGH, RTM_DELNEIGH = 24, 25, 28, 29
RTA_DST, RTA_OIF, RTA_GATEWAY, RTA_TABLE = 1, 4, 5, 15
NDA_DST, NDA_LLADDR = 1, 2
RTN_UNICAST = 1
RT_SCOPE_UNIVERSE, RT_SCOPE_NOWHERE = 0, 255
NUD_NOARP, NUD_PERMANENT = 0x40, 0x80
NTF_SELF = 0x02
AF_BRIDGE = 7
# rtnetlink multicast groups (the legacy bit masks bind() takes)
RTMGRP_LINK, RTMGRP_IPV4_IFADDR, RTMGRP_IPV6_IFADDR = 0x1, 0x10, 0x100
_HEADER = struct.Struct("=IHHII")
_RTMSG = struct.Struct("=BBBBBBBBI")
_NDMSG = struct.Struct("=BBHiHBB")
_REPLACE = NLM_F_CREATE | NLM_F_REPLACE
_TABLE_BYTES = struct.Struct("=I")


def _attr(kind: int, payload: bytes) -> bytes:
    length = 4 + len(payload)
    return struct.pack("=HH", length, kind) + payload + b"\0" * (-length % 4)


def _address(address: IPv4Address | IPv6Address) -> tuple[int, bytes]:
    return (socket.AF_INET if address.version == 4 else socket.AF_INET6), address.packed


def _mac(mac: str) -> bytes:
    return bytes.fromhex(mac.replace(":", ""))


class RtnlSocket:
    """One netlink socket; `request` sends one message and waits for its acknowledgement."""

    def __init__(self) -> None:
        self._sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC, NETLINK_ROUTE)
        self._sock.bind((0, 0))
        self._seq = 0

    def close(self) -> None:
        self._sock.close()

    def request(self, kind: int, flags: int, body: bytes, what: str) -> None:
        """Send and wait for the ACK; a refusal raises `KernelError` with the kernel's errno."""
        self._seq = seq = (self._seq + 1) & 0xFFFFFFFF
        self._sock.send(_HEADER.pack(_HEADER.size + len(body), kind, flags | NLM_F_REQUEST | NLM_F_ACK, seq, 0)
                        + body)
        while True:
            data = self._sock.recv(65536)
            offset = 0
            while offset + _HEADER.size <= len(data):
                length, kind_seen, _, seq_seen, _ = _HEADER.unpack_from(data, offset)
                if length < _HEADER.size:
                    break
                if kind_seen == NLMSG_ERROR and seq_seen == seq:
                    code = -struct.unpack_from("=i", data, offset + _HEADER.size)[0]
                    if code:
                        raise KernelError(code, f"{what}: {os.strerror(code)} (errno {code})")
                    return
                offset += (length + 3) & ~3  # an older request's late reply: skipped

    # ------------------------------------------------------------ the hot path's shapes
    def replace_route(self, *, dst, gateway, oif: int, onlink: bool, protocol: int, table: int, what: str) -> None:
        family, dst_bytes = _address(dst.network_address)
        body = _RTMSG.pack(family, dst.prefixlen, 0, 0, table if table < 256 else 252, protocol,
                           RT_SCOPE_UNIVERSE, RTN_UNICAST, 0x4 if onlink else 0)
        body += _attr(RTA_TABLE, _TABLE_BYTES.pack(table)) + _attr(RTA_DST, dst_bytes)
        if gateway is not None:
            body += _attr(RTA_GATEWAY, _address(gateway)[1])
        body += _attr(RTA_OIF, struct.pack("=i", oif))
        self.request(RTM_NEWROUTE, _REPLACE, body, what)

    def delete_route(self, *, dst, protocol: int, table: int, what: str) -> None:
        """Matched by destination, table and protocol (scope 'nowhere' and type 0 match any)."""
        family, dst_bytes = _address(dst.network_address)
        body = _RTMSG.pack(family, dst.prefixlen, 0, 0, table if table < 256 else 252, protocol,
                           RT_SCOPE_NOWHERE, 0, 0)
        body += _attr(RTA_TABLE, _TABLE_BYTES.pack(table)) + _attr(RTA_DST, dst_bytes)
        self.request(RTM_DELROUTE, 0, body, what)

    def replace_neighbour(self, *, ifindex: int, address, mac: str, what: str) -> None:
        family, packed = _address(address)
        body = _NDMSG.pack(family, 0, 0, ifindex, NUD_PERMANENT, 0, 0)
        body += _attr(NDA_DST, packed) + _attr(NDA_LLADDR, _mac(mac))
        self.request(RTM_NEWNEIGH, _REPLACE, body, what)

    def delete_neighbour(self, *, ifindex: int, address, what: str) -> None:
        family, packed = _address(address)
        self.request(RTM_DELNEIGH, 0, _NDMSG.pack(family, 0, 0, ifindex, 0, 0, 0) + _attr(NDA_DST, packed), what)

    def replace_fdb(self, *, ifindex: int, mac: str, dst, what: str) -> None:
        """`bridge fdb replace MAC dev DEV dst DST self permanent`."""
        body = _NDMSG.pack(AF_BRIDGE, 0, 0, ifindex, NUD_PERMANENT, NTF_SELF, 0)
        body += _attr(NDA_LLADDR, _mac(mac)) + _attr(NDA_DST, dst.packed)
        self.request(RTM_NEWNEIGH, _REPLACE, body, what)

    def delete_fdb(self, *, ifindex: int, mac: str, what: str) -> None:
        """`bridge fdb del MAC dev DEV self`: the MAC's whole entry, every destination."""
        body = _NDMSG.pack(AF_BRIDGE, 0, 0, ifindex, NUD_NOARP | NUD_PERMANENT, NTF_SELF, 0)
        self.request(RTM_DELNEIGH, 0, body + _attr(NDA_LLADDR, _mac(mac)), what)


class AddressEvents:
    """The kernel's link and address notifications, read without blocking: did anything change?"""

    def __init__(self) -> None:
        self._sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC, NETLINK_ROUTE)
        self._sock.bind((0, RTMGRP_LINK | RTMGRP_IPV4_IFADDR | RTMGRP_IPV6_IFADDR))
        self._sock.setblocking(False)
        self._unread = True  # nothing was read yet: whatever was there before the socket counts

    def close(self) -> None:
        self._sock.close()

    def changed(self) -> bool:
        """Whether a link or address changed since the last call (True the first time); drains the socket."""
        changed, self._unread = self._unread, False
        while True:
            try:
                self._sock.recv(65536)
            except BlockingIOError:
                return changed
            except OSError as exc:
                if exc.errno != errno.ENOBUFS:  # ENOBUFS: notifications were lost, so something changed
                    raise
            changed = True
