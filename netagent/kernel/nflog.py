"""nfnetlink_log: the kernel's packet log, read over a NETLINK_NETFILTER socket, and the one
parser of its messages (NFULNL_MSG_PACKET) into `LoggedPacket` values.

Why here and why by hand: the policy chains' log rules (iptables `-j NFLOG`, nft `log group`)
hand each logged packet to whoever bound the group; the message is a netlink header, an
nfgenmsg and a flat list of attributes, a few `struct` reads. pyroute2 has no nflog socket,
and a library would be a dependency for fifty lines. Everything in a message is untrusted
length fields: the parser never reads past a length it checked, stops at the first broken
header, and counts what it could not read (`ParsedBatch.unreadable`) rather than raising.

The copy range is small (`COPY_RANGE` bytes of each packet: the IP and transport headers),
so a flood of logged packets costs the kernel a small copy each and this process a small read;
the rules that log are limited in the kernel too (`LOG_RATE`): `iptables_log` and `nft_log` are the
one spelling of such a rule, for the policy's pod chains and the proxy's no-endpoints refusals.
`parse_headers` reads addresses, protocol and ports from those bytes (IPv4 and IPv6, TCP, UDP,
SCTP ports; ICMP type/code), refusing anything short or malformed with None.
"""
from __future__ import annotations

import errno
import ipaddress
import os
import socket
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

from netagent.errors import NetagentError
from netagent.kernel import namespaces, owned
from netagent.kernel.nftables import text as nft_text

B = TypeVar("B")

NETLINK_NETFILTER = 12
NFNL_SUBSYS_ULOG = 4
NFULNL_MSG_PACKET = 0
NFULNL_MSG_CONFIG = 1
MSG_PACKET = (NFNL_SUBSYS_ULOG << 8) | NFULNL_MSG_PACKET
MSG_CONFIG = (NFNL_SUBSYS_ULOG << 8) | NFULNL_MSG_CONFIG
NLMSG_ERROR, NLMSG_DONE = 2, 3
NLM_F_REQUEST, NLM_F_ACK = 0x1, 0x4
# attributes of a packet message (linux/netfilter/nfnetlink_log.h)
ATTR_PACKET_HDR, ATTR_TIMESTAMP, ATTR_INDEV, ATTR_OUTDEV = 1, 3, 4, 5
ATTR_PHYSINDEV, ATTR_PHYSOUTDEV, ATTR_PAYLOAD, ATTR_PREFIX = 6, 7, 9, 10
# config attributes and commands
CFG_CMD, CFG_MODE, CFG_NLBUFSIZ, CFG_TIMEOUT, CFG_QTHRESH = 1, 2, 3, 4, 5
CMD_BIND, CMD_UNBIND = 1, 2
COPY_PACKET = 2
NLA_TYPE_MASK = 0x3FFF          # without NLA_F_NESTED and NLA_F_NET_BYTEORDER

POLICY_LOG_GROUP = owned.POLICY_LOG_GROUP
COPY_RANGE = 128                # bytes of each packet copied: IP + transport headers
LOG_RATE, LOG_BURST = 100, 100  # packets a log rule hands over per second, and its burst
PREFIX_MAX = 63                 # iptables' --nflog-prefix (64 with its NUL); nft allows more
RECEIVE_BUFFER = 1 << 20
CONFIG_PATIENCE = 256            # datagrams read while waiting for a config answer
_HEADER = struct.Struct("=IHHII")       # nlmsghdr: len, type, flags, seq, pid
_NFGEN = struct.Struct("=BBH")          # nfgenmsg: family, version, res_id (network order)
_ATTR = struct.Struct("=HH")
PROTOCOLS = {1: "icmp", 6: "tcp", 17: "udp", 58: "icmpv6", 132: "sctp"}
_PORTED = (6, 17, 132)
_V6_EXTENSIONS = (0, 43, 60)            # hop-by-hop, routing, destination options: skipped
_V6_FRAGMENT = 44


def iptables_log(prefix: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(match, target) tokens of an iptables rule that hands a packet to our group, at most
    LOG_RATE a second; the prefix is ours (a chain name or a constant of owned.py), cut to fit."""
    return (("-m", "limit", "--limit", f"{LOG_RATE}/sec", "--limit-burst", str(LOG_BURST)),
            ("-j", "NFLOG", "--nflog-prefix", prefix[:PREFIX_MAX], "--nflog-group", str(POLICY_LOG_GROUP),
             "--nflog-size", str(COPY_RANGE)))


def nft_log(prefix: str) -> str:
    """The nft statements of the same rule (the prefix quoted through nftables/text.py)."""
    return (f"limit rate {LOG_RATE}/second burst {LOG_BURST} packets "
            f"log prefix {nft_text.comment(prefix[:PREFIX_MAX])} group {POLICY_LOG_GROUP} snaplen {COPY_RANGE}")


class NflogError(NetagentError, OSError):
    """The nflog socket could not be configured (an OSError too: callers catch those)."""


@dataclass(frozen=True)
class LoggedPacket:
    """One packet a log rule handed over: its rule's prefix, the interfaces, the bytes copied."""
    family: int                      # socket.AF_INET / AF_INET6
    group: int
    prefix: str
    payload: bytes
    time: float                      # the kernel's timestamp, else when it was read
    indev: int = 0
    outdev: int = 0
    physindev: int = 0
    physoutdev: int = 0


@dataclass(frozen=True)
class Headers:
    """What a packet's first bytes say."""
    source: str
    destination: str
    protocol: str                    # "tcp", "udp", "sctp", "icmp", "icmpv6" or the number
    source_port: int | None = None
    destination_port: int | None = None
    icmp: tuple[int, int] | None = None      # (type, code)


@dataclass
class ParsedBatch:
    packets: list[LoggedPacket] = field(default_factory=list)
    unreadable: int = 0              # messages (or the rest of a datagram) that could not be read
    overruns: int = 0                # the kernel dropped messages: the socket's buffer was full
    errors: list[int] = field(default_factory=list)   # errno of each NLMSG_ERROR that is not an ACK


def _attributes(data: bytes, start: int, end: int) -> dict[int, bytes] | None:
    """type -> value of the attributes in data[start:end]; None when one is malformed."""
    found: dict[int, bytes] = {}
    offset = start
    while offset + _ATTR.size <= end:
        length, kind = _ATTR.unpack_from(data, offset)
        if length < _ATTR.size or offset + length > end:
            return None
        found.setdefault(kind & NLA_TYPE_MASK, bytes(data[offset + _ATTR.size:offset + length]))
        offset += (length + 3) & ~3
    return found


def _be32(value: bytes | None) -> int:
    return struct.unpack(">I", value)[0] if value is not None and len(value) == 4 else 0


def _packet(data: bytes, start: int, end: int, now: float) -> LoggedPacket | None:
    if end - start < _NFGEN.size:
        return None
    family, _, group = _NFGEN.unpack_from(data, start)
    attrs = _attributes(data, start + _NFGEN.size, end)
    if attrs is None or ATTR_PAYLOAD not in attrs:
        return None
    prefix = attrs.get(ATTR_PREFIX, b"").split(b"\0", 1)[0][:PREFIX_MAX * 2].decode("utf-8", "replace")
    stamp = attrs.get(ATTR_TIMESTAMP)
    when = now
    if stamp is not None and len(stamp) == 16:
        seconds, micros = struct.unpack(">QQ", stamp)
        if 0 < seconds < 1 << 40 and micros < 1_000_000:
            when = seconds + micros / 1e6
    return LoggedPacket(family, socket.ntohs(group), prefix, attrs[ATTR_PAYLOAD][:COPY_RANGE], when,
                        _be32(attrs.get(ATTR_INDEV)), _be32(attrs.get(ATTR_OUTDEV)),
                        _be32(attrs.get(ATTR_PHYSINDEV)), _be32(attrs.get(ATTR_PHYSOUTDEV)))


def parse_datagram(data: bytes, *, now: float | None = None) -> ParsedBatch:
    """Every netlink message in one datagram: logged packets, ACK/errors, what was unreadable.
    A broken message header ends the datagram (its lengths cannot be trusted past it)."""
    batch = ParsedBatch()
    now = time.time() if now is None else now
    offset = 0
    while offset + _HEADER.size <= len(data):
        length, kind, _, _, _ = _HEADER.unpack_from(data, offset)
        if length < _HEADER.size or offset + length > len(data):
            batch.unreadable += 1
            return batch
        body, end = offset + _HEADER.size, offset + length
        if kind == MSG_PACKET:
            packet = _packet(data, body, end, now)
            if packet is None:
                batch.unreadable += 1
            else:
                batch.packets.append(packet)
        elif kind == NLMSG_ERROR and end - body >= 4:
            code = -struct.unpack_from("=i", data, body)[0]
            if code:
                batch.errors.append(code)
        offset += (length + 3) & ~3
    if offset < len(data) and len(data) - offset >= 4:
        batch.unreadable += 1
    return batch


def _ports(data: bytes, offset: int, number: int) -> tuple[int | None, int | None, tuple[int, int] | None]:
    if number in _PORTED and len(data) >= offset + 4:
        source, destination = struct.unpack_from(">HH", data, offset)
        return source, destination, None
    if number in (1, 58) and len(data) >= offset + 2:
        return None, None, (data[offset], data[offset + 1])
    return None, None, None


def parse_headers(data: bytes) -> Headers | None:
    """Addresses, protocol and ports of an IP packet's first bytes; None when they are not an
    IPv4 or IPv6 header (a later fragment has no ports: it gives none)."""
    if len(data) < 20:
        return None
    version = data[0] >> 4
    if version == 4:
        header = (data[0] & 0x0F) * 4
        if header < 20 or len(data) < header:
            return None
        number = data[9]
        fragment = struct.unpack_from(">H", data, 6)[0] & 0x1FFF
        ports = _ports(data, header, number) if fragment == 0 else (None, None, None)
        return Headers(str(ipaddress.IPv4Address(data[12:16])), str(ipaddress.IPv4Address(data[16:20])),
                       PROTOCOLS.get(number, str(number)), *ports)
    if version == 6 and len(data) >= 40:
        number, offset, fragment = data[6], 40, False
        for _ in range(4):                           # a few extension headers, no more
            if number in _V6_EXTENSIONS and len(data) >= offset + 2:
                number, offset = data[offset], offset + (data[offset + 1] + 1) * 8
            elif number == _V6_FRAGMENT and len(data) >= offset + 8:
                fragment = fragment or (struct.unpack_from(">H", data, offset + 2)[0] >> 3) != 0
                number, offset = data[offset], offset + 8
            else:
                break
        ports = (None, None, None) if fragment else _ports(data, offset, number)
        return Headers(str(ipaddress.IPv6Address(data[8:24])), str(ipaddress.IPv6Address(data[24:40])),
                       PROTOCOLS.get(number, str(number)), *ports)
    return None


def config_message(group: int, attributes: list[tuple[int, bytes]], *, sequence: int) -> bytes:
    """An NFULNL_MSG_CONFIG request for `group`, acknowledged."""
    body = _NFGEN.pack(socket.AF_UNSPEC, 0, socket.htons(group))
    for kind, value in attributes:
        attribute = _ATTR.pack(_ATTR.size + len(value), kind) + value
        body += attribute + b"\0" * (-len(attribute) % 4)
    return _HEADER.pack(_HEADER.size + len(body), MSG_CONFIG, NLM_F_REQUEST | NLM_F_ACK, sequence, 0) + body


def receive_batch(sock: socket.socket, timeout: float, parse: Callable[[bytes], B], batch: Callable[..., B]) -> B:
    """One datagram of a netlink event socket, parsed; `batch()` (empty) after `timeout` seconds,
    `batch(overruns=1)` when the kernel dropped messages (ENOBUFS), and reading goes on."""
    sock.settimeout(timeout)
    try:
        return parse(sock.recv(65536))
    except TimeoutError:
        return batch()
    except OSError as error:
        if error.errno == errno.ENOBUFS:
            return batch(overruns=1)
        raise


class NflogSocket:
    """A socket bound to one nflog group, copying `copy_range` bytes of each packet.

    `netns`: a namespace under /run/netns to open it in (tests), or None for the caller's.
    Only one socket on a host (namespace) may bind a group: a second gets EBUSY, reported."""

    def __init__(self, group: int = POLICY_LOG_GROUP, *, copy_range: int = COPY_RANGE, netns: str | None = None,
                 receive_buffer: int = RECEIVE_BUFFER) -> None:
        if not 0 <= group <= 0xFFFF:
            raise NflogError(errno.EINVAL, f"nflog group {group} is not between 0 and 65535")
        self.group = group
        self._sequence = 0
        self.sock = namespaces.made_in(netns, lambda: self._open(receive_buffer))
        try:
            self._configure([(CFG_CMD, bytes([CMD_BIND]))], "bind")
            self._configure([(CFG_MODE, struct.pack(">IBx", copy_range, COPY_PACKET)),
                             (CFG_QTHRESH, struct.pack(">I", 1)),
                             (CFG_TIMEOUT, struct.pack(">I", 0))], "configure")
        except BaseException:
            self.sock.close()
            raise

    @staticmethod
    def _open(receive_buffer: int) -> socket.socket:
        sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC, NETLINK_NETFILTER)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
            sock.bind((0, 0))
        except BaseException:
            sock.close()
            raise
        return sock

    def _configure(self, attributes: list[tuple[int, bytes]], what: str) -> None:
        self._sequence += 1
        self.sock.sendall(config_message(self.group, attributes, sequence=self._sequence))
        self.sock.settimeout(5.0)
        try:
            for _ in range(CONFIG_PATIENCE):   # logged packets may come before the answer
                reply = parse_datagram(self.sock.recv(65536))
                if reply.errors:
                    code = reply.errors[0]
                    raise NflogError(code, f"cannot {what} nflog group {self.group}: {os.strerror(code)}")
                if not reply.packets:          # the ACK (error 0)
                    return
            raise NflogError(errno.ETIMEDOUT, f"no answer to the nflog {what} of group {self.group} "
                                              f"among {CONFIG_PATIENCE} datagrams")
        except TimeoutError:
            raise NflogError(errno.ETIMEDOUT, f"no answer to the nflog {what} of group {self.group}") from None
        finally:
            self.sock.settimeout(None)

    def receive(self, timeout: float) -> ParsedBatch:
        """One datagram's packets, or an empty batch after `timeout` seconds. An overrun (the
        kernel dropped messages: ENOBUFS) is counted in `overruns`, and reading goes on."""
        return receive_batch(self.sock, timeout, parse_datagram, ParsedBatch)

    def close(self) -> None:
        try:
            self._configure([(CFG_CMD, bytes([CMD_UNBIND]))], "unbind")
        except OSError:
            pass                         # closing the socket unbinds it too
        self.sock.close()
