"""Conntrack's new-connection events (ctnetlink, NFNLGRP_CONNTRACK_NEW) read over a
NETLINK_NETFILTER socket, and the one parser of them into `NewConnection` values.

Why events and not dumps: a connection's entry is confirmed (and the event sent) only when its
first packet has passed every hook, so an event is a connection the node forwarded or
delivered; its reply tuple says where DNAT sent it (a Service address -> an endpoint). The
kernel sends events only while a listener exists (`nf_conntrack_events` 2, the default), and
then for every new connection of the namespace: the cost grows with the connection rate,
which is why the agent listens only when asked (`--flow-conntrack on`). Every length is
untrusted: the parser stops at the first broken header and counts it, never raises.
"""
from __future__ import annotations

import ipaddress
import socket
import struct
from dataclasses import dataclass, field

from netagent.kernel import namespaces
from netagent.kernel.nflog import NETLINK_NETFILTER, NLA_TYPE_MASK, PROTOCOLS, receive_batch

NFNL_SUBSYS_CTNETLINK = 1
MSG_NEW = NFNL_SUBSYS_CTNETLINK << 8              # IPCTNL_MSG_CT_NEW
GROUP_NEW = 1                                     # NFNLGRP_CONNTRACK_NEW, as a bind mask
CTA_TUPLE_ORIG, CTA_TUPLE_REPLY = 1, 2
CTA_TUPLE_IP, CTA_TUPLE_PROTO = 1, 2
CTA_IP_V4_SRC, CTA_IP_V4_DST, CTA_IP_V6_SRC, CTA_IP_V6_DST = 1, 2, 3, 4
CTA_PROTO_NUM, CTA_PROTO_SRC_PORT, CTA_PROTO_DST_PORT = 1, 2, 3
RECEIVE_BUFFER = 4 << 20
_HEADER = struct.Struct("=IHHII")
_ATTR = struct.Struct("=HH")


@dataclass(frozen=True)
class Tuple:
    source: str
    destination: str
    protocol: str
    source_port: int | None = None
    destination_port: int | None = None


@dataclass(frozen=True)
class NewConnection:
    original: Tuple
    reply: Tuple

    @property
    def translated(self) -> bool:
        """DNAT chose another destination (a Service address -> an endpoint)."""
        return (self.reply.source, self.reply.source_port) != (self.original.destination,
                                                               self.original.destination_port)


@dataclass
class EventBatch:
    connections: list[NewConnection] = field(default_factory=list)
    unreadable: int = 0
    overruns: int = 0


def _attributes(data: bytes, start: int, end: int) -> dict[int, tuple[int, int]] | None:
    """type -> (start, end) of each attribute's value in data[start:end]; None when malformed."""
    found: dict[int, tuple[int, int]] = {}
    offset = start
    while offset + _ATTR.size <= end:
        length, kind = _ATTR.unpack_from(data, offset)
        if length < _ATTR.size or offset + length > end:
            return None
        found.setdefault(kind & NLA_TYPE_MASK, (offset + _ATTR.size, offset + length))
        offset += (length + 3) & ~3
    return found


def _tuple(data: bytes, span: tuple[int, int]) -> Tuple | None:
    parts = _attributes(data, *span)
    if parts is None or CTA_TUPLE_IP not in parts or CTA_TUPLE_PROTO not in parts:
        return None
    addresses = _attributes(data, *parts[CTA_TUPLE_IP])
    proto = _attributes(data, *parts[CTA_TUPLE_PROTO])
    if addresses is None or proto is None or CTA_PROTO_NUM not in proto:
        return None
    ends: list[str] = []
    for kinds, size, make in (((CTA_IP_V4_SRC, CTA_IP_V4_DST), 4, ipaddress.IPv4Address),
                              ((CTA_IP_V6_SRC, CTA_IP_V6_DST), 16, ipaddress.IPv6Address)):
        if all(kind in addresses for kind in kinds):
            values = [data[slice(*addresses[kind])] for kind in kinds]
            if any(len(value) != size for value in values):
                return None
            ends = [str(make(value)) for value in values]
            break
    number_span = proto[CTA_PROTO_NUM]
    if len(ends) != 2 or number_span[1] - number_span[0] != 1:
        return None
    number = data[number_span[0]]
    ports: list[int | None] = []
    for kind in (CTA_PROTO_SRC_PORT, CTA_PROTO_DST_PORT):
        value = data[slice(*proto[kind])] if kind in proto else b""
        ports.append(struct.unpack(">H", value)[0] if len(value) == 2 else None)
    return Tuple(ends[0], ends[1], PROTOCOLS.get(number, str(number)), ports[0], ports[1])


def parse_events(data: bytes) -> EventBatch:
    """Every new-connection event in one datagram; what cannot be read is counted."""
    batch = EventBatch()
    offset = 0
    while offset + _HEADER.size <= len(data):
        length, kind, _, _, _ = _HEADER.unpack_from(data, offset)
        if length < _HEADER.size or offset + length > len(data):
            batch.unreadable += 1
            return batch
        if kind == MSG_NEW:
            attrs = _attributes(data, offset + _HEADER.size + 4, offset + length)   # after the nfgenmsg
            tuples = None if attrs is None or CTA_TUPLE_ORIG not in attrs or CTA_TUPLE_REPLY not in attrs else (
                _tuple(data, attrs[CTA_TUPLE_ORIG]), _tuple(data, attrs[CTA_TUPLE_REPLY]))
            if tuples is None or tuples[0] is None or tuples[1] is None:
                batch.unreadable += 1
            else:
                batch.connections.append(NewConnection(tuples[0], tuples[1]))
        offset += (length + 3) & ~3
    if len(data) - offset >= 4:
        batch.unreadable += 1
    return batch


class ConntrackEvents:
    """A socket subscribed to new-connection events (`netns`: a namespace under /run/netns)."""

    def __init__(self, *, netns: str | None = None, receive_buffer: int = RECEIVE_BUFFER) -> None:
        self.sock = namespaces.made_in(netns, lambda: self._open(receive_buffer))

    @staticmethod
    def _open(receive_buffer: int) -> socket.socket:
        sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC, NETLINK_NETFILTER)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
            sock.bind((0, GROUP_NEW))
        except BaseException:
            sock.close()
            raise
        return sock

    def receive(self, timeout: float) -> EventBatch:
        return receive_batch(self.sock, timeout, parse_events, EventBatch)

    def close(self) -> None:
        self.sock.close()
