"""The vocabulary of node routing: inputs, desired kernel objects, outputs, the kernel seam.

Inputs (`LocalNode`, `Peer`, `RoutingSettings`, `PeerBounds`) are built by the agent from
Node objects and its flags; `PeerBounds` says where a peer's pod CIDRs may lie at all.
Desired kernel objects (`VxlanDevice`, `IpipDevice`, `FdbEntry`, and `Route` and `Neighbour`
from `netagent/kernel/routes.py`, the CNI plugin's vocabulary too) are plain frozen values, so a plan can be compared with what a kernel dump returns using `==`,
and both kernels (real and fake) speak exactly these types. `RoutingKernel` is the seam:
the handful of operations the reconciler needs, nothing else; a refusal is
`netagent/kernel/errors.py`'s `KernelError` (the CNI plugin's too), worded by `kernel_error`.

Nothing here imports pyroute2: unit tests and the renderer stay light.
"""
from __future__ import annotations

import abc
import dataclasses
import enum
from dataclasses import dataclass, field
from datetime import datetime
from ipaddress import IPv4Address, IPv4Interface, IPv4Network, IPv6Address, IPv6Interface, IPv6Network, ip_interface
from typing import TYPE_CHECKING, Mapping, Union

from netagent.errors import NetagentError
from netagent.kernel import owned
from netagent.kernel.families import IpFamily
from netagent.kernel.errors import KernelError  # the seam's refusal (the CNI plugin's too)
from netagent.kernel.routes import Neighbour, Route  # ours name their device; routes carry our protocol

if TYPE_CHECKING:
    from netagent.noderoutes.underlay import UnderlaySnapshot

ROUTE_PROTOCOL = owned.ROUTE_PROTOCOL
DEVICE_PREFIX = owned.DEVICE_PREFIX
ENCAP_KINDS = ("vxlan", "ipip", "ip6tnl")  # link kinds of ours that cleanup and mode switches remove
IFNAMSIZ = 15


class Mode(enum.Enum):
    VXLAN = "vxlan"
    HOST_GW = "host-gw"
    IPIP = "ipip"
    AUTO = "auto"
    BGP = "bgp"  # routes learnt by BIRD (noderoutes/bgp/), admitted into main; no encapsulation


ENCAP_OVERHEAD = {Mode.VXLAN: 50, Mode.IPIP: 20, Mode.HOST_GW: 0, Mode.BGP: 0}  # outer headers per packet


OUTER_IPV6_EXTRA = 20  # an IPv6 outer header is 40 bytes, 20 more than IPv4's


def encap_overhead(mode: Mode, underlay: IpFamily = IpFamily.V4) -> int:
    """Bytes of outer headers `mode` adds over an underlay of family `underlay`."""
    overhead = ENCAP_OVERHEAD[mode]
    return overhead + OUTER_IPV6_EXTRA if overhead and underlay is IpFamily.V6 else overhead


def pod_mtu(mode: Mode, auto_encap: Mode, underlay_mtu: int, *,
            underlay_families: tuple = (IpFamily.V4,)) -> int:
    """The MTU pods must use: the underlay's, less the worst encapsulation a packet may get (over
    an IPv6 underlay, one of `underlay_families`, the outer header is 20 bytes bigger)."""
    worst = auto_encap if mode is Mode.AUTO else mode
    return underlay_mtu - max(encap_overhead(worst, family) for family in underlay_families or (IpFamily.V4,))


Address = Union[IPv4Address, IPv6Address]
Network = Union[IPv4Network, IPv6Network]


@dataclass(frozen=True)
class LocalNode:
    """This node as one family's planner sees it: `public_ip` and `underlay_network` are that
    family's underlay address and connected prefix; `pod_cidrs` of other families are ignored."""
    name: str
    public_ip: Address
    underlay_ifname: str
    underlay_network: Network  # connected prefix of the underlay address ("same subnet")
    underlay_mtu: int
    pod_cidrs: tuple  # IPv4Network | IPv6Network, ...; only the family's are routed
    vtep_mac: str | None = None  # the family's VXLAN device's MAC: random per node (`RouteManager` chooses)

    @property
    def family(self) -> IpFamily:
        """The family this node's plan routes: its underlay address's."""
        return IpFamily.of(self.public_ip)

    @property
    def tunnel_address(self) -> IPv4Interface | IPv6Interface:
        """`<first pod CIDR of the family's network address>/32` (/128 for IPv6), the
        encapsulation device's address.

        As flannel does: traffic this host originates towards remote pods leaves with a
        pod-network source address, so replies come back through the tunnel.
        """
        for cidr in self.pod_cidrs:
            if self.family.holds(cidr):
                return ip_interface(f"{cidr.network_address}/{cidr.max_prefixlen}")
        raise ValueError(f"node {self.name} has no {self.family.label} pod CIDR: an encapsulation device "
                         f"needs one for its address")


@dataclass(frozen=True)
class Peer:
    """A readable Node. `public_ip` is its IPv4 underlay address (its IPv6 one on an IPv6-only
    node), `public_ipv6` the IPv6 one; `in_family` projects it onto one family's planner."""
    name: str
    public_ip: Address
    pod_cidrs: tuple  # IPv4Network | IPv6Network, ...: at most one per family
    vtep_mac: str | None = None  # from the peer's announcement, for VXLAN
    created: datetime | None = None  # the Node's metadata.creationTimestamp (server-set), UTC
    uid: str = ""                    # the Node's metadata.uid: breaks ties between equal timestamps
    public_ipv6: IPv6Address | None = None  # netagent.io/public-ipv6
    vtep_mac6: str | None = None     # the VTEP MAC of its IPv6 VXLAN device (`na-vxlan6`)
    ipv6_problem: str = ""           # why its IPv6 announcement is unusable (IPv6 unroutable)

    def cidrs_of(self, family: IpFamily) -> tuple:
        return tuple(c for c in self.pod_cidrs if family.holds(c))

    def in_family(self, family: IpFamily) -> Peer | Refused | Pending:
        """This peer as `family`'s planner routes it (its address, CIDRs and VTEP MAC of that
        family), or why it cannot be: refused (a malformed announcement) or pending."""
        if family is IpFamily.V4:
            if not family.holds(self.public_ip):
                return Pending("no IPv4 public IP announced")
            return self if all(family.holds(c) for c in self.pod_cidrs) else \
                dataclasses.replace(self, pod_cidrs=self.cidrs_of(family))
        if self.ipv6_problem:
            return Refused(self.ipv6_problem, RefusalReason.MALFORMED, family=IpFamily.V6)
        address = self.public_ipv6 if self.public_ipv6 is not None else \
            (self.public_ip if family.holds(self.public_ip) else None)
        if address is None:
            return Pending("no IPv6 public IP announced (netagent.io/public-ipv6)")
        return dataclasses.replace(self, public_ip=address, pod_cidrs=self.cidrs_of(family),
                                   vtep_mac=self.vtep_mac6, public_ipv6=None, vtep_mac6=None)

    @property
    def seniority(self) -> tuple:
        """Sort key of conflict resolution: the older Node keeps a claim, so a newcomer can never
        take a pod CIDR, VTEP MAC or public IP from a Node that holds it. A Node without a readable
        timestamp is the youngest; ties go by uid, then name (the same order on every node)."""
        return (self.created is None, self.created or _EPOCH, self.uid, self.name)


_EPOCH = datetime(1970, 1, 1).astimezone()


@dataclass(frozen=True)
class PeerBounds:
    """Where peers' pod CIDRs may lie: inside `cluster_cidrs` (`--cluster-cidr`), and clear of
    every `reserved` range, each named for the refusal (the service range, this node's own
    underlay subnets). A peer outside them would have the overlay swallow traffic meant for
    the metadata service, Services or the node's own neighbours."""
    cluster_cidrs: tuple  # IPv4Network | IPv6Network, ...: the planner uses its own family's
    reserved: tuple = ()  # (network, "what it is"), ...
    # (network, "what it is"), ... no pod CIDR may hold, though a Node's public IP may be it: the
    # API server's addresses (it may run on a node, whose Node then rightly announces it)
    outside_pod_cidrs: tuple = ()


class ChecksumOffload(enum.Enum):
    """`tx-checksum-ip-generic` on the VXLAN device. Off is the old workaround (flannel, Calico
    before 5.7) for a netfilter bug that corrupted encapsulated UDP checksums; it also turns off
    segmentation offload and costs about 5x in throughput here, so the agent chooses ON on
    kernels >= 5.7 unless the node is behind NAT (`ChecksumOffloadPolicy.AUTO`, the default)."""
    ON = "on"
    OFF = "off"


@dataclass(frozen=True)
class RoutingSettings:
    mode: Mode
    auto_encap: Mode = Mode.VXLAN  # the encapsulation `auto` uses across subnets
    vxlan_vni: int = 1
    vxlan_port: int = 4789
    vxlan_checksum_offload: ChecksumOffload = ChecksumOffload.OFF
    vxlan_ifname: str = owned.VXLAN_DEVICE
    ipip_ifname: str = owned.IPIP_DEVICE
    vxlan6_ifname: str = owned.VXLAN6_DEVICE  # the IPv6 overlay's device, over the IPv6 underlay
    ipip6_ifname: str = owned.IPIP6_DEVICE    # IPIP's IPv6 form (ip6tnl), over the IPv6 underlay

    def __post_init__(self) -> None:
        if self.auto_encap not in (Mode.VXLAN, Mode.IPIP):
            raise ValueError(f"auto_encap must be vxlan or ipip, not {self.auto_encap.value}")
        if not 1 <= self.vxlan_vni < 1 << 24:
            raise ValueError(f"vxlan_vni {self.vxlan_vni} is outside 1..16777215")
        if not 1 <= self.vxlan_port <= 65535:
            raise ValueError(f"vxlan_port {self.vxlan_port} is outside 1..65535")
        names = (self.vxlan_ifname, self.ipip_ifname, self.vxlan6_ifname, self.ipip6_ifname)
        for name in names:
            if not name.startswith(DEVICE_PREFIX) or len(name) > IFNAMSIZ:
                raise ValueError(f"device name {name!r} must start with {DEVICE_PREFIX!r} and have at "
                                 f"most {IFNAMSIZ} characters")
        if len(set(names)) != len(names):
            raise ValueError("vxlan_ifname, ipip_ifname, vxlan6_ifname and ipip6_ifname must differ")

    @property
    def encap(self) -> Mode | None:
        """The encapsulation whose device this mode needs (None for host-gw)."""
        if self.mode is Mode.AUTO:
            return self.auto_encap
        return None if self.mode in (Mode.HOST_GW, Mode.BGP) else self.mode


# ---------------------------------------------------------------- desired kernel objects

@dataclass(frozen=True)
class VxlanDevice:
    ifname: str
    vni: int
    port: int
    local: Address  # the underlay address of the device's family (IPv6: `na-vxlan6`)
    underlay_ifname: str
    mac: str
    mtu: int
    address: IPv4Interface | IPv6Interface  # <first pod CIDR's network address>/32 (/128)
    tx_checksum: bool = False  # tx-checksum-ip-generic wanted on (see ChecksumOffload)


IPPROTO_IPV6 = 41  # ip6tnl's mode ip6ip6: IPv6 inside IPv6


@dataclass(frozen=True)
class IpipDevice:
    """`na-ipip` (kind ipip) over an IPv4 `local` with no remote, or `na-ipip6` (kind ip6tnl,
    external, mode ip6ip6) for an IPv6 `local`, whose routes carry the outer addresses (routing/ipip.py)."""
    ifname: str
    local: Address
    mtu: int
    address: IPv4Interface | IPv6Interface

    @property
    def kind(self) -> str:
        return "ipip" if IpFamily.V4.holds(self.local) else "ip6tnl"


@dataclass(frozen=True)
class FdbEntry:
    """A VXLAN forwarding entry `mac dst dst dev ifname self permanent`."""
    mac: str
    dst: Address
    ifname: str


KernelObject = Route | Neighbour | FdbEntry


@dataclass(frozen=True)
class PeerPlan:
    """What one peer needs, in programming order: neighbours, then FDB, then routes."""
    name: str
    mode: Mode  # the concrete mode used for this peer (never AUTO)
    neighbours: tuple = ()
    fdb: tuple = ()
    routes: tuple = ()

    def objects(self) -> tuple:
        return self.neighbours + self.fdb + self.routes


@dataclass(frozen=True)
class Pending:
    """The peer cannot be programmed yet (e.g. no VTEP MAC announced); not an error."""
    reason: str


class RefusalReason(enum.Enum):
    """Why a Node is not routed: the short label of its rejection (a metric label)."""
    MALFORMED = "malformed"                        # unreadable or wrongly typed fields
    TOO_LARGE = "too-large"                        # an annotation over its size or depth bound
    OUTSIDE_CLUSTER_CIDR = "outside-cluster-cidr"  # a pod CIDR not inside --cluster-cidr
    RESERVED = "reserved"                          # a pod CIDR over the service range or our networks
    OVERLAP = "overlap"                            # a pod CIDR over this node's or an older peer's
    CONFLICT = "conflict"                          # our / an older peer's public IP or VTEP MAC
    UNROUTABLE = "unroutable"                      # the mode cannot reach it (host-gw across subnets)


@dataclass(frozen=True)
class Refused:
    """The peer must not be programmed (e.g. host-gw across subnets); an operator should look.
    `family`: the family whose planner refused it (None: the Node as a whole, or not yet known:
    the agent sets it when merging its families' reports)."""
    reason: str
    label: RefusalReason = RefusalReason.UNROUTABLE
    family: IpFamily | None = None

    @property
    def detail(self) -> str:
        """The reason as an operator reads it: an IPv6 refusal says so (IPv4 is the default)."""
        return f"{self.family.label}: {self.reason}" if self.family is IpFamily.V6 else self.reason


@dataclass(frozen=True)
class Plan:
    devices: tuple  # VxlanDevice | IpipDevice
    peers: Mapping[str, PeerPlan]
    refused: Mapping[str, Refused] = field(default_factory=dict)
    pending: Mapping[str, str] = field(default_factory=dict)
    ignored_ipv6: tuple = ()  # "peer cidr" strings


@dataclass
class SyncReport:
    added: int = 0  # kernel objects (routes, neighbours, FDB entries) created or replaced
    removed: int = 0
    unchanged: int = 0
    refused: dict = field(default_factory=dict)  # peer -> Refused (why, and its label)
    pending: list = field(default_factory=list)
    peers_by_mode: dict = field(default_factory=dict)  # "host-gw" / "vxlan" / "ipip" -> count


# ---------------------------------------------------------------- the kernel seam

class DeviceChange(enum.Enum):
    UNCHANGED = "unchanged"
    REPAIRED = "repaired"  # attributes fixed in place: the objects on it survived
    EMPTIED = "emptied"    # (re)created, or its MAC changed (the kernel then flushes its
                           # neighbours, permanent ones too): treat everything on it as gone


@dataclass(frozen=True)
class ObservedDevice:
    """A link as a kernel reports it; the fields the drift check compares."""
    ifname: str
    kind: str
    mtu: int
    up: bool
    mac: str | None = None
    addresses: frozenset = frozenset()  # IPv4Interface | IPv6Interface (IPv6 link-local ones not listed)
    vni: int | None = None
    port: int | None = None
    local: Address | None = None
    remote: Address | None = None
    underlay_ifname: str | None = None
    learning: bool | None = None
    tx_checksum: bool | None = None  # tx-checksum-ip-generic; None when not changeable
    proto: int | None = None         # ip6tnl: the inner protocol it carries (41, ip6ip6; 0 any)
    external: bool | None = None     # ip6tnl: collect_md, outer addresses from each route's encap


def kernel_error(code: int, message: str) -> KernelError:
    """A kernel operation failed, in node routing's words: `message` then the errno, which
    `code` carries too (`netagent/kernel/errors.py`'s one `KernelError`, the CNI plugin's too)."""
    return KernelError(code, f"{message} (errno {code})")


class RoutingApplyError(NetagentError):
    """Some kernel writes failed; everything else was applied. A full sync retries them."""

    def __init__(self, failures: Mapping[str, str], report: SyncReport) -> None:
        listed = "; ".join(f"{what}: {why}" for what, why in sorted(failures.items())[:5])
        more = f"; and {len(failures) - 5} more" if len(failures) > 5 else ""
        super().__init__(f"{len(failures)} routing change(s) failed: {listed}{more}")
        self.failures = dict(failures)
        self.report = report


class RoutingKernel(abc.ABC):
    """The operations the reconciler needs, and the one read the agent chooses its underlay
    from; deletes of something already gone succeed."""

    protocol: int  # the route protocol number that marks routes as ours

    @abc.abstractmethod
    def underlay_snapshot(self) -> UnderlaySnapshot:
        """The namespace's links, their IPv4 and global IPv6 addresses and default routes."""

    def addresses_changed(self) -> bool:
        """Whether links or addresses may have changed since the last call (so a new
        `underlay_snapshot` is worth its cost); a kernel that cannot tell says True."""
        return True

    @abc.abstractmethod
    def links_with_prefix(self, prefix: str) -> dict[str, str]:
        """Our links: name -> kind."""

    @abc.abstractmethod
    def delete_link(self, ifname: str) -> None: ...

    @abc.abstractmethod
    def observe(self, ifname: str) -> ObservedDevice | None:
        """The link as the kernel reports it, or None when there is none."""

    @abc.abstractmethod
    def ensure_vxlan(self, device: VxlanDevice) -> DeviceChange: ...

    @abc.abstractmethod
    def ensure_ipip(self, device: IpipDevice) -> DeviceChange: ...

    @abc.abstractmethod
    def dump_routes(self, family: IpFamily = IpFamily.V4) -> list[Route]:
        """Ours: main table, our protocol, of `family`."""

    @abc.abstractmethod
    def replace_route(self, route: Route) -> None: ...

    @abc.abstractmethod
    def delete_route(self, route: Route) -> None:
        """Matched by destination and our protocol."""

    @abc.abstractmethod
    def dump_neighbours(self, ifname: str, family: IpFamily = IpFamily.V4) -> list[Neighbour]:
        """Permanent entries of `family`."""

    @abc.abstractmethod
    def replace_neighbour(self, neighbour: Neighbour) -> None: ...

    @abc.abstractmethod
    def delete_neighbour(self, neighbour: Neighbour) -> None: ...

    @abc.abstractmethod
    def dump_fdb(self, ifname: str) -> list[FdbEntry]: ...

    @abc.abstractmethod
    def replace_fdb(self, entry: FdbEntry) -> None: ...

    @abc.abstractmethod
    def delete_fdb(self, entry: FdbEntry) -> None: ...
