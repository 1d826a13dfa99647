"""`FakeKernel`: an in-memory kernel for routing unit tests that keeps state and validates.

It holds links, main-table routes (ours and others', by protocol), neighbours and FDB
entries, and refuses what the kernel refuses, with the kernel's errno:

* a route's device must exist (ENODEV) and be up (ENETDOWN);
* a gateway route without `onlink` needs its gateway inside a connected prefix of its
  device (ENETUNREACH); an onlink route does not;
* a neighbour or FDB entry on a missing device fails (ENODEV); FDB entries exist only on
  VXLAN devices (EOPNOTSUPP);
* a VXLAN device needs its underlay device (ENODEV) and an MTU that fits in it (EINVAL).

`underlay_snapshot` reports the links in the order they were added (indexes from 1; a link's
lowest address is its primary) and the interfaces of foreign default routes (`add_foreign_route`
with dst 0.0.0.0/0), as the agent's underlay choice reads them.
Deleting a link takes its routes, neighbours and FDB entries with it, and changing a
link's MAC flushes its neighbours (permanent ones too), as in the kernel.
Every mutating call is appended to `writes` (in `describe` words), so tests can assert
"no writes" for an adopting restart or exactly which objects an event touched. Tests
simulate drift by editing the state dicts directly, which records nothing.
"""
from __future__ import annotations

import dataclasses
import errno
from ipaddress import ip_interface

from netagent.kernel.families import IpFamily

from netagent.noderoutes.routing.model import (
    IPPROTO_IPV6,
    ROUTE_PROTOCOL,
    DeviceChange,
    FdbEntry,
    IpipDevice,
    Neighbour,
    ObservedDevice,
    Route,
    RoutingKernel,
    VxlanDevice,
    kernel_error,
)
from netagent.noderoutes.routing.plan import describe, device_drift
from netagent.noderoutes.underlay import InterfaceInfo, UnderlaySnapshot

VXLAN_HEADROOM = 50


class FakeKernel(RoutingKernel):
    def __init__(self, *, protocol: int = ROUTE_PROTOCOL) -> None:
        self.protocol = protocol
        self.links: dict[str, ObservedDevice] = {}
        self.routes: dict = {}  # dst -> (Route, protocol)
        self.neighbours: dict = {}  # (ifname, ip) -> Neighbour
        self.fdb: dict = {}  # (ifname, mac) -> FdbEntry
        self.writes: list[str] = []

    # ------------------------------------------------------------ test set-up helpers
    def add_link(self, ifname: str, *, kind: str = "veth", addresses: tuple = (), mtu: int = 1500,
                 up: bool = True) -> None:
        """A link that is not ours (the underlay, a bridge, a foreign tunnel)."""
        self.links[ifname] = ObservedDevice(ifname=ifname, kind=kind, mtu=mtu, up=up,
                                            addresses=frozenset(ip_interface(a) for a in addresses))

    def add_foreign_route(self, route: Route, *, protocol: int = 4) -> None:
        self.routes[route.dst] = (route, protocol)

    def our_routes(self) -> set:
        return {route for route, protocol in self.routes.values() if protocol == self.protocol}

    # ------------------------------------------------------------ links
    def underlay_snapshot(self) -> UnderlaySnapshot:
        indexes = {name: index for index, name in enumerate(self.links, start=1)}
        interfaces = tuple(InterfaceInfo(name=name, index=indexes[name], mtu=link.mtu,
                                         addresses=tuple(sorted(a for a in link.addresses if IpFamily.V4.holds(a))),
                                         addresses6=tuple(sorted(a for a in link.addresses
                                                                 if IpFamily.V6.holds(a) and not a.is_link_local)))
                           for name, link in self.links.items())

        def defaults(family: IpFamily) -> tuple:
            return tuple(indexes[route.ifname] for route, _ in self.routes.values()
                         if route.dst.prefixlen == 0 and family.holds(route.dst) and route.ifname in indexes)
        return UnderlaySnapshot(interfaces=interfaces, default_route_ifindexes=defaults(IpFamily.V4),
                                default_route6_ifindexes=defaults(IpFamily.V6))

    def links_with_prefix(self, prefix: str) -> dict[str, str]:
        return {name: link.kind for name, link in self.links.items() if name.startswith(prefix)}

    def observe(self, ifname: str) -> ObservedDevice | None:
        return self.links.get(ifname)

    def delete_link(self, ifname: str) -> None:
        if self.links.pop(ifname, None) is None:
            return
        self.writes.append(f"link del {ifname}")
        self.routes = {dst: (r, p) for dst, (r, p) in self.routes.items() if r.ifname != ifname}
        self.neighbours = {k: v for k, v in self.neighbours.items() if k[0] != ifname}
        self.fdb = {k: v for k, v in self.fdb.items() if k[0] != ifname}

    def ensure_vxlan(self, device: VxlanDevice) -> DeviceChange:
        underlay = self.links.get(device.underlay_ifname)
        if underlay is None:
            raise kernel_error(errno.ENODEV, f"vxlan {device.ifname}: no underlay device {device.underlay_ifname}")
        headroom = VXLAN_HEADROOM + (20 if IpFamily.V6.holds(device.local) else 0)  # the outer header's size
        if device.local not in {a.ip for a in underlay.addresses} and IpFamily.V6.holds(device.local):
            raise kernel_error(errno.EADDRNOTAVAIL, f"vxlan {device.ifname}: local {device.local} is not an "
                                                    f"address of {underlay.ifname}")
        if device.mtu > underlay.mtu - headroom:
            raise kernel_error(errno.EINVAL, f"vxlan {device.ifname}: MTU {device.mtu} exceeds "
                                             f"{underlay.ifname}'s {underlay.mtu} less headroom")
        created = ObservedDevice(ifname=device.ifname, kind="vxlan", mtu=device.mtu, up=False, mac=device.mac,
                                 vni=device.vni, port=device.port, local=device.local,
                                 underlay_ifname=device.underlay_ifname, learning=False, tx_checksum=True)
        return self._ensure(device, created)

    def ensure_ipip(self, device: IpipDevice) -> DeviceChange:
        if device.kind == "ip6tnl":  # external: no local address of its own
            created = ObservedDevice(ifname=device.ifname, kind="ip6tnl", mtu=device.mtu, up=False,
                                     proto=IPPROTO_IPV6, external=True)
        else:
            created = ObservedDevice(ifname=device.ifname, kind="ipip", mtu=device.mtu, up=False, local=device.local)
        return self._ensure(device, created)

    def _ensure(self, device, created: ObservedDevice) -> DeviceChange:
        drift = device_drift(device, self.links.get(device.ifname))
        if not drift:
            return DeviceChange.UNCHANGED
        emptied = drift.empties_device
        if drift.recreate:
            self.delete_link(device.ifname)
            self.links[device.ifname] = created
            self.writes.append(f"link add {describe(device)}")
            drift = device_drift(device, created)
        if drift.mac is not None:  # the kernel flushes a device's neighbours when its address changes
            self.neighbours = {k: v for k, v in self.neighbours.items() if k[0] != device.ifname}
        if drift:
            link = self.links[device.ifname]
            addresses = (link.addresses | set(drift.add_addresses)) - set(drift.remove_addresses)
            self.links[device.ifname] = dataclasses.replace(
                link, mtu=device.mtu, mac=getattr(device, "mac", None), up=True, addresses=frozenset(addresses),
                tx_checksum=link.tx_checksum if drift.tx_checksum is None else drift.tx_checksum)
            self.writes.append(f"link set {device.ifname} {drift}")
        return DeviceChange.EMPTIED if emptied else DeviceChange.REPAIRED

    def _require_link(self, ifname: str, what: str) -> ObservedDevice:
        link = self.links.get(ifname)
        if link is None:
            raise kernel_error(errno.ENODEV, f"{what}: no device {ifname}")
        return link

    # ------------------------------------------------------------ routes
    def dump_routes(self, family: IpFamily = IpFamily.V4) -> list[Route]:
        return [route for route, protocol in self.routes.values()
                if protocol == self.protocol and family.holds(route.dst)]

    def replace_route(self, route: Route) -> None:
        what = describe(route)
        link = self._require_link(route.ifname, what)
        if not link.up:
            raise kernel_error(errno.ENETDOWN, f"{what}: device is down")
        if route.gateway is not None and route.gateway.version != route.dst.version:
            raise kernel_error(errno.EINVAL, f"{what}: gateway of another family")
        if not route.onlink and route.gateway is not None and \
                not any(route.gateway in address.network for address in link.addresses
                        if address.version == route.gateway.version):
            raise kernel_error(errno.ENETUNREACH, f"{what}: gateway is not in a connected prefix of {route.ifname}")
        self.routes[route.dst] = (route, self.protocol)
        self.writes.append(f"replace {what}")

    def delete_route(self, route: Route) -> None:
        held = self.routes.get(route.dst)
        if held is not None and held[1] == self.protocol:
            del self.routes[route.dst]
            self.writes.append(f"delete {describe(held[0])}")

    # ------------------------------------------------------------ neighbours
    def dump_neighbours(self, ifname: str, family: IpFamily = IpFamily.V4) -> list[Neighbour]:
        return [n for (dev, address), n in self.neighbours.items() if dev == ifname and family.holds(address)]

    def replace_neighbour(self, neighbour: Neighbour) -> None:
        self._require_link(neighbour.ifname, describe(neighbour))
        self.neighbours[(neighbour.ifname, neighbour.address)] = neighbour
        self.writes.append(f"replace {describe(neighbour)}")

    def delete_neighbour(self, neighbour: Neighbour) -> None:
        if self.neighbours.pop((neighbour.ifname, neighbour.address), None) is not None:
            self.writes.append(f"delete {describe(neighbour)}")

    # ------------------------------------------------------------ FDB
    def dump_fdb(self, ifname: str) -> list[FdbEntry]:
        return [e for (dev, _), e in self.fdb.items() if dev == ifname]

    def replace_fdb(self, entry: FdbEntry) -> None:
        link = self._require_link(entry.ifname, describe(entry))
        if link.kind != "vxlan":
            raise kernel_error(errno.EOPNOTSUPP, f"{describe(entry)}: {entry.ifname} is not a VXLAN device")
        self.fdb[(entry.ifname, entry.mac)] = entry
        self.writes.append(f"replace {describe(entry)}")

    def delete_fdb(self, entry: FdbEntry) -> None:
        if self.fdb.pop((entry.ifname, entry.mac), None) is not None:
            self.writes.append(f"delete {describe(entry)}")
