"""The CNI plugin's kernel seam: `CniKernel`, the few kernel operations ADD, DEL, CHECK and GC need.

`cni.handlers` decides what an attachment is and in which order it is built and undone;
a `CniKernel` only carries out one step at a time. Two implementations speak these types:
`cni.netlink_kernel.NetlinkCniKernel` (the real kernel, through `cni.rtnl` and pyroute2)
and `cni.fake_kernel.FakeCniKernel` (memory, with fault injection), so rollback, CHECK and
GC are unit-tested without root.

Why the operations are this coarse: the pod side of an ADD is one batched netlink write
(`configure_pod` takes the whole `PodSetup`), as is the node side in routed mode
(`route_to_pod`). Splitting them into per-address and per-route calls would cost one
system call each on the hot path. Everything that is policy (names, MACs, which routes, the
CNI result, CHECK's verdict) is computed outside, as plain values (`cni.wiring`,
`cni.check`); routes and neighbours are `netagent/kernel/routes.py`'s, node routing's too.

Errors: a kernel refusal is a `KernelError` (`netagent/kernel/errors.py`, node routing's too)
carrying the errno (`LinkExists` when a name is taken at creation). Conditions the CNI spec
gives a code of their own come out as `CniError` already: a missing pod namespace (3), a
path that is not a namespace (4), a non-bridge under the bridge's name (7). Deleting what is
already gone succeeds.
"""
from __future__ import annotations

import abc
import errno
from dataclasses import dataclass
from ipaddress import IPv4Interface, IPv6Interface

from cni.errors import CniError, ErrorCode
from netagent.kernel.errors import KernelError  # the kernel's refusal: `code` the errno, `str()` its own words
from netagent.kernel.families import IpFamily
from netagent.kernel.routes import Address, Neighbour, Network, Route  # a request's routes: ifname left empty

Interface = IPv4Interface | IPv6Interface


class LinkExists(KernelError):
    """Creating the veth pair failed because `name` (the host end or the pod end) is taken."""

    def __init__(self, name: str, message: str = "File exists") -> None:
        super().__init__(errno.EEXIST, message)
        self.name = name


def netns_missing(path: str) -> CniError:
    return CniError(ErrorCode.CONTAINER_UNKNOWN, f"network namespace {path} does not exist")


def not_a_bridge(name: str) -> CniError:
    return CniError(ErrorCode.INVALID_CONFIG, f"{name} exists and is not a bridge")


# ---------------------------------------------------------------- what goes in

@dataclass(frozen=True)
class PodNetns:
    """An open handle on the pod's network namespace; `close_netns` releases it."""
    path: str
    fd: int


@dataclass(frozen=True)
class LinkSetting:
    """One per-interface sysctl, `/proc/sys/net/ipv4|ipv6/conf/<interface>/<key>`, for the
    interface its request names (`PodSetup.ifname`, a host veth, the bridge). Kept apart from
    the name, since an interface name may hold a dot that `sysctl`'s dotted keys cannot."""
    family: IpFamily
    key: str
    value: str

    def path(self, ifname: str) -> str:
        return f"net/ipv{self.family.value}/conf/{ifname}/{self.key}"


@dataclass(frozen=True)
class VethPair:
    """The pair as created: the host end up and aliased, the pod end down, inside the pod."""
    host_name: str
    pod_ifname: str
    mtu: int
    host_mac: str
    pod_mac: str
    alias: str


@dataclass(frozen=True)
class BridgeSpec:
    name: str
    mtu: int
    gateways: tuple[Interface, ...]  # gateway address with the subnet's prefix length
    settings: tuple[LinkSetting, ...] = ()  # written before the gateways are added


@dataclass(frozen=True)
class Bridge:
    name: str
    index: int
    mac: str


@dataclass(frozen=True)
class PodSetup:
    """The pod side: `settings` on `ifname` while it is down (IPv6: no DAD, no RAs), then one
    write: lo up, `addresses` on `ifname`, `ifname` up, then `routes` in order (a gateway must
    be reachable through an earlier one) and `neighbours`."""
    ifname: str
    addresses: tuple[Interface, ...]  # with the prefix length the pod gets
    routes: tuple[Route, ...]
    neighbours: tuple[Neighbour, ...] = ()
    settings: tuple[LinkSetting, ...] = ()


@dataclass(frozen=True)
class NodeRoutes:
    """Routed mode, the node side in one write: the host end's own addresses (IPv6: the pod's
    link-local gateway, without DAD), link routes to the pod and its pinned MAC."""
    host_name: str
    routes: tuple[Route, ...]
    neighbours: tuple[Neighbour, ...]
    addresses: tuple[Interface, ...] = ()


# ---------------------------------------------------------------- what comes out

@dataclass(frozen=True)
class PodInterface:
    """The pod's interface as the kernel reports it (CHECK)."""
    ifname: str
    mac: str
    up: bool
    addresses: frozenset[Interface]
    routes: frozenset[Route]  # main table, out of this interface


@dataclass(frozen=True)
class HostVeth:
    """The host end as the kernel reports it (CHECK)."""
    name: str
    up: bool
    master: str | None  # the bridge it is a port of
    routes: frozenset[Network]  # destinations of main-table routes out of it
    addresses: frozenset[Interface] = frozenset()


@dataclass(frozen=True)
class OwnedLink:
    """A node link carrying one of our aliases (`netagent:<network>` or `netagent-bridge`)."""
    name: str
    kind: str  # "veth", "bridge", ... ("" when the kernel gives none)
    alias: str


# ---------------------------------------------------------------- the seam

class CniKernel(abc.ABC):
    """The kernel operations of ADD, DEL, CHECK and GC, in the node's namespace unless a
    `PodNetns` says otherwise. One instance serves concurrent requests (the agent's workers)."""

    # ------------------------------------------------------------ the pod's namespace
    @abc.abstractmethod
    def open_netns(self, path: str) -> PodNetns:
        """Open the namespace at `path`; CniError 3 when it does not exist, 4 when unusable."""

    @abc.abstractmethod
    def close_netns(self, netns: PodNetns) -> None: ...

    # ------------------------------------------------------------ links
    @abc.abstractmethod
    def create_veth(self, pair: VethPair, netns: PodNetns, *, master: Bridge | None = None) -> bool:
        """Create the pair with its pod end born inside `netns`; True when the host end was
        enslaved to `master` at creation (a stale `master` is not an error: False).
        `LinkExists` when either name is taken; nothing is left behind then."""

    @abc.abstractmethod
    def delete_link(self, name: str) -> bool:
        """Delete a node link (a veth takes its peer, routes and neighbours along);
        False when it was already gone."""

    @abc.abstractmethod
    def owned_links(self) -> list[OwnedLink]:
        """The node's links carrying an alias of ours (GC, `netagent cleanup`)."""

    # ------------------------------------------------------------ bridge mode
    @abc.abstractmethod
    def known_bridge(self, name: str) -> Bridge | None:
        """The bridge as this kernel object last ensured it, without asking the kernel
        (it may be stale); None before the first `ensure_bridge`."""

    @abc.abstractmethod
    def ensure_bridge(self, spec: BridgeSpec) -> Bridge:
        """Create or repair the bridge (up, aliased, holding the gateways); may answer from
        what it ensured before. CniError 7 when a non-bridge has the name."""

    @abc.abstractmethod
    def forget_bridge(self, name: str) -> None:
        """Drop what `known_bridge`/`ensure_bridge` remember: the next ADD repairs."""

    @abc.abstractmethod
    def attach_to_bridge(self, host_name: str, bridge: Bridge) -> None: ...

    @abc.abstractmethod
    def set_hairpin(self, host_name: str) -> None: ...

    # ------------------------------------------------------------ the pod side
    @abc.abstractmethod
    def configure_pod(self, netns: PodNetns, setup: PodSetup) -> None: ...

    # ------------------------------------------------------------ the node side (routed mode)
    @abc.abstractmethod
    def enable_forwarding(self, family: IpFamily) -> None:
        """IP forwarding of `family` in the node's namespace."""

    @abc.abstractmethod
    def set_link_settings(self, name: str, settings: tuple[LinkSetting, ...]) -> None:
        """Per-interface sysctls of a node link (routed IPv4: proxy ARP; IPv6: no RAs, ...),
        in order; a `KernelError` with the errno when one cannot be written."""

    @abc.abstractmethod
    def route_to_pod(self, routes: NodeRoutes) -> None: ...

    # ------------------------------------------------------------ reading back (CHECK)
    @abc.abstractmethod
    def read_pod_interface(self, netns: PodNetns, ifname: str) -> PodInterface | None: ...

    @abc.abstractmethod
    def read_host_veth(self, name: str) -> HostVeth | None: ...
