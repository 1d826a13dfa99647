"""What a set of ours is, and the one spelling of each member: set types, specs, what the kernel
reports about a set, and the member validation both implementations run. Pure: no exec, no state.

Why here and alone. The runner, the fake, the restore text and every caller (the service
proxy's renderers spell members with `entry`) share these values, and they are the part that
must be identical everywhere: members are compared as strings, so every member has ONE
spelling, the one `ipset save` prints: `10.0.0.1,tcp:80,10.0.0.1` (protocol lower case and
always present), `10.1.0.0/16` (host bits cleared), `10.0.0.1` rather than `10.0.0.1/32`.
`canonical_member(type, text)` turns what a caller writes into that spelling and rejects what
the sets below cannot hold; `entry()` builds the common ip,proto:port[,ip] member.

What the validation accepts is a strict subset of what the real tool accepts, on purpose:
IPv4 dotted decimal (the tool resolves host names and reads `010.0.0.9` as octal) or IPv6 in
Python's compressed spelling (what `ipset save` prints), the family a member's own, no
ranges or CIDRs that the tool would expand into many members (hash:ip `10.0.0.0/30`, port
`8-9`), protocols tcp/udp/sctp only, no /0 (the hash:net types refuse it anyway).

Only our sets are written: names start with `NETAGENT-` and are at most 31 characters (the
kernel's limit); `require_owned_name` is the check. Sets are created `family inet` (or the
spec's `inet6`: the kernel refuses a member of the other family, `member_family` says which) with
`maxelem` from the spec (default large enough for 10,000 services x 10 endpoints in the
one-member-per-endpoint sets; a hash grows on demand, so the cap costs nothing until used).
"""
from __future__ import annotations

import functools
import ipaddress
import re
import socket
from collections.abc import Iterable
from dataclasses import dataclass
from enum import Enum

from netagent.kernel import owned
from netagent.kernel.families import IpFamily
from netagent.errors import NetagentError

OWNED_PREFIX = owned.CHAIN_PREFIX
MAX_NAME_LENGTH = 31
DEFAULT_MAX_ELEMENTS = 262144
PORT_RANGE = (0, 65535)
PROTOCOLS = frozenset({"tcp", "udp", "sctp"})
DEFAULT_PROTOCOL = "tcp"           # what ipset assumes for a bare port in hash:*,port types


class IpsetType(str, Enum):
    HASH_IP = "hash:ip"
    HASH_IP_PORT = "hash:ip,port"
    HASH_IP_PORT_IP = "hash:ip,port,ip"
    HASH_IP_PORT_NET = "hash:ip,port,net"
    HASH_NET = "hash:net"
    BITMAP_PORT = "bitmap:port"

    @property
    def is_hash(self) -> bool:
        return self.value.startswith("hash:")


class IpsetError(NetagentError):
    """A set operation that failed: bad member, wrong or busy set, or the tool's complaint."""


class IpsetNotInstalled(IpsetError):
    """The `ipset` tool is missing (so no set of ours can be listed, made or removed)."""


@dataclass(frozen=True)
class IpsetSpec:
    """A set we own. `comment` says what it is for (shown by status/cleanup; ipset has no
    set-level comment, so it is not written to the kernel). `family` is ipset's (`inet`,
    `inet6`; `IpFamily.ipset`), ignored by bitmap types."""
    name: str
    type: IpsetType
    comment: str = ""
    max_elements: int = DEFAULT_MAX_ELEMENTS
    family: str = "inet"

    def __post_init__(self) -> None:
        require_owned_name(self.name)
        object.__setattr__(self, "type", IpsetType(self.type))
        if self.family not in FAMILIES:
            raise ValueError(f"family must be one of {FAMILIES}, not {self.family!r}")
        if self.max_elements < 1:
            raise ValueError(f"max_elements must be positive, not {self.max_elements}")


@dataclass(frozen=True)
class IpsetInfo:
    """A set's header as the kernel reports it."""
    name: str
    type: IpsetType | str          # a str when the type is one we do not model
    family: str | None             # None for bitmap types
    references: int
    entries: int
    max_elements: int | None = None


@dataclass(frozen=True)
class SetContents:
    """A set as one read of everything (`Ipset.snapshot`) reports it."""
    name: str
    type: IpsetType | str
    family: str | None
    members: frozenset[str]


@dataclass(frozen=True)
class IpsetWrite:
    """One write, as `FakeIpset.writes` records it."""
    kind: str                      # "create", "update", "swap" (`removed`: the other set), "destroy"
    name: str
    added: tuple[str, ...] = ()
    removed: tuple[str, ...] = ()


def require_owned_name(name: str) -> None:
    if not name.startswith(OWNED_PREFIX):
        raise ValueError(f"set name {name!r} is not ours (prefix {OWNED_PREFIX})")
    if len(name) > MAX_NAME_LENGTH or not re.fullmatch(r"[A-Za-z0-9_.:-]+", name):
        raise ValueError(f"set name {name!r}: at most {MAX_NAME_LENGTH} characters of [A-Za-z0-9_.:-]")


FAMILIES = ("inet", "inet6")


def family_of(set_type: IpsetType, family: str = "inet") -> str | None:
    """The family a set of this type is created with and reported in (bitmaps have none)."""
    return family if set_type.is_hash else None


def spec_family(spec: IpsetSpec) -> str | None:
    return family_of(spec.type, spec.family)


def member_family(member: str) -> str:
    """The family of a canonical hash member (its first address): `inet` or `inet6`."""
    return IpFamily.of(member.partition(",")[0]).ipset


# ---- member spelling ---------------------------------------------------------------------------

_OCTET = r"(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"
_DOTTED_DECIMAL = re.compile(rf"{_OCTET}(?:\.{_OCTET}){{3}}")


def _address(text: str) -> str:
    # A regex, not ipaddress: a backend spells ~10^5 members per sync, and this is 10x faster.
    # Same rules as IPv4Address: four decimal octets 0-255 without leading zeros. A colon sends the
    # text to the IPv6 parser, which validates it (no family is taken from the colon unchecked).
    if ":" in text:
        return _address6(text)
    address = text.removesuffix("/32")
    if not _DOTTED_DECIMAL.fullmatch(address):
        raise IpsetError(f"{text!r} is not an IPv4 address")
    return address


@functools.lru_cache(maxsize=1 << 16)
def _address6(text: str) -> str:
    # inet_pton/inet_ntop, not ipaddress: a backend spells ~10^5 members per sync and this is
    # ~30x faster. Both spell RFC 5952 (as `ipset save` prints) except the embedded-IPv4 forms,
    # which inet_ntop prints dotted: those go through ipaddress.
    try:
        spelled = socket.inet_ntop(socket.AF_INET6, socket.inet_pton(socket.AF_INET6, text.removesuffix("/128")))
    except (OSError, ValueError):
        raise IpsetError(f"{text!r} is not an IP address") from None
    return str(ipaddress.IPv6Address(spelled)) if "." in spelled else spelled


def _network(text: str) -> str:
    if "/" not in text:
        return _address(text)
    return _cidr(text)


@functools.lru_cache(maxsize=4096)
def _cidr(text: str) -> str:
    try:
        network = ipaddress.ip_network(text, strict=False)
    except ValueError:
        raise IpsetError(f"{text!r} is not an IP address or network") from None
    if network.prefixlen == 0:
        raise IpsetError(f"{text!r}: a /0 network cannot be a member")
    return str(network.network_address) if network.prefixlen == network.max_prefixlen else str(network)


def _port(text: str) -> int:
    if not re.fullmatch(r"\d{1,5}", text) or not PORT_RANGE[0] <= int(text) <= PORT_RANGE[1]:
        raise IpsetError(f"{text!r} is not a port number ({PORT_RANGE[0]}-{PORT_RANGE[1]})")
    return int(text)


def _protocol_port(text: str) -> str:
    protocol, sep, port = text.partition(":")
    if not sep:
        protocol, port = DEFAULT_PROTOCOL, text
    protocol = protocol.lower()
    if protocol not in PROTOCOLS:
        raise IpsetError(f"protocol {protocol!r} is not one of {sorted(PROTOCOLS)}")
    return f"{protocol}:{_port(port)}"


def _bare_port(text: str) -> str:
    """bitmap:port takes `80` or `tcp:80` and stores 80 either way."""
    return _protocol_port(text).partition(":")[2]


@functools.lru_cache(maxsize=1 << 18)
def canonical_member(set_type: IpsetType, text: str) -> str:
    """The spelling `ipset save` prints for `text` in a set of `set_type`; IpsetError when a
    set of that type cannot hold it (or only as several members)."""
    set_type = IpsetType(set_type)
    parts = text.split(",")
    shapes = {
        IpsetType.HASH_IP: (_address,),
        IpsetType.HASH_NET: (_network,),
        IpsetType.HASH_IP_PORT: (_address, _protocol_port),
        IpsetType.HASH_IP_PORT_IP: (_address, _protocol_port, _address),
        IpsetType.HASH_IP_PORT_NET: (_address, _protocol_port, _network),
        IpsetType.BITMAP_PORT: (_bare_port,),
    }[set_type]
    if len(parts) != len(shapes):
        raise IpsetError(f"{text!r} is not a {set_type.value} member")
    return ",".join(shape(part) for shape, part in zip(shapes, parts))


def canonical_change(name: str, set_type: IpsetType, add: Iterable[str],
                     remove: Iterable[str]) -> tuple[list[str], list[str]]:
    """(add, remove) of set `name` in canonical spelling, sorted; IpsetError for a member the
    set cannot hold or one both added and removed."""
    adding = sorted({canonical_member(set_type, member) for member in add})
    removing = sorted({canonical_member(set_type, member) for member in remove})
    both = set(adding) & set(removing)
    if both:
        raise IpsetError(f"set {name}: {sorted(both)} both added and removed")
    return adding, removing


def entry(ip: str, protocol: str, port: int, *, extra_ip: str | None = None) -> str:
    """`ip,proto:port` or `ip,proto:port,extra` in canonical spelling. `protocol` may be a
    `proxy.model.Protocol` or any spelling of tcp/udp/sctp; `extra_ip` may be a network."""
    name = getattr(protocol, "value", protocol).lower()
    if name not in PROTOCOLS:
        raise IpsetError(f"protocol {name!r} is not one of {sorted(PROTOCOLS)}")
    if not isinstance(port, int) or not PORT_RANGE[0] <= port <= PORT_RANGE[1]:
        raise IpsetError(f"{port!r} is not a port number ({PORT_RANGE[0]}-{PORT_RANGE[1]})")
    member = f"{_address(ip)},{name}:{port}"
    return member if extra_ip is None else f"{member},{_network(extra_ip)}"
