"""Typed views of every key and value in ebpf/sock_lb.c's maps: ctypes structures and packers.

The C structs are the contract between the programs and the agent. Each has here a ctypes
`Structure` with the same field names, sizes and offsets (tests/unit/ebpf/test_ebpf_maps.py checks
them against the ctypes bcc derives from the C source, and against the packers), a
`struct.Struct` packer the backend uses to build and compare entries as bytes (fast at a
million entries), and small decode helpers for read-back. Addresses and ports are in network
byte order in the maps, as the socket context holds them; the views convert.

IPv6 (ebpf/sock_lb6.c) has its own maps, named as the IPv4 ones with a `6` (`na_svc6`, ...):
the same entries with 16-byte addresses (SvcKey6, Backend6, AffinityValue6), the others
(values, slot keys, set names) shared. The encoders take either family's address text and
pack the width it has; the decoders tell the family by the entry's size. The tc path has
IPv6 maps too (ebpf/nodeport6.c: `na_ct6`, `na_ct_new6`, `na_config6`; `na_lbsrc6` is declared in
ebpf/sock_lb6.c, as `na_lbsrc` in sock_lb.c, since the socket load balancer checks source ranges too).
A conntrack value keeps, per direction, its sender's next sequence number and last acknowledgement
(`seq_end`, `ack`, valid under CT_F_SEQ / CT_F_ACKED): the tc path's RST check.
The socket LB's flow events (`na_flow_events`, a ring buffer read by ebpf/ringbuf.py) are one
`struct na_flow_event` each: `FLOW_EVENT` and `parse_flow_event` are their view.
"""
from __future__ import annotations

import ctypes
import socket
import struct
from dataclasses import dataclass
from enum import IntEnum

from netagent.kernel.families import IpFamily

# ---- map names, as declared in the C source (and pinned under <bpf root>/<PIN_SUBDIR>/) -----------
SVC_MAP = "na_svc"
SLOTS_MAP = "na_slots"
SETNAME_MAP = "na_setname"
AFFINITY_MAP = "na_affinity"
SOCK_REVNAT_MAP = "na_sock_revnat"   # socket storage (per socket, freed with it): not a MapSet member,
                                     # its entries are reachable only through a socket
RETIRED_MAPS = ("na_revnat",)        # pinned by earlier versions: removed by cleanup
CT_MAP = "na_ct"            # ebpf/nodeport.c: the tc path's confirmed connections (LRU)
CT_NEW_MAP = "na_ct_new"    # ebpf/nodeport.c: new (unconfirmed) and closing connections (a small LRU)
LBSRC_MAP = "na_lbsrc"      # loadBalancerSourceRanges (LPM trie)
CONFIG_MAP = "na_config"    # the node address the tc path SNATs to (array of one)
MAP_NAMES = (SVC_MAP, SLOTS_MAP, SETNAME_MAP, AFFINITY_MAP, CT_MAP, CT_NEW_MAP, LBSRC_MAP, CONFIG_MAP)
SOCK_REVNAT6_MAP = "na_sock_revnat6"


def v6_name(name: str) -> str:
    """`na_svc` -> `na_svc6`: the IPv6 map of a role."""
    return name + "6"


MAP_NAMES6 = tuple(v6_name(name) for name in MAP_NAMES)
LRU_MAPS = frozenset({AFFINITY_MAP, CT_MAP, CT_NEW_MAP, *(v6_name(n) for n in (AFFINITY_MAP, CT_MAP, CT_NEW_MAP))})
# (LRU maps, full, evict their least recently used entry; the others refuse)
SOCKET_STORAGE_MAPS = (SOCK_REVNAT_MAP, SOCK_REVNAT6_MAP)   # no size, no key walk: their entries live in sockets
PINNED_NAMES = (*MAP_NAMES, SOCK_REVNAT_MAP, *MAP_NAMES6, SOCK_REVNAT6_MAP)   # everything we pin
FLOW_EVENTS_MAP = "na_flow_events"   # the socket LB's flow events (BPF ring buffer: ebpf/ringbuf.py reads it)
FLOW_LOST_MAP = "na_flow_lost"       # events the full ring dropped (per-CPU array of one counter)
FLOW_ON_MAP = "na_flow_on"           # 1: the programs write events (an array of one u32, set by the listener)
FLOW_MAPS = (FLOW_EVENTS_MAP, FLOW_LOST_MAP, FLOW_ON_MAP)   # pinned too, but no entries to count: not in PINNED_NAMES

# ---- flags and kinds (the C #defines) --------------------------------------------------------------
F_NO_ENDPOINTS = 1
F_EXTERNAL_LOCAL = 2
F_SOURCE_RANGES = 4
BACKEND_LOCAL = 1       # na_backend.flags: the endpoint is on this node
CT_F_HAIRPIN = 1        # na_ct_value.flags (ebpf/nodeport.c's NA_CT_F_*)
CT_F_REPLIED = 2
CT_F_FIN = 4
CT_F_CLOSED = 8
CT_F_SEQ = 16          # seq_end holds the next sequence number of this direction's sender
CT_F_ACKED = 32        # ack holds the last acknowledgement this direction's sender sent


class AddressKind(IntEnum):
    CLUSTER_IP = 1
    NODE_PORT = 2
    EXTERNAL_IP = 3
    LOAD_BALANCER = 4

    @property
    def label(self) -> str:
        return {1: "ClusterIP", 2: "NodePort", 3: "ExternalIP", 4: "LoadBalancer"}[self.value]


class SetRole(IntEnum):
    CLUSTER = 1
    EXTERNAL = 2


NAME_BYTES = 124


# ---- ctypes views (field names and layout exactly as in the C structs) ---------------------------
class SvcKey(ctypes.Structure):
    _fields_ = [("addr", ctypes.c_uint32), ("port", ctypes.c_uint16), ("proto", ctypes.c_uint8),
                ("pad", ctypes.c_uint8)]


class SvcValue(ctypes.Structure):
    _fields_ = [("set_id", ctypes.c_uint32), ("count", ctypes.c_uint32), ("ext_set_id", ctypes.c_uint32),
                ("ext_count", ctypes.c_uint32), ("affinity_timeout", ctypes.c_uint32),
                ("flags", ctypes.c_uint16), ("kind", ctypes.c_uint8), ("pad", ctypes.c_uint8)]


class SlotKey(ctypes.Structure):
    _fields_ = [("set_id", ctypes.c_uint32), ("slot", ctypes.c_uint32)]


class Backend(ctypes.Structure):
    _fields_ = [("addr", ctypes.c_uint32), ("port", ctypes.c_uint16), ("flags", ctypes.c_uint16)]


class SetName(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char * NAME_BYTES), ("role", ctypes.c_uint32)]


class AffinityKey(ctypes.Structure):
    _fields_ = [("netns_cookie", ctypes.c_uint64), ("set_id", ctypes.c_uint32), ("pad", ctypes.c_uint32)]


class AffinityValue(ctypes.Structure):
    _fields_ = [("last_used_ns", ctypes.c_uint64), ("slot", ctypes.c_uint32), ("addr", ctypes.c_uint32),
                ("port", ctypes.c_uint16), ("pad", ctypes.c_uint16), ("pad2", ctypes.c_uint32)]


Addr6 = ctypes.c_uint32 * 4


class SvcKey6(ctypes.Structure):
    _fields_ = [("addr", Addr6), ("port", ctypes.c_uint16), ("proto", ctypes.c_uint8), ("pad", ctypes.c_uint8)]


class Backend6(ctypes.Structure):
    _fields_ = [("addr", Addr6), ("port", ctypes.c_uint16), ("flags", ctypes.c_uint16)]


class AffinityValue6(ctypes.Structure):
    _fields_ = [("last_used_ns", ctypes.c_uint64), ("slot", ctypes.c_uint32), ("addr", Addr6),
                ("port", ctypes.c_uint16), ("pad", ctypes.c_uint16)]


class CtKey6(ctypes.Structure):
    _fields_ = [("saddr", Addr6), ("daddr", Addr6), ("sport", ctypes.c_uint16), ("dport", ctypes.c_uint16),
                ("proto", ctypes.c_uint8), ("dir", ctypes.c_uint8), ("pad", ctypes.c_uint16)]


class CtValue6(ctypes.Structure):
    _fields_ = [("saddr", Addr6), ("daddr", Addr6), ("sport", ctypes.c_uint16), ("dport", ctypes.c_uint16),
                ("flags", ctypes.c_uint32), ("seq_end", ctypes.c_uint32), ("ack", ctypes.c_uint32),
                ("created_ns", ctypes.c_uint64)]


class LbSrcKey6(ctypes.Structure):
    _fields_ = [("prefixlen", ctypes.c_uint32), ("set_id", ctypes.c_uint32), ("addr", Addr6)]


class Config6(ctypes.Structure):
    _fields_ = [("node_addr", Addr6), ("flags", ctypes.c_uint32)]


class CtKey(ctypes.Structure):
    _fields_ = [("saddr", ctypes.c_uint32), ("daddr", ctypes.c_uint32), ("sport", ctypes.c_uint16),
                ("dport", ctypes.c_uint16), ("proto", ctypes.c_uint8), ("dir", ctypes.c_uint8),
                ("pad", ctypes.c_uint16)]


class CtValue(ctypes.Structure):
    _fields_ = [("saddr", ctypes.c_uint32), ("daddr", ctypes.c_uint32), ("sport", ctypes.c_uint16),
                ("dport", ctypes.c_uint16), ("flags", ctypes.c_uint32), ("seq_end", ctypes.c_uint32),
                ("ack", ctypes.c_uint32), ("created_ns", ctypes.c_uint64)]


class LbSrcKey(ctypes.Structure):
    _fields_ = [("prefixlen", ctypes.c_uint32), ("set_id", ctypes.c_uint32), ("addr", ctypes.c_uint32)]


class Config(ctypes.Structure):
    _fields_ = [("node_addr", ctypes.c_uint32), ("flags", ctypes.c_uint32)]


@dataclass(frozen=True)
class MapLayout:
    name: str
    key: type[ctypes.Structure] | type[ctypes.c_uint32]
    value: type[ctypes.Structure] | type[ctypes.c_uint8]
    key_packer: struct.Struct
    value_packer: struct.Struct

    @property
    def key_size(self) -> int:
        return ctypes.sizeof(self.key)

    @property
    def value_size(self) -> int:
        return ctypes.sizeof(self.value)


# packers: '!' where a field is in network order ('4s'/'2s' carry network-order bytes in native structs)
SVC_KEY = struct.Struct("!4sHBB")
SVC_VALUE = struct.Struct("=IIIIIHBB")
SLOT_KEY = struct.Struct("=II")
BACKEND = struct.Struct("=4s2sH")   # the port in network order, the flags native
SET_ID = struct.Struct("=I")
SET_NAME = struct.Struct(f"={NAME_BYTES}sI")
AFFINITY_KEY = struct.Struct("=QII")
AFFINITY_VALUE = struct.Struct("=QI4s2sHI")
CT_KEY = struct.Struct("=4s4s2s2sBBH")
CT_VALUE = struct.Struct("=4s4s2s2s12xQ")   # flags, seq_end, ack skipped
LBSRC_KEY = struct.Struct("=II4s")
LBSRC_VALUE = struct.Struct("=B")
CONFIG = struct.Struct("=4sI")
SVC6_KEY = struct.Struct("!16sHBB")
BACKEND6 = struct.Struct("=16s2sH")
AFFINITY6_VALUE = struct.Struct("=QI16s2sH")
CT6_KEY = struct.Struct("=16s16s2s2sBBH")
CT6_VALUE = struct.Struct("=16s16s2s2s12xQ")
LBSRC6_KEY = struct.Struct("=II16s")
CONFIG6 = struct.Struct("=16sI")

LAYOUTS = {
    SVC_MAP: MapLayout(SVC_MAP, SvcKey, SvcValue, SVC_KEY, SVC_VALUE),
    SLOTS_MAP: MapLayout(SLOTS_MAP, SlotKey, Backend, SLOT_KEY, BACKEND),
    SETNAME_MAP: MapLayout(SETNAME_MAP, ctypes.c_uint32, SetName, SET_ID, SET_NAME),
    AFFINITY_MAP: MapLayout(AFFINITY_MAP, AffinityKey, AffinityValue, AFFINITY_KEY, AFFINITY_VALUE),
    CT_MAP: MapLayout(CT_MAP, CtKey, CtValue, CT_KEY, CT_VALUE),
    CT_NEW_MAP: MapLayout(CT_NEW_MAP, CtKey, CtValue, CT_KEY, CT_VALUE),
    LBSRC_MAP: MapLayout(LBSRC_MAP, LbSrcKey, ctypes.c_uint8, LBSRC_KEY, LBSRC_VALUE),
    CONFIG_MAP: MapLayout(CONFIG_MAP, ctypes.c_uint32, Config, SET_ID, CONFIG),
    v6_name(SVC_MAP): MapLayout(v6_name(SVC_MAP), SvcKey6, SvcValue, SVC6_KEY, SVC_VALUE),
    v6_name(SLOTS_MAP): MapLayout(v6_name(SLOTS_MAP), SlotKey, Backend6, SLOT_KEY, BACKEND6),
    v6_name(SETNAME_MAP): MapLayout(v6_name(SETNAME_MAP), ctypes.c_uint32, SetName, SET_ID, SET_NAME),
    v6_name(AFFINITY_MAP): MapLayout(v6_name(AFFINITY_MAP), AffinityKey, AffinityValue6, AFFINITY_KEY,
                                     AFFINITY6_VALUE),
    v6_name(CT_MAP): MapLayout(v6_name(CT_MAP), CtKey6, CtValue6, CT6_KEY, CT6_VALUE),
    v6_name(CT_NEW_MAP): MapLayout(v6_name(CT_NEW_MAP), CtKey6, CtValue6, CT6_KEY, CT6_VALUE),
    v6_name(LBSRC_MAP): MapLayout(v6_name(LBSRC_MAP), LbSrcKey6, ctypes.c_uint8, LBSRC6_KEY, LBSRC_VALUE),
    v6_name(CONFIG_MAP): MapLayout(v6_name(CONFIG_MAP), ctypes.c_uint32, Config6, SET_ID, CONFIG6),
}

def address_width(family: IpFamily) -> int:
    """Bytes of an address of `family` in the maps (4 or 16)."""
    return 4 if family is IpFamily.V4 else 16


def backend_family(packed: bytes) -> IpFamily:
    """The family of a packed `na_slots` / `na_slots6` value, by its size (no text parsing)."""
    return IpFamily.V4 if len(packed) == BACKEND.size else IpFamily.V6


def svc_key_family(packed: bytes) -> IpFamily:
    """The family of a packed `na_svc` / `na_svc6` key, by its size."""
    return IpFamily.V4 if len(packed) == SVC_KEY.size else IpFamily.V6


PROTOCOL_NUMBERS = {"TCP": socket.IPPROTO_TCP, "UDP": socket.IPPROTO_UDP, "SCTP": 132}
PROTOCOL_NAMES = {number: name for name, number in PROTOCOL_NUMBERS.items()}


# ---- encoders (what the backend writes) -------------------------------------------------------------

def _ip(address: str) -> bytes:
    """Four bytes in network order; strict dotted-quad IPv4 (inet_pton), else ValueError."""
    try:
        return socket.inet_pton(socket.AF_INET, address)
    except OSError:
        raise ValueError(f"not an IPv4 address: {address!r}") from None


def _ip_any(address: str) -> bytes:
    """4 bytes for an IPv4 address, 16 for an IPv6 one (network order), else ValueError."""
    likely = (socket.AF_INET6, socket.AF_INET) if ":" in address else (socket.AF_INET, socket.AF_INET6)
    for family in likely:   # inet_pton decides; the colon only saves a failed try (an exception)
        try:
            return socket.inet_pton(family, address)
        except OSError:
            continue
    raise ValueError(f"not an IP address: {address!r}")


def _ntop(raw: bytes) -> str:
    return socket.inet_ntop(socket.AF_INET if len(raw) == 4 else socket.AF_INET6, raw)


def svc_key(address: str, port: int, protocol: str) -> bytes:
    """An `na_svc` key, or an `na_svc6` one for an IPv6 address."""
    raw = _ip_any(address)
    return (SVC_KEY if len(raw) == 4 else SVC6_KEY).pack(raw, port, PROTOCOL_NUMBERS[protocol], 0)


def svc_value(*, set_id: int, count: int, ext_set_id: int, ext_count: int, affinity_timeout: int, flags: int,
              kind: AddressKind) -> bytes:
    return SVC_VALUE.pack(set_id, count, ext_set_id, ext_count, affinity_timeout, flags, int(kind), 0)


def slot_key(set_id: int, slot: int) -> bytes:
    return SLOT_KEY.pack(set_id, slot)


def backend(address: str, port: int, *, local: bool = False) -> bytes:
    """An `na_slots` value, or an `na_slots6` one for an IPv6 address."""
    raw = _ip_any(address)
    return (BACKEND if len(raw) == 4 else BACKEND6).pack(raw, port.to_bytes(2, "big"), BACKEND_LOCAL if local else 0)


def lbsrc_key(set_id: int, network: str) -> bytes:
    """An allowed source range of a set (`network` is a CIDR, host bits ignored): an `na_lbsrc`
    key, or an `na_lbsrc6` one for IPv6."""
    address, _, length = network.partition("/")
    raw = _ip_any(address)
    return (LBSRC_KEY if len(raw) == 4 else LBSRC6_KEY).pack(32 + int(length or 8 * len(raw)), set_id, raw)


ALLOWED = LBSRC_VALUE.pack(1)


CONFIG_SNAT = 1   # na_config.flags: the tc path SNATs traffic to remote backends itself


def config_value(node_address: str | None, *, snat: bool, width: int = 4) -> bytes:
    """`na_config`'s value (`na_config6`'s with `width` 16; `node_address` of that family or None)."""
    raw = _ip_any(node_address) if node_address else bytes(width)
    if len(raw) != width:
        raise ValueError(f"not an address of {width} bytes: {node_address!r}")
    return (CONFIG if width == 4 else CONFIG6).pack(raw, CONFIG_SNAT if snat else 0)


def set_id_key(set_id: int) -> bytes:
    return SET_ID.pack(set_id)


def set_name(name: str, role: SetRole) -> bytes:
    raw = name.encode()
    if len(raw) >= NAME_BYTES:
        raw = raw[:NAME_BYTES - 1]
    return SET_NAME.pack(raw, int(role))


# ---- decoders (read-back) ---------------------------------------------------------------------------

@dataclass(frozen=True)
class ServiceEntry:
    address: str
    port: int
    protocol: str
    set_id: int
    count: int
    ext_set_id: int
    ext_count: int
    affinity_timeout: int
    flags: int
    kind: AddressKind


def parse_svc(key: bytes, value: bytes) -> ServiceEntry:
    addr, port, proto, _ = (SVC_KEY if len(key) == SVC_KEY.size else SVC6_KEY).unpack(key)
    set_id, count, ext_set_id, ext_count, affinity, flags, kind, _ = SVC_VALUE.unpack(value)
    return ServiceEntry(_ntop(addr), port, PROTOCOL_NAMES.get(proto, str(proto)),
                        set_id, count, ext_set_id, ext_count, affinity, flags, AddressKind(kind))


def parse_slot_key(key: bytes) -> tuple[int, int]:
    set_id, slot = SLOT_KEY.unpack(key)
    return set_id, slot


def parse_backend(value: bytes) -> str:
    if len(value) == BACKEND6.size:
        addr, port, _flags = BACKEND6.unpack(value)
        return f"[{_ntop(addr)}]:{int.from_bytes(port, 'big')}"
    addr, port, _flags = BACKEND.unpack(value)
    return f"{_ntop(addr)}:{int.from_bytes(port, 'big')}"


def parse_set_name(value: bytes) -> tuple[str, SetRole]:
    raw, role = SET_NAME.unpack(value)
    return raw.split(b"\0", 1)[0].decode(errors="replace"), SetRole(role)


def parse_set_id(key: bytes) -> int:
    return SET_ID.unpack(key)[0]


@dataclass(frozen=True)
class CtEntry:
    """One direction of a tc-path flow (`na_ct`, `na_ct_new`): the packet's tuple and direction
    (1 forward, 2 reply, 3 hairpin) and the state flags (CT_F_*)."""
    saddr: str
    sport: int
    daddr: str
    dport: int
    proto: int
    dir: int
    flags: int
    nat_daddr: str     # the packet's new destination and port
    nat_dport: int


def parse_ct(key: bytes, value: bytes) -> CtEntry:
    v6 = len(key) == CT6_KEY.size
    saddr, daddr, sport, dport, proto, direction, _ = (CT6_KEY if v6 else CT_KEY).unpack(key)
    _, nat_daddr, _, nat_dport, created = (CT6_VALUE if v6 else CT_VALUE).unpack(value)
    flags = (CtValue6 if v6 else CtValue).from_buffer_copy(value).flags
    return CtEntry(_ntop(saddr), int.from_bytes(sport, "big"), _ntop(daddr),
                   int.from_bytes(dport, "big"), proto, direction, flags, _ntop(nat_daddr),
                   int.from_bytes(nat_dport, "big"))


# ---- flow events (sock_lb.c's struct na_flow_event, one ring buffer record each) -------------------
FLOW_EVENT = struct.Struct("=Q16s16s16s2s2sBBBB")


@dataclass(frozen=True)
class FlowEvent:
    """One translated (`error` 0) or refused (`error` the errno) connect/sendmsg of the socket LB."""

    netns_cookie: int
    family: IpFamily
    protocol: str              # "TCP" | "UDP" | "SCTP"
    service: str
    service_port: int
    backend: str               # "" when refused
    backend_port: int
    source: str                # "" when the hook did not know it
    error: int


_PROTOCOLS = {socket.IPPROTO_TCP: "TCP", socket.IPPROTO_UDP: "UDP", 132: "SCTP"}


def parse_flow_event(raw: bytes) -> FlowEvent:
    """A ring buffer record as a FlowEvent; ValueError for anything that is not one."""
    if len(raw) != FLOW_EVENT.size:
        raise ValueError(f"a flow event is {FLOW_EVENT.size} bytes, not {len(raw)}")
    cookie, service, backend, source, sport, bport, family, proto, error, _ = FLOW_EVENT.unpack(raw)
    if family not in (4, 6) or proto not in _PROTOCOLS:
        raise ValueError(f"a flow event of family {family}, protocol {proto}")
    width, kind = (4, socket.AF_INET) if family == 4 else (16, socket.AF_INET6)

    def text(raw_address: bytes) -> str:
        return "" if not any(raw_address[:width]) else socket.inet_ntop(kind, raw_address[:width])

    return FlowEvent(netns_cookie=cookie, family=IpFamily.V4 if family == 4 else IpFamily.V6,
                     protocol=_PROTOCOLS[proto], service=text(service), service_port=int.from_bytes(sport, "big"),
                     backend=text(backend), backend_port=int.from_bytes(bport, "big"), source=text(source),
                     error=error)
