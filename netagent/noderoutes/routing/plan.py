"""Pure routing logic shared by the reconciler and both kernels: render, diff, drift.

`render_plan(local, peers, settings)` is the whole of "what should the kernel hold": the
devices the mode needs and, per peer, its objects or the reason it has none (pending,
refused). It plans ONE family, the local node's (`LocalNode.family`: its underlay address's);
a dual-stack node runs one planner (and one `RouteManager`) per family, as kube-proxy runs one
proxier per family, each peer projected onto the family by `Peer.in_family`. It has no side effects and no knowledge of what is programmed, so it is golden
tested (`describe_plan` prints a plan the way `ip` would show it).

The peer loop runs in seniority order (the oldest Node first) and `admission.py` decides
who may be routed: pod CIDRs inside the cluster CIDR and clear of reserved ranges, and no
claim (CIDR, public IP, VTEP MAC) taken from this node or an older peer. So conflicts
resolve the same way on every node and every run, and never in a newcomer's favour.

`diff_objects` compares desired objects with current ones (from a kernel dump or from
memory) by identity - a route by destination, a neighbour by (device, IP), an FDB entry by
(device, MAC) - and returns writes in programming order and deletes in reverse
dependency order. `device_drift` is the one definition of "this device is not what we
want" that the real and the fake kernel both apply.
"""
from __future__ import annotations

from dataclasses import dataclass
from ipaddress import IPv4Address
from typing import Iterable, Mapping

from netagent.kernel.families import IpFamily
from netagent.noderoutes.routing.admission import Admission
from netagent.noderoutes.routing.auto import render_auto_peer
from netagent.noderoutes.routing.bgp import render_bgp_peer, reserved_addresses
from netagent.noderoutes.routing.hostgw import render_host_gw_peer
from netagent.noderoutes.routing.ipip import render_ipip_device, render_ipip_peer
from netagent.noderoutes.routing.model import (
    IPPROTO_IPV6,
    FdbEntry,
    IpipDevice,
    LocalNode,
    Mode,
    Neighbour,
    ObservedDevice,
    Peer,
    PeerBounds,
    PeerPlan,
    Pending,
    Plan,
    Refused,
    Route,
    RoutingSettings,
    VxlanDevice,
)
from netagent.noderoutes.routing.vxlan import render_vxlan_device, render_vxlan_peer

# ---------------------------------------------------------------- render

def render_devices(local: LocalNode, settings: RoutingSettings) -> tuple:
    """The encapsulation device the mode needs: (), (VxlanDevice,) or (IpipDevice,)."""
    if settings.encap is Mode.VXLAN:
        return (render_vxlan_device(local, settings),)
    if settings.encap is Mode.IPIP:  # na-ipip (ipip) or, for an IPv6 node, na-ipip6 (ip6tnl)
        return (render_ipip_device(local, settings),)
    return ()


def _render_backend(local: LocalNode, peer: Peer, cidrs: tuple, settings: RoutingSettings,
                    learnt: Mapping) -> PeerPlan | Pending | Refused:
    if settings.mode is Mode.BGP:
        return render_bgp_peer(peer, cidrs, learnt)
    if settings.mode is Mode.VXLAN:
        return render_vxlan_peer(peer, cidrs, settings)
    if settings.mode is Mode.HOST_GW:
        return render_host_gw_peer(local, peer, cidrs)
    if settings.mode is Mode.IPIP:
        return render_ipip_peer(peer, cidrs, settings)
    return render_auto_peer(local, peer, cidrs, settings, learnt=learnt)


def _render_peer(local: LocalNode, peer: Peer, cidrs: tuple, settings: RoutingSettings, *,
                 admission: Admission, learnt: Mapping) -> PeerPlan | Pending | Refused:
    """One peer's outcome; an accepted peer's claims are recorded so younger peers see them."""
    refused = admission.check(peer, cidrs)
    if refused is not None:
        return refused
    result = _render_backend(local, peer, cidrs, settings, learnt)
    if isinstance(result, PeerPlan):
        refused = admission.check_macs(result)
        if refused is not None:
            return refused
    if not isinstance(result, Refused):
        admission.admit(peer, cidrs, result)
    return result


def render_plan(local: LocalNode, peers: Iterable[Peer], settings: RoutingSettings, *,
                bounds: PeerBounds, learnt: Mapping | None = None, admission: Admission | None = None) -> Plan:
    """Everything the kernel should hold for `peers` (a peer named like the local node is skipped);
    only peers inside `bounds` and holding their claims (`admission.py`) get objects. `learnt`:
    the routes BIRD learnt over BGP (destination -> Route, `noderoutes/bgp/learnt.py`), which
    `bgp` mode (and `auto` across subnets) copies for the admitted peers' own CIDRs only; the
    speaker's `LearntTable` (`bgp.py`) also names the addresses no peer may hold (external BGP peers, gateways).
    Only `local.family` is planned: `ignored_ipv6` lists the IPv6 CIDRs an IPv4 plan skipped.
    `admission`: an empty one to fill (`incremental.py` keeps it to plan later changes alone)."""
    devices = render_devices(local, settings)
    by_name = {peer.name: peer for peer in peers if peer.name != local.name}
    if admission is None:
        admission = Admission(local, by_name.values(), bounds=bounds, devices=devices,
                              reserved_addresses=reserved_addresses(learnt))
    planned: dict[str, PeerPlan] = {}
    refused: dict[str, Refused] = {}
    pending: dict[str, str] = {}
    ignored_ipv6: list[str] = []
    for peer in sorted(by_name.values(), key=lambda p: p.seniority):
        result = plan_peer(local, peer, settings, admission=admission, learnt=learnt or {})
        ignored_ipv6.extend(ignored_cidrs(local, peer))
        file_outcome(peer.name, result, planned=planned, refused=refused, pending=pending)
    return Plan(devices=devices, peers=dict(sorted(planned.items())), refused=dict(sorted(refused.items())),
                pending=dict(sorted(pending.items())), ignored_ipv6=tuple(ignored_cidrs(local) + sorted(ignored_ipv6)))


def plan_peer(local: LocalNode, peer: Peer, settings: RoutingSettings, *, admission: Admission,
              learnt: Mapping) -> PeerPlan | Pending | Refused | None:
    """One peer's outcome in `local.family`'s plan, its claims recorded in `admission` when it
    holds them; None when it has nothing of this family to route (another family's planner routes it)."""
    family = local.family
    cidrs = peer.cidrs_of(family)
    if not peer.pod_cidrs:
        return Pending("no pod CIDR yet")
    if not cidrs:
        return None
    projected = peer.in_family(family)
    if isinstance(projected, Peer):
        return _render_peer(local, projected, cidrs, settings, admission=admission, learnt=learnt)
    return projected


def ignored_cidrs(local: LocalNode, peer: Peer | None = None) -> list[str]:
    """The IPv6 pod CIDRs an IPv4 plan skips: the peer's ("name cidr"), or the local node's."""
    if local.family is not IpFamily.V4:
        return []
    node = local if peer is None else peer
    return [f"{node.name} {c}" for c in node.pod_cidrs if not IpFamily.V4.holds(c)]


def file_outcome(name: str, result: PeerPlan | Pending | Refused | None, *, planned: dict, refused: dict,
                 pending: dict) -> None:
    """Put one peer's outcome where a `Plan` keeps it."""
    if isinstance(result, PeerPlan):
        planned[name] = result
    elif isinstance(result, Pending):
        pending[name] = result.reason
    elif isinstance(result, Refused):
        refused[name] = result


# ---------------------------------------------------------------- text form (logs, goldens)

def describe(thing) -> str:
    """One line in `ip`'s words for a device or a kernel object."""
    if isinstance(thing, Route):
        via = f" via {thing.gateway}" if thing.gateway is not None else ""
        encap = f" encap ip6 dst {thing.encap_dst}" if thing.encap_dst is not None else ""
        return f"route {thing.dst}{via}{encap} dev {thing.ifname}{' onlink' if thing.onlink else ''}"
    if isinstance(thing, Neighbour):
        return f"neigh {thing.address} lladdr {thing.mac} dev {thing.ifname} permanent"
    if isinstance(thing, FdbEntry):
        return f"fdb {thing.mac} dst {thing.dst} dev {thing.ifname} self permanent"
    if isinstance(thing, VxlanDevice):
        return (f"link {thing.ifname} type vxlan id {thing.vni} dstport {thing.port} local {thing.local} "
                f"dev {thing.underlay_ifname} nolearning address {thing.mac} mtu {thing.mtu} up, "
                f"addr {thing.address}, tx-checksum-ip-generic {'on' if thing.tx_checksum else 'off'}")
    if isinstance(thing, IpipDevice):
        local = "external mode ip6ip6" if thing.kind == "ip6tnl" else f"local {thing.local}"
        return f"link {thing.ifname} type {thing.kind} {local} mtu {thing.mtu} up, addr {thing.address}"
    raise TypeError(f"cannot describe {thing!r}")


def describe_plan(plan: Plan) -> str:
    lines = [describe(device) for device in plan.devices]
    for name, peer in plan.peers.items():
        lines.append(f"peer {name} {peer.mode.value}")
        lines.extend(f"  {describe(obj)}" for obj in peer.objects())
    lines.extend(f"pending {name}: {why}" for name, why in plan.pending.items())
    lines.extend(f"refused {name}: {why.detail}" for name, why in plan.refused.items())
    lines.extend(f"ignored IPv6 {entry}" for entry in plan.ignored_ipv6)
    return "\n".join(lines)


# ---------------------------------------------------------------- diff

def object_key(obj) -> tuple:
    """The identity of a kernel object: what a replace overwrites and a delete matches."""
    if isinstance(obj, Route):
        return ("route", obj.dst)
    if isinstance(obj, Neighbour):
        return ("neigh", obj.ifname, obj.address)
    return ("fdb", obj.ifname, obj.mac)


_DELETE_ORDER = {Route: 0, FdbEntry: 1, Neighbour: 2}  # a route before the next hop it resolves through


@dataclass(frozen=True)
class ObjectChanges:
    writes: tuple   # (peer name, object), each peer's in programming order
    deletes: tuple  # objects nobody wants any more: routes, then FDB, then neighbours
    unchanged: int


def diff_objects(desired: Iterable[PeerPlan], current: Iterable) -> ObjectChanges:
    have = {object_key(obj): obj for obj in current}
    writes, wanted, unchanged = [], set(), 0
    for peer in desired:
        for obj in peer.objects():
            key = object_key(obj)
            wanted.add(key)
            if have.get(key) == obj:
                unchanged += 1
            else:
                writes.append((peer.name, obj))
    deletes = sorted((obj for key, obj in have.items() if key not in wanted),
                     key=lambda obj: _DELETE_ORDER[type(obj)])
    return ObjectChanges(writes=tuple(writes), deletes=tuple(deletes), unchanged=unchanged)


# ---------------------------------------------------------------- device drift

@dataclass(frozen=True)
class DeviceDrift:
    """How an existing device differs from the wanted one; all-default means it does not."""
    recreate: str = ""  # non-empty: why the device must be deleted and created again
    mtu: int | None = None
    mac: str | None = None
    bring_up: bool = False
    add_addresses: tuple = ()
    remove_addresses: tuple = ()
    tx_checksum: bool | None = None  # set tx-checksum-ip-generic to this

    def __bool__(self) -> bool:
        return self != DeviceDrift()

    @property
    def empties_device(self) -> bool:
        """Recreating drops everything on the device; a new MAC makes the kernel flush its neighbours."""
        return bool(self.recreate) or self.mac is not None


_ANY = IPv4Address("0.0.0.0")  # ipip's "no remote"


def _identity_drift(device, observed: ObservedDevice) -> str:
    """Why `observed` cannot be repaired in place into `device` ("" when it can)."""
    kind = "vxlan" if isinstance(device, VxlanDevice) else device.kind
    if observed.kind != kind:
        return f"it is a {observed.kind or 'plain'} device, not {kind}"
    if kind == "ip6tnl":  # external: no local, no remote (routing/ipip.py)
        checks: list[tuple[str, object, object]] = [("external", observed.external, True),
                                                     ("mode (proto)", observed.proto, IPPROTO_IPV6)]
        return ", ".join(f"{what} is {have}, want {want}" for what, have, want in checks if have != want)
    checks = [("local", observed.local, device.local)]
    if isinstance(device, VxlanDevice):
        checks += [("VNI", observed.vni, device.vni), ("port", observed.port, device.port),
                   ("underlay", observed.underlay_ifname, device.underlay_ifname),
                   ("learning", observed.learning, False)]
    else:
        checks.append(("remote", observed.remote or _ANY, _ANY))
    return ", ".join(f"{what} is {have}, want {want}" for what, have, want in checks if have != want)


def device_drift(device: VxlanDevice | IpipDevice, observed: ObservedDevice | None) -> DeviceDrift:
    if observed is None:
        return DeviceDrift(recreate="it does not exist")
    reason = _identity_drift(device, observed)
    if reason:
        return DeviceDrift(recreate=reason)
    mac = getattr(device, "mac", None)
    return DeviceDrift(
        mtu=device.mtu if observed.mtu != device.mtu else None,
        mac=mac if mac is not None and observed.mac != mac else None,
        bring_up=not observed.up,
        add_addresses=() if device.address in observed.addresses else (device.address,),
        remove_addresses=tuple(sorted(a for a in observed.addresses if a != device.address)),
        tx_checksum=device.tx_checksum if isinstance(device, VxlanDevice) and observed.tx_checksum is not None
        and observed.tx_checksum != device.tx_checksum else None)
