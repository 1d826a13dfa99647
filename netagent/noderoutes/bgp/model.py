"""The BGP backend's configuration as typed, validated, frozen values.

Everything that reaches BIRD's configuration text is first one of these values: an AS number
is an `int` checked against 1..4294967295, an address or a prefix an `ipaddress` object, a
peer's role a `PeerRole`, a password a `str` checked by `check_password` (the one judge of what
BIRD's string syntax can carry). The agent builds them from the cluster (Nodes, the topology
ConfigMap, flags) and `bird_config.py` renders them; so a value that reached the renderer has
already been parsed into its type, and a cluster string is never pasted into the text.

Construction refuses what BIRD would refuse or misread (`BgpConfigError`, a `ValueError`), so
a bad value is found where it is parsed, with a reason, not when BIRD rejects the file.
"""
from __future__ import annotations

import enum
import re
from dataclasses import dataclass, field
from ipaddress import IPv4Address, IPv4Network, IPv6Address, IPv6Network

from netagent.errors import NetagentError
from netagent.kernel import owned

Address = IPv4Address | IPv6Address
Network = IPv4Network | IPv6Network

AS_MIN, AS_MAX = 1, 4294967295
MAX_PASSWORD_CHARS = 80      # TCP_MD5SIG_MAXKEYLEN: the kernel refuses a longer key
MAX_PEERS = 4096             # a bound on one node's sessions (full mesh of a large cluster)
MAX_PREFIXES = 65536         # a bound on one filter's prefix set
_PASSWORD = re.compile(r"^[\x20-\x7e]+$")  # printable ASCII; '"' and '\\' refused separately
_NAME = re.compile(r"^[a-z][a-z0-9_]{0,63}$")  # every symbol we generate for BIRD


class BgpConfigError(NetagentError, ValueError):
    """A BGP setting that is not usable: the message says which and why."""


class PeerRole(enum.Enum):
    """What the peer is to this node.

    MESH: an iBGP peer of the node-to-node full mesh. REFLECTOR_CLIENT: an iBGP peer this node
    reflects to (this node is a route reflector; `rr client`). REFLECTOR: an iBGP route reflector
    this node peers with (this node is its client, or a fellow reflector). EXTERNAL: a router
    outside the cluster (a top-of-rack router), usually eBGP.
    """
    MESH = "mesh"
    REFLECTOR_CLIENT = "reflector-client"
    REFLECTOR = "reflector"
    EXTERNAL = "external"


def check_as_number(value: object, *, what: str = "AS number") -> int:
    """`value` as an AS number (1..4294967295), or `BgpConfigError`. Booleans are refused."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise BgpConfigError(f"{what} must be an integer, not {type(value).__name__}")
    if not AS_MIN <= value <= AS_MAX:
        raise BgpConfigError(f"{what} {value} is outside {AS_MIN}..{AS_MAX}")
    return value


def check_password(value: object) -> str:
    """`value` if BIRD's string syntax can carry it unchanged, else `BgpConfigError`.

    BIRD's lexer reads a string up to the next '"' with no escapes and no newline, so a '"',
    a backslash or a control character could end the string or change its meaning: refused,
    never rewritten (a rewritten password would silently differ from the peer's).
    """
    if not isinstance(value, str):
        raise BgpConfigError(f"password must be a string, not {type(value).__name__}")
    if not value:
        raise BgpConfigError("password is empty")
    if len(value) > MAX_PASSWORD_CHARS:
        raise BgpConfigError(f"password has {len(value)} characters; at most {MAX_PASSWORD_CHARS}")
    if not _PASSWORD.match(value) or '"' in value or "\\" in value:
        raise BgpConfigError('password may hold printable ASCII only, without \'"\' or \'\\\'')
    return value


def check_name(value: str) -> str:
    """A symbol we generate for BIRD (protocol, filter, table): lowercase, digits, '_'."""
    if not isinstance(value, str) or not _NAME.match(value):
        raise BgpConfigError(f"{value!r} is not a valid BIRD symbol of ours")
    return value


def _check_int(value: object, low: int, high: int, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise BgpConfigError(f"{what} must be an integer in {low}..{high}, not {value!r}")
    return value


def _check_networks(values: object, what: str) -> tuple:
    if not isinstance(values, tuple) or not all(isinstance(v, (IPv4Network, IPv6Network)) for v in values):
        raise BgpConfigError(f"{what} must be a tuple of IPv4Network/IPv6Network")
    if len(values) > MAX_PREFIXES:
        raise BgpConfigError(f"{what} holds {len(values)} prefixes; at most {MAX_PREFIXES}")
    return values


@dataclass(frozen=True)
class Timers:
    """BGP session timers in seconds (RFC 4271: hold 0 or >= 3; keepalive below hold)."""
    hold: int = 90
    keepalive: int = 30
    connect_retry: int = 5
    # from a session's start (a new peer, a BIRD start) to its first connect attempt; BIRD's
    # default is 5 s, which alone made a new Node take 3-5 s to be routed (bench/bgp.py). BIRD
    # randomises it to 0.75-1x; 0 would mean never connecting actively, so 1 is the floor.
    connect_delay: int = 1

    def __post_init__(self) -> None:
        _check_int(self.hold, 3, 65535, "hold time")
        _check_int(self.keepalive, 1, 65535, "keepalive time")
        _check_int(self.connect_retry, 1, 65535, "connect retry time")
        _check_int(self.connect_delay, 1, 65535, "connect delay time")
        if self.keepalive >= self.hold:
            raise BgpConfigError(f"keepalive time {self.keepalive} must be below hold time {self.hold}")


@dataclass(frozen=True)
class GracefulRestart:
    """RFC 4724: peers keep our routes `restart_time` seconds while our BIRD comes back, and
    BIRD started with `-R` keeps the kernel's routes until its sessions have re-converged
    (or `wait` seconds passed)."""
    enabled: bool = True
    restart_time: int = 120
    wait: int = 240

    def __post_init__(self) -> None:
        _check_int(self.restart_time, 1, 4095, "graceful restart time")  # 12 bits on the wire
        _check_int(self.wait, 1, 3600, "graceful restart wait")


@dataclass(frozen=True)
class Bfd:
    """BFD (RFC 5880) timers in milliseconds; a session is down after `multiplier` misses."""
    min_rx_ms: int = 100
    min_tx_ms: int = 100
    multiplier: int = 3

    def __post_init__(self) -> None:
        _check_int(self.min_rx_ms, 10, 60000, "BFD min rx interval")
        _check_int(self.min_tx_ms, 10, 60000, "BFD min tx interval")
        _check_int(self.multiplier, 1, 255, "BFD multiplier")


@dataclass(frozen=True)
class BgpPeer:
    """One BGP session. `accept` is the exact prefixes this peer may announce to us (the
    import filter: built from the cluster's view, never "all")."""
    address: Address
    asn: int
    role: PeerRole
    accept: tuple = ()                # IPv4Network | IPv6Network, matched exactly
    password: str | None = None
    bfd: bool = False
    multihop: int | None = None       # TTL for a peer that is not on our link; None: direct

    def __post_init__(self) -> None:
        if not isinstance(self.address, (IPv4Address, IPv6Address)):
            raise BgpConfigError(f"peer address must be an IPv4Address/IPv6Address, not {self.address!r}")
        if self.address.is_unspecified or self.address.is_multicast or self.address.is_loopback:
            raise BgpConfigError(f"peer address {self.address} is not a unicast address")
        check_as_number(self.asn, what="peer AS number")
        if not isinstance(self.role, PeerRole):
            raise BgpConfigError(f"peer role must be a PeerRole, not {self.role!r}")
        _check_networks(self.accept, "accepted prefixes")
        if self.password is not None:
            check_password(self.password)
        if self.multihop is not None:
            _check_int(self.multihop, 2, 255, "multihop TTL")

    @property
    def name(self) -> str:
        """The BIRD protocol name, generated from the address alone."""
        text = str(self.address).replace(".", "_").replace(":", "_")
        return check_name(f"peer{self.address.version}_{text}")


@dataclass(frozen=True)
class BgpNodeConfig:
    """Everything one node's BIRD runs: identity, what it announces, its sessions.

    `own_cidrs` are announced (with a blackhole route, so an unknown local address is dropped
    rather than sent to the default route); `reflected` are the other nodes' prefixes a route
    reflector passes on to its clients; learnt routes are exported to the kernel routing table
    `kernel_table` (ours, `owned.BGP_ROUTE_TABLE`), from which the agent admits them into main.
    """
    router_id: IPv4Address
    local_address: Address
    asn: int
    own_cidrs: tuple                  # IPv4Network | IPv6Network
    peers: tuple = ()                 # BgpPeer, ...
    reflected: tuple = ()             # IPv4Network | IPv6Network (a reflector's clients' prefixes)
    rr_cluster_id: IPv4Address | None = None  # set: this node is a route reflector
    timers: Timers = field(default_factory=Timers)
    graceful_restart: GracefulRestart = field(default_factory=GracefulRestart)
    bfd: Bfd = field(default_factory=Bfd)
    kernel_table: int = owned.BGP_ROUTE_TABLE
    scan_time: int = 10               # seconds between the kernel protocol's table scans

    def __post_init__(self) -> None:
        if not isinstance(self.router_id, IPv4Address) or self.router_id.is_unspecified:
            raise BgpConfigError(f"router id must be a non-zero IPv4Address, not {self.router_id!r}")
        if not isinstance(self.local_address, (IPv4Address, IPv6Address)):
            raise BgpConfigError(f"local address must be an address, not {self.local_address!r}")
        check_as_number(self.asn)
        _check_networks(self.own_cidrs, "own CIDRs")
        _check_networks(self.reflected, "reflected prefixes")
        if not isinstance(self.peers, tuple) or not all(isinstance(p, BgpPeer) for p in self.peers):
            raise BgpConfigError("peers must be a tuple of BgpPeer")
        if len(self.peers) > MAX_PEERS:
            raise BgpConfigError(f"{len(self.peers)} peers; at most {MAX_PEERS}")
        names = [p.name for p in self.peers]
        if len(set(names)) != len(names):
            raise BgpConfigError("two peers share an address")
        if any(p.address == self.local_address for p in self.peers):
            raise BgpConfigError(f"a peer has this node's own address {self.local_address}")
        if self.rr_cluster_id is not None and not isinstance(self.rr_cluster_id, IPv4Address):
            raise BgpConfigError(f"route reflector cluster id must be an IPv4Address, not {self.rr_cluster_id!r}")
        if self.rr_cluster_id is None and any(p.role is PeerRole.REFLECTOR_CLIENT for p in self.peers):
            raise BgpConfigError("a peer is a reflector client but this node is no route reflector")
        _check_int(self.kernel_table, 1, 0xFFFFFFFF, "kernel table")
        if self.kernel_table in (253, 254, 255):
            raise BgpConfigError(f"kernel table {self.kernel_table} is one of the kernel's own (default, main, local)")
        _check_int(self.scan_time, 1, 3600, "scan time")

    @property
    def is_reflector(self) -> bool:
        return self.rr_cluster_id is not None

    @property
    def uses_bfd(self) -> bool:
        return any(p.bfd for p in self.peers)
