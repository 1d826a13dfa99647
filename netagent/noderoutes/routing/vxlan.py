"""The VXLAN backend: one tunnel device, and per peer a neighbour, an FDB entry and a route.

Why everything is static. Every node already learns every peer's three facts from the API
(pod CIDR, underlay address, VTEP MAC in the peer's announcement), so the kernel is told
them up front instead of discovering them: no multicast group, no flooding, no learning
(`nolearning`, so a spoofed inner source MAC cannot redirect traffic). For a peer we write

    neigh  <peer CIDR network address> lladdr <peer VTEP MAC> dev na-vxlan  (permanent)
    fdb    <peer VTEP MAC> dst <peer public IP> dev na-vxlan                 (self, permanent)
    route  <peer CIDR> via <peer CIDR network address> dev na-vxlan onlink

in that order, so by the time the route exists the next hop resolves without ARP and the
MAC resolves to an underlay destination: the first packet is never dropped. The gateway
is the peer CIDR's network address, which is also the address the peer puts on its own
VXLAN device; `onlink` because no connected prefix on na-vxlan contains it.

The VTEP MAC is random per node (`random_vtep_mac`: locally administered, unicast, from the
system's CSPRNG), chosen by the `RouteManager` when it is built: the MAC of our device already
in the kernel when there is one (a restarted agent keeps what the peers have in their FDBs: the
node's state is the device itself), a fresh one otherwise (first start, after a reboot: it is
announced on the Node as before and peers follow). It used to be a hash of the node name, so an
older Node could compute a future node's MAC, announce it first and, older Node winning a
conflict, keep the newcomer out of every FDB (issue 29, item 11); a random MAC cannot be known
before its node announces it. `vtep_mac(name)` stays as a name-derived MAC for tests and tools.
A peer that has not announced its MAC yet is pending; one whose announced MAC is malformed is
refused.

MTU is the underlay's less 50 bytes (outer IPv4 20, UDP 8, VXLAN 8, inner Ethernet 14).

IPv6 pods: a second device, `na-vxlan6`, whose underlay is IPv6 (as flannel's `flannel-v6.1`).
Each family's planner renders its own device over its own underlay address: the IPv4 overlay
over `na-vxlan` and the IPv4 underlay, the IPv6 overlay over `na-vxlan6` and the IPv6 underlay,
with the same VNI and port (the kernel tells the two sockets apart by family). Why not carry
IPv6 pods inside the IPv4 device: an IPv6-only cluster has no IPv4 underlay at all, and one
rule ("a family's overlay rides that family's underlay") serves dual-stack and IPv6-only
alike, with per-family neighbour (NDP), FDB and route entries. Its MTU is 20 bytes lower
(the outer IPv6 header is 40 bytes: underlay - 70), its VTEP MAC chosen the same way, announced as `vtepMAC6` in the backend data, and its address the IPv6 pod CIDR's
network address /128.
"""
from __future__ import annotations

import functools
import hashlib
import re
import secrets

from netagent.kernel.families import IpFamily
from netagent.noderoutes.routing.model import (
    ChecksumOffload,
    FdbEntry,
    LocalNode,
    Mode,
    Neighbour,
    Peer,
    PeerPlan,
    Pending,
    RefusalReason,
    Refused,
    Route,
    RoutingSettings,
    VxlanDevice,
    encap_overhead,
)

_MAC = re.compile(r"[0-9a-f]{2}(:[0-9a-f]{2}){5}")


def _unicast_local(raw: bytearray) -> str:
    raw[0] = (raw[0] & 0xFC) | 0x02   # locally administered, unicast
    return ":".join(f"{b:02x}" for b in raw)


def vtep_mac(node_name: str, family: IpFamily = IpFamily.V4) -> str:
    """A MAC derived from a name (tests and tools): never a node's own, which is random."""
    salt = b"netagent-vtep\0" if family is IpFamily.V4 else b"netagent-vtep6\0"
    return _unicast_local(bytearray(hashlib.sha256(salt + node_name.encode()).digest()[:6]))


def random_vtep_mac() -> str:
    """A fresh VTEP MAC no other node can know in advance: locally administered, unicast."""
    return _unicast_local(bytearray(secrets.token_bytes(6)))


def is_vtep_mac(text: str | None) -> bool:
    """`text` is a MAC we could have chosen: unicast and locally administered (a device of ours
    whose MAC is otherwise, e.g. set by hand, gets a fresh one)."""
    mac = normalize_mac(text) if text else None
    return mac is not None and bool(int(mac[:2], 16) & 0x02)


@functools.lru_cache(maxsize=8192)  # called for every peer on every render; strings hash cheaply
def normalize_mac(text: str) -> str | None:
    """Lower-case colon form of a unicast MAC, or None when `text` is not one."""
    mac = text.strip().lower().replace("-", ":")
    if not _MAC.fullmatch(mac) or int(mac[:2], 16) & 0x01 or mac == "00:00:00:00:00:00":
        return None
    return mac


def vxlan_ifname(settings: RoutingSettings, family: IpFamily) -> str:
    return settings.vxlan_ifname if family is IpFamily.V4 else settings.vxlan6_ifname


def render_vxlan_device(local: LocalNode, settings: RoutingSettings) -> VxlanDevice:
    family, address = local.family, local.tunnel_address   # no pod CIDR of the family: said first
    return VxlanDevice(ifname=vxlan_ifname(settings, family), vni=settings.vxlan_vni, port=settings.vxlan_port,
                       local=local.public_ip, underlay_ifname=local.underlay_ifname,
                       mac=_own_mac(local), mtu=local.underlay_mtu - encap_overhead(Mode.VXLAN, family),
                       address=address,
                       tx_checksum=settings.vxlan_checksum_offload is ChecksumOffload.ON)


def _own_mac(local: LocalNode) -> str:
    if local.vtep_mac is None:
        raise ValueError("no VTEP MAC chosen for this node (RouteManager chooses one)")
    return local.vtep_mac


def render_vxlan_peer(peer: Peer, cidrs: tuple, settings: RoutingSettings) -> PeerPlan | Pending | Refused:
    """The peer's objects over VXLAN for its `cidrs` (of the family of its projected public IP, see
    `Peer.in_family`); pending until it has a VTEP MAC."""
    family = IpFamily.of(peer.public_ip)
    if peer.vtep_mac is None:
        return Pending("no VTEP MAC announced yet (vxlan)" if family is IpFamily.V4 else
                       "no IPv6 VTEP MAC announced yet (vxlan, vtepMAC6)")
    mac = normalize_mac(peer.vtep_mac)
    if mac is None:
        return Refused(f"announced VTEP MAC {peer.vtep_mac[:40]!r} is not a unicast MAC address",
                       RefusalReason.MALFORMED)
    ifname = vxlan_ifname(settings, family)
    return PeerPlan(
        name=peer.name, mode=Mode.VXLAN,
        neighbours=tuple(Neighbour(address=cidr.network_address, mac=mac, ifname=ifname) for cidr in cidrs),
        fdb=(FdbEntry(mac=mac, dst=peer.public_ip, ifname=ifname),),
        routes=tuple(Route(dst=cidr, gateway=cidr.network_address, ifname=ifname, onlink=True)
                     for cidr in cidrs))
