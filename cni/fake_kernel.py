"""`FakeCniKernel`: the `cni.kernel.CniKernel` seam in memory, for unit tests without root.

It keeps a node namespace and the pods' namespaces (each with links, addresses, main-table
routes, permanent neighbours and per-interface sysctls, dotted as `net.ipv6.conf.eth0.accept_ra`;
the node's in its `FakeSysctls`, beside forwarding), and refuses what the kernel refuses, with
the kernel's errno:

* a name taken at creation fails (`LinkExists`), and so does a missing or closed namespace;
  an alias over 254 bytes (255 with its NUL) fails creation (ERANGE) and leaves no pair, as `create_veth` promises;
* an address or route already there fails (EEXIST, as NLM_F_EXCL does);
* a route needs its device up (ENETDOWN), and a gateway reachable through a connected
  prefix or a link route of that device (ENETUNREACH): the order of `PodSetup.routes` counts;
* a port must exist (ENODEV) and so must its bridge, by index (ENODEV): an index remembered
  from a bridge since replaced is as stale as in the kernel;
* a per-interface sysctl needs its interface (ENOENT), and the gateway of an IPv6 host end
  (`NodeRoutes.addresses`) needs `disable_ipv6=0` on it when the namespace's default is 1 (EACCES);
* deleting a veth takes its peer and both ends' addresses, routes, neighbours and sysctls along.

Like the pod side's netlink batch, a write that fails part-way leaves what it did.

Fault injection: `fail_on("create_veth")` fails the next (or `nth`) call of a named
operation, `fail_at(n)` the n-th call of any operation; `calls` lists every operation in
order. `Timing.BEFORE` fails with nothing done; `Timing.AFTER` does the work, then fails,
as a batch whose last message is refused (for `open_netns` AFTER is BEFORE: a failed open
holds nothing). Faults fire once.
"""
from __future__ import annotations

import enum
import errno
import itertools
from dataclasses import dataclass, field

from cni.kernel import (
    Bridge,
    BridgeSpec,
    CniKernel,
    HostVeth,
    Interface,
    LinkExists,
    LinkSetting,
    Neighbour,
    NodeRoutes,
    OwnedLink,
    PodInterface,
    PodNetns,
    PodSetup,
    Route,
    VethPair,
    netns_missing,
    not_a_bridge,
)
from netagent.kernel import owned
from netagent.kernel.errors import KernelError
from netagent.kernel.families import IpFamily
from netagent.kernel.fake_sysctl import FakeSysctls
from netagent.kernel.sysctl import ensure_sysctls, forwarding

NODE = ""  # the node's namespace, by path
MAX_ALIAS = 254  # IFLA_IFALIAS holds at most IFALIASZ - 1 bytes, the NUL we send included


class Timing(enum.Enum):
    BEFORE = "before"  # the operation fails having done nothing
    AFTER = "after"    # the operation does its work, then reports a failure


@dataclass
class FakeLink:
    name: str
    kind: str
    index: int
    mac: str
    mtu: int = 1500
    up: bool = False
    alias: str | None = None
    master: int | None = None
    hairpin: bool = False
    peer: tuple[str, str] | None = None  # (namespace path, name) of a veth's other end
    addresses: set[Interface] = field(default_factory=set)


@dataclass
class FakeNamespace:
    links: dict[str, FakeLink] = field(default_factory=dict)
    routes: dict[Route, str] = field(default_factory=dict)  # route -> device name
    neighbours: dict[tuple[str, str], str] = field(default_factory=dict)  # (device, address) -> mac
    settings: dict[str, str] = field(default_factory=dict)  # per-interface sysctls, dotted keys

    def link(self, name: str) -> FakeLink:
        found = self.links.get(name)
        if found is None:
            raise KernelError(errno.ENODEV, f"No such device: {name}")
        return found

    def drop(self, name: str) -> None:
        self.links.pop(name, None)
        self.routes = {r: dev for r, dev in self.routes.items() if dev != name}
        self.neighbours = {k: mac for k, mac in self.neighbours.items() if k[0] != name}
        for key in [k for k in self.settings if setting_owner(k) == name]:
            del self.settings[key]

    def write_settings(self, name: str, settings: tuple[LinkSetting, ...]) -> None:
        if name not in self.links:
            raise KernelError(errno.ENOENT, f"No such file or directory: {settings[0].path(name)}")
        for setting in settings:
            self.settings[setting_key(name, setting)] = setting.value

    def ipv6_disabled(self, name: str) -> bool:
        return self.settings.get(f"net.ipv6.conf.{name}.disable_ipv6",
                                 self.settings.get("net.ipv6.conf.default.disable_ipv6", "0")) == "1"


def setting_key(name: str, setting: LinkSetting) -> str:
    """The dotted key of an interface's sysctl, as `sysctl` would show it."""
    return setting.path(name).replace("/", ".")


def setting_owner(key: str) -> str:
    """The interface of a per-interface sysctl's dotted key ("" for any other key, `all` and
    `default` included)."""
    parts = key.split(".")
    name = ".".join(parts[3:-1]) if len(parts) >= 5 and parts[2] == "conf" else ""
    return "" if name in ("all", "default") else name


@dataclass
class _Fault:
    operation: str | None  # None: any
    nth: int
    error: BaseException
    timing: Timing


class FakeCniKernel(CniKernel):
    def __init__(self) -> None:
        self._indexes = itertools.count(2)
        self._fds = itertools.count(100)
        self.namespaces: dict[str, FakeNamespace] = {}
        self.add_netns(NODE)
        self.open_handles: dict[int, str] = {}  # fd -> namespace path
        self.sysctls = FakeSysctls({forwarding(f).key: "0" for f in IpFamily})
        self.node.settings = self.sysctls.values  # the node's sysctls are one store
        self.ensured: dict[tuple[str, tuple[str, ...]], Bridge] = {}
        self.calls: list[str] = []
        self._faults: list[_Fault] = []

    # ------------------------------------------------------------ test set-up and inspection
    @property
    def node(self) -> FakeNamespace:
        return self.namespaces[NODE]

    def add_netns(self, path: str) -> FakeNamespace:
        space = self.namespaces[path] = FakeNamespace()
        space.links["lo"] = FakeLink(name="lo", kind="loopback", index=1, mac="00:00:00:00:00:00")
        return space

    def add_link(self, name: str, *, kind: str = "dummy", netns: str = NODE, alias: str | None = None,
                 up: bool = True) -> FakeLink:
        """A link made by someone else (an administrator's, the container's own eth0, ...)."""
        link = FakeLink(name=name, kind=kind, index=next(self._indexes), mac=_mac(), alias=alias, up=up)
        self.namespaces[netns].links[name] = link
        return link

    def fail_on(self, operation: str, *, nth: int = 1, error: BaseException | None = None,
                timing: Timing = Timing.BEFORE) -> None:
        """Make the `nth` call of `operation` from now fail."""
        self._faults.append(_Fault(operation, nth, error or KernelError(errno.EIO, f"injected: {operation}"),
                                   timing))

    def fail_at(self, call: int, *, error: BaseException | None = None, timing: Timing = Timing.BEFORE) -> None:
        """Make the `call`-th operation from now (1-based) fail, whichever it is."""
        self._faults.append(_Fault(None, call, error or KernelError(errno.EIO, f"injected: call {call}"), timing))

    def proxy_arp_key(self, name: str) -> str:
        return f"net.ipv4.conf.{name}.proxy_arp"

    def link_settings(self, name: str, *, netns: str = NODE) -> dict[str, str]:
        """The sysctls written on one interface, by key (`accept_ra`: "0", ...)."""
        return {key.rsplit(".", 1)[1]: value for key, value in self.namespaces[netns].settings.items()
                if setting_owner(key) == name}

    # ------------------------------------------------------------ fault machinery
    def _begin(self, operation: str) -> _Fault | None:
        """Record the call; return the fault it triggers (raised here when BEFORE)."""
        self.calls.append(operation)
        for fault in list(self._faults):
            if fault.operation in (None, operation):
                fault.nth -= 1
                if fault.nth == 0:
                    self._faults.remove(fault)
                    if fault.timing is Timing.BEFORE:
                        raise fault.error
                    return fault
        return None

    @staticmethod
    def _end(fault: _Fault | None) -> None:
        if fault is not None:
            raise fault.error

    def _space(self, netns: PodNetns) -> FakeNamespace:
        path = self.open_handles.get(netns.fd)
        if path != netns.path:
            raise KernelError(errno.EBADF, "Bad file descriptor")
        if path not in self.namespaces:
            raise netns_missing(netns.path)  # removed while open: the kernel keeps it, tests don't
        return self.namespaces[path]

    # ------------------------------------------------------------ the pod's namespace
    def open_netns(self, path: str) -> PodNetns:
        fault = self._begin("open_netns")
        self._end(fault)  # even AFTER: an open that fails has opened nothing
        if path not in self.namespaces or path == NODE:
            raise netns_missing(path)
        handle = PodNetns(path=path, fd=next(self._fds))
        self.open_handles[handle.fd] = path
        return handle

    def close_netns(self, netns: PodNetns) -> None:
        fault = self._begin("close_netns")
        if self.open_handles.pop(netns.fd, None) is None:
            raise KernelError(errno.EBADF, "Bad file descriptor")
        self._end(fault)

    # ------------------------------------------------------------ links
    def create_veth(self, pair: VethPair, netns: PodNetns, *, master: Bridge | None = None) -> bool:
        fault = self._begin("create_veth")
        pod = self._space(netns)
        for space, name in ((self.node, pair.host_name), (pod, pair.pod_ifname)):
            if name in space.links:
                raise LinkExists(name)
        if len(pair.alias.encode()) > MAX_ALIAS:  # the alias message is refused; the pair is removed
            raise KernelError(errno.ERANGE, "Numerical result out of range: alias")
        bridge = self._bridge_at(master.index) if master is not None else None
        self.node.links[pair.host_name] = FakeLink(
            name=pair.host_name, kind="veth", index=next(self._indexes), mac=pair.host_mac, mtu=pair.mtu,
            up=True, alias=pair.alias, master=bridge.index if bridge else None, peer=(netns.path, pair.pod_ifname))
        pod.links[pair.pod_ifname] = FakeLink(
            name=pair.pod_ifname, kind="veth", index=next(self._indexes), mac=pair.pod_mac, mtu=pair.mtu,
            peer=(NODE, pair.host_name))
        self._end(fault)
        return bridge is not None

    def delete_link(self, name: str) -> bool:
        fault = self._begin("delete_link")
        link = self.node.links.get(name)
        if link is None:
            self._end(fault)
            return False
        self.node.drop(name)
        if link.peer is not None and link.peer[0] in self.namespaces:
            self.namespaces[link.peer[0]].drop(link.peer[1])
        for port in self.node.links.values():
            if port.master == link.index:
                port.master = None
        self._end(fault)
        return True

    def owned_links(self) -> list[OwnedLink]:
        fault = self._begin("owned_links")
        found = [OwnedLink(name=link.name, kind=link.kind, alias=link.alias or "")
                 for link in self.node.links.values()
                 if link.alias and (link.alias.startswith(owned.VETH_ALIAS_PREFIX)
                                    or link.alias == owned.BRIDGE_ALIAS)]
        self._end(fault)
        return found

    # ------------------------------------------------------------ bridge mode
    def _bridge_at(self, index: int) -> FakeLink | None:
        return next((link for link in self.node.links.values()
                     if link.index == index and link.kind == "bridge"), None)

    def known_bridge(self, name: str) -> Bridge | None:
        fault = self._begin("known_bridge")
        found = next((bridge for key, bridge in self.ensured.items() if key[0] == name), None)
        self._end(fault)
        return found

    def ensure_bridge(self, spec: BridgeSpec) -> Bridge:
        fault = self._begin("ensure_bridge")
        key = (spec.name, tuple(str(g) for g in spec.gateways))
        if key in self.ensured:  # as the real one: no kernel call, even if it went stale
            self._end(fault)
            return self.ensured[key]
        link = self.node.links.get(spec.name)
        if link is None:
            link = self.node.links[spec.name] = FakeLink(name=spec.name, kind="bridge", index=next(self._indexes),
                                                         mac=_mac(), mtu=spec.mtu)
        if link.kind != "bridge":
            raise not_a_bridge(spec.name)
        if spec.settings:
            self.node.write_settings(spec.name, spec.settings)
        link.up = True
        link.alias = link.alias or owned.BRIDGE_ALIAS
        link.addresses.update(spec.gateways)
        bridge = self.ensured[key] = Bridge(name=spec.name, index=link.index, mac=link.mac)
        self._end(fault)
        return bridge

    def forget_bridge(self, name: str) -> None:
        fault = self._begin("forget_bridge")
        self.ensured = {key: bridge for key, bridge in self.ensured.items() if key[0] != name}
        self._end(fault)

    def attach_to_bridge(self, host_name: str, bridge: Bridge) -> None:
        fault = self._begin("attach_to_bridge")
        port = self.node.link(host_name)
        if self._bridge_at(bridge.index) is None:
            raise KernelError(errno.ENODEV, f"No such device: bridge index {bridge.index}")
        port.master, port.up = bridge.index, True
        self._end(fault)

    def set_hairpin(self, host_name: str) -> None:
        fault = self._begin("set_hairpin")
        port = self.node.link(host_name)
        if port.master is None:
            raise KernelError(errno.EOPNOTSUPP, f"{host_name} is not a bridge port")
        port.hairpin = True
        self._end(fault)

    # ------------------------------------------------------------ writes of addresses, routes, neighbours
    @staticmethod
    def _add_routes(space: FakeNamespace, device: FakeLink, routes: tuple[Route, ...]) -> None:
        for route in routes:
            if not device.up:
                raise KernelError(errno.ENETDOWN, "Network is down")
            if any(r.dst == route.dst for r in space.routes):
                raise KernelError(errno.EEXIST, f"File exists: route {route.dst}")
            gateway = route.gateway
            if gateway is not None and not (
                    any(gateway in a.network for a in device.addresses if a.version == gateway.version)
                    or any(r.gateway is None and dev == device.name and r.dst.version == gateway.version
                           and gateway in r.dst for r, dev in space.routes.items())):
                raise KernelError(errno.ENETUNREACH, f"Network is unreachable: gateway {gateway}")
            space.routes[route] = device.name

    @staticmethod
    def _add_neighbours(space: FakeNamespace, device: FakeLink, neighbours: tuple[Neighbour, ...]) -> None:
        for neighbour in neighbours:
            key = (device.name, str(neighbour.address))
            if key in space.neighbours:
                raise KernelError(errno.EEXIST, f"File exists: neighbour {neighbour.address}")
            space.neighbours[key] = neighbour.mac

    def configure_pod(self, netns: PodNetns, setup: PodSetup) -> None:
        fault = self._begin("configure_pod")
        space = self._space(netns)
        device = space.link(setup.ifname)
        if setup.settings:
            space.write_settings(setup.ifname, setup.settings)
        space.links["lo"].up = True
        for address in setup.addresses:
            if IpFamily.of(address.ip) is IpFamily.V6 and space.ipv6_disabled(setup.ifname):
                raise KernelError(errno.EACCES, "Permission denied: IPv6 is disabled on the device")
            if address in device.addresses:
                raise KernelError(errno.EEXIST, f"File exists: address {address}")
            device.addresses.add(address)
        device.up = True
        self._add_routes(space, device, setup.routes)
        self._add_neighbours(space, device, setup.neighbours)
        self._end(fault)

    def enable_forwarding(self, family: IpFamily) -> None:
        fault = self._begin("enable_forwarding")
        ensure_sysctls(self.sysctls, [forwarding(family)])
        self._end(fault)

    def set_link_settings(self, name: str, settings: tuple[LinkSetting, ...]) -> None:
        fault = self._begin("set_link_settings")
        self.node.write_settings(name, settings)
        self._end(fault)

    def route_to_pod(self, routes: NodeRoutes) -> None:
        fault = self._begin("route_to_pod")
        device = self.node.link(routes.host_name)
        for address in routes.addresses:
            if IpFamily.of(address.ip) is IpFamily.V6 and self.node.ipv6_disabled(routes.host_name):
                raise KernelError(errno.EACCES, "Permission denied: IPv6 is disabled on the device")
            if address in device.addresses:
                raise KernelError(errno.EEXIST, f"File exists: address {address}")
            device.addresses.add(address)
        self._add_routes(self.node, device, routes.routes)
        self._add_neighbours(self.node, device, routes.neighbours)
        self._end(fault)

    # ------------------------------------------------------------ reading back
    def read_pod_interface(self, netns: PodNetns, ifname: str) -> PodInterface | None:
        fault = self._begin("read_pod_interface")
        space = self._space(netns)
        link = space.links.get(ifname)
        found = None if link is None else PodInterface(
            ifname=ifname, mac=link.mac, up=link.up, addresses=frozenset(link.addresses),
            routes=frozenset(r for r, dev in space.routes.items() if dev == ifname))
        self._end(fault)
        return found

    def read_host_veth(self, name: str) -> HostVeth | None:
        fault = self._begin("read_host_veth")
        link = self.node.links.get(name)
        found = None
        if link is not None:
            master = next((m.name for m in self.node.links.values() if m.index == link.master), None)
            found = HostVeth(name=name, up=link.up, master=master,
                             routes=frozenset(r.dst for r, dev in self.node.routes.items() if dev == name),
                             addresses=frozenset(link.addresses))
        self._end(fault)
        return found


_macs = itertools.count(1)


def _mac() -> str:
    value = next(_macs)
    return "02:fa:" + ":".join(f"{b:02x}" for b in value.to_bytes(4, "big"))

