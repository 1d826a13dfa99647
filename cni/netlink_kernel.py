"""`NetlinkCniKernel`: the `cni.kernel.CniKernel` seam on the real kernel.

The per-pod writes (the veth pair, the pod side, routed mode's node routes, deletes) go
through `cni.rtnl`: hand-packed messages, one batch per step, on this thread's warm socket
(`cni.netns`); the pod side is one system call. Bridge set-up and the read-backs of CHECK
and GC are off the hot path and use pyroute2. Sysctls are files under /proc/sys.

Two things live here because they are about kernel objects, not policy:
- what this process has ensured already (each bridge by name and gateways, with its index;
  forwarding per family), so a warm agent's ADD asks the kernel nothing it knows. A stale
  bridge index costs one retry in `create_veth`; `forget_bridge` drops the memory;
- errors: a pyroute2 `NetlinkError` (both clients raise it) leaves as `KernelError`, and the
  thread's warm sockets are dropped first, since the error may have broken them.
"""
from __future__ import annotations

import contextlib
import errno
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from ipaddress import ip_address, ip_interface, ip_network
from typing import Any

from pyroute2 import IPRoute, NetlinkError

from cni import netns as netns_mod
from cni import rtnl as rtnl_msg
from cni.errors import CniError, ErrorCode
from cni.kernel import (
    Bridge,
    BridgeSpec,
    CniKernel,
    HostVeth,
    LinkExists,
    LinkSetting,
    NodeRoutes,
    OwnedLink,
    PodInterface,
    PodNetns,
    PodSetup,
    Route,
    VethPair,
    not_a_bridge,
)
from cni.wiring import DEFAULT_DST, random_mac
from netagent.kernel import owned, sysctl
from netagent.kernel.errors import KernelError
from netagent.kernel.families import IpFamily
from netagent.kernel.sysctl import ProcSysctls, ensure_sysctls

LOOPBACK_INDEX = 1  # the kernel registers lo first in every namespace
AF_INET, AF_INET6 = 2, 10
MAIN_TABLE = 254
_GONE = (errno.ENODEV, errno.ENOENT)
RUNNING_DEADLINE = 5.0  # seconds; the link watcher's own delay is at most one
log = logging.getLogger("netagent.cni")


@contextlib.contextmanager
def _kernel_errors() -> Iterator[None]:
    """NetlinkError -> KernelError, after dropping this thread's (maybe broken) warm sockets."""
    try:
        yield
    except NetlinkError as exc:
        netns_mod.drop_host_netlink()
        raise KernelError(exc.code, str(exc)) from exc


def _lookup(ipr: IPRoute, name: str) -> int | None:
    found = ipr.link_lookup(ifname=name)
    return found[0] if found else None


def _ignore_exists(call: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
    try:
        call(*args, **kwargs)
    except NetlinkError as exc:
        if exc.code != errno.EEXIST:
            raise


def _delete(rtnl: rtnl_msg.Rtnl, name: str) -> bool:
    try:
        rtnl.batch([rtnl_msg.delete_link(name)])
        return True
    except NetlinkError as exc:
        if exc.code in _GONE:
            return False
        raise


def write_link_settings(name: str, settings: tuple[LinkSetting, ...]) -> None:
    """Per-interface sysctls under /proc/sys of the calling thread's network namespace."""
    for setting in settings:
        try:
            with open(f"/proc/sys/{setting.path(name)}", "w") as f:
                f.write(setting.value)
        except OSError as exc:  # ENOENT: no such interface, or no IPv6 in this kernel
            raise KernelError(exc.errno or errno.EIO, f"cannot set {setting.path(name)} to {setting.value}: "
                              f"{exc.strerror or exc}") from None


def _wait_until_running(rtnl: rtnl_msg.Rtnl, index: int, ifname: str) -> None:
    """Return once the pod's interface is operationally up (IFF_RUNNING), so that the pod can
    answer the moment ADD returns. The carrier comes with the link, but the kernel's link
    watcher applies it to the operational state from a work queue (at most one run a second
    for events it does not deem urgent), and until then IPv6 does not count the interface
    ready. Measured on a loaded machine before this wait: a pod's eth0 still DOWN after ADD,
    and its first echo answered a second late or not at all. Usually the first check passes
    (about 25 us); bounded: past the deadline ADD goes on, logged."""
    deadline = time.monotonic() + RUNNING_DEADLINE
    pause = 0.0002
    while not rtnl.link_running(index):
        if time.monotonic() > deadline:
            log.warning("%s in the pod is not running after %.0f s; going on", ifname, RUNNING_DEADLINE)
            return
        time.sleep(pause)
        pause = min(pause * 2, 0.02)


def _route_messages(routes: tuple[Route, ...], index: int) -> list:
    return [rtnl_msg.add_route(dst=route.dst, gateway=route.gateway, oif=index) for route in routes]


class NetlinkCniKernel(CniKernel):
    def __init__(self) -> None:
        # (name, gateways) -> Bridge, for bridges this object has ensured
        self._bridges: dict[tuple[str, tuple[str, ...]], Bridge] = {}
        self._bridges_lock = threading.Lock()
        self._forwarding_enabled: set[IpFamily] = set()

    # ------------------------------------------------------------ the pod's namespace
    def open_netns(self, path: str) -> PodNetns:
        return PodNetns(path=path, fd=netns_mod.open_netns(path))

    def close_netns(self, netns: PodNetns) -> None:
        os.close(netns.fd)

    # ------------------------------------------------------------ links
    def create_veth(self, pair: VethPair, netns: PodNetns, *, master: Bridge | None = None) -> bool:
        """One write: the creation (host end enslaved to an already-known bridge) and the alias,
        which the kernel ignores at creation and so takes as a second message. A stale bridge
        index (the bridge was replaced) costs one retry without it. Should the alias fail after
        the pair was made, the pair is deleted again: nothing half-made is left."""
        rtnl = netns_mod.host_rtnl()

        def create(with_master: int | None) -> None:
            rtnl.batch([rtnl_msg.new_veth(name=pair.host_name, peer_name=pair.pod_ifname,
                                          peer_netns_fd=netns.fd, mtu=pair.mtu, mac=pair.host_mac,
                                          peer_mac=pair.pod_mac, master=with_master),
                        rtnl_msg.set_link(name=pair.host_name, alias=pair.alias)])

        with _kernel_errors():
            try:
                try:
                    create(master.index if master is not None else None)
                    return master is not None
                except NetlinkError as exc:
                    if master is None or exc.code not in (errno.ENODEV, errno.EINVAL, errno.EOPNOTSUPP):
                        raise
                    _delete(rtnl, pair.host_name)
                    create(None)
                    return False
            except NetlinkError as exc:
                if exc.code != errno.EEXIST:
                    with contextlib.suppress(NetlinkError):
                        _delete(rtnl, pair.host_name)
                    raise
                taken = pair.host_name if rtnl.link_index(pair.host_name) is not None else pair.pod_ifname
                raise LinkExists(taken, str(exc)) from None

    def delete_link(self, name: str) -> bool:
        with _kernel_errors():
            return _delete(netns_mod.host_rtnl(), name)

    def owned_links(self) -> list[OwnedLink]:
        found = []
        with _kernel_errors():
            for link in netns_mod.host_netlink().get_links():
                alias = link.get_attr("IFLA_IFALIAS") or ""
                if alias.startswith(owned.VETH_ALIAS_PREFIX) or alias == owned.BRIDGE_ALIAS:
                    found.append(OwnedLink(name=link.get_attr("IFLA_IFNAME"), alias=alias,
                                           kind=link.get_nested("IFLA_LINKINFO", "IFLA_INFO_KIND") or ""))
        return found

    # ------------------------------------------------------------ bridge mode
    def known_bridge(self, name: str) -> Bridge | None:
        with self._bridges_lock:
            for key, bridge in self._bridges.items():
                if key[0] == name:
                    return bridge
        return None

    def ensure_bridge(self, spec: BridgeSpec) -> Bridge:
        key = (spec.name, tuple(str(g) for g in spec.gateways))
        with self._bridges_lock:
            cached = self._bridges.get(key)
        if cached is not None:
            return cached
        ipr = netns_mod.host_netlink()
        with _kernel_errors():
            index = _lookup(ipr, spec.name)
            if index is None:
                _ignore_exists(ipr.link, "add", ifname=spec.name, kind="bridge", mtu=spec.mtu,
                               address=random_mac())
                index = _lookup(ipr, spec.name)
                if index is None:
                    raise CniError(ErrorCode.INTERNAL, f"bridge {spec.name} vanished right after creation")
            link = ipr.get_links(index)[0]
            if link.get_nested("IFLA_LINKINFO", "IFLA_INFO_KIND") != "bridge":
                raise not_a_bridge(spec.name)
            write_link_settings(spec.name, spec.settings)
            ipr.link("set", index=index, state="up",
                     **({"ifalias": owned.BRIDGE_ALIAS} if link.get_attr("IFLA_IFALIAS") is None else {}))
            for gateway in spec.gateways:
                _ignore_exists(ipr.addr, "add", index=index, address=str(gateway.ip),
                               prefixlen=gateway.network.prefixlen,
                               **({"flags": rtnl_msg.IFA_F_NODAD} if IpFamily.V6.holds(gateway) else {}))
        bridge = Bridge(name=spec.name, index=index, mac=link.get_attr("IFLA_ADDRESS"))
        with self._bridges_lock:
            self._bridges[key] = bridge
        return bridge

    def forget_bridge(self, name: str) -> None:
        with self._bridges_lock:
            for key in [k for k in self._bridges if k[0] == name]:
                del self._bridges[key]

    def attach_to_bridge(self, host_name: str, bridge: Bridge) -> None:
        with _kernel_errors():
            netns_mod.host_rtnl().batch([rtnl_msg.set_link(name=host_name, master=bridge.index)])

    def set_hairpin(self, host_name: str) -> None:
        ipr = netns_mod.host_netlink()
        with _kernel_errors():
            index = _lookup(ipr, host_name)
            if index is None:
                raise KernelError(errno.ENODEV, f"no interface {host_name}")
            try:
                ipr.brport("set", index=index, mode=1)
            except IndexError:  # pyroute2's answer when the port vanished between lookup and set
                raise KernelError(errno.ENODEV, f"{host_name} is gone") from None

    # ------------------------------------------------------------ the pod side
    def configure_pod(self, netns: PodNetns, setup: PodSetup) -> None:
        """One lookup and one batched write, on a socket made inside the pod's namespace."""
        if setup.settings:  # while the interface is down, before its link-local address exists
            with netns_mod.entered(netns.fd):
                write_link_settings(setup.ifname, setup.settings)
        with _kernel_errors(), netns_mod.rtnl_in(netns.fd) as pod_rtnl:
            index = pod_rtnl.link_index(setup.ifname)
            if index is None:
                raise CniError(ErrorCode.INTERNAL, f"{setup.ifname} is missing in the pod right after creation")
            batch = [rtnl_msg.set_link(index=LOOPBACK_INDEX)]
            batch += [rtnl_msg.add_address(index=index, address=a.ip, prefixlen=a.network.prefixlen)
                      for a in setup.addresses]
            batch.append(rtnl_msg.set_link(index=index))
            batch += _route_messages(setup.routes, index)
            batch += [rtnl_msg.add_permanent_neighbour(index=index, address=n.address, mac=n.mac)
                      for n in setup.neighbours]
            pod_rtnl.batch(batch)
            _wait_until_running(pod_rtnl, index, setup.ifname)

    # ------------------------------------------------------------ the node side
    def enable_forwarding(self, family: IpFamily) -> None:
        """Once per family and process: a warm agent does not even read the sysctl again."""
        if family in self._forwarding_enabled:
            return
        ensure_sysctls(ProcSysctls(), [sysctl.forwarding(family)])
        self._forwarding_enabled.add(family)

    def set_link_settings(self, name: str, settings: tuple[LinkSetting, ...]) -> None:
        write_link_settings(name, settings)

    def route_to_pod(self, routes: NodeRoutes) -> None:
        rtnl = netns_mod.host_rtnl()
        with _kernel_errors():
            index = rtnl.link_index(routes.host_name)
            if index is None:
                raise KernelError(errno.ENODEV, f"no interface {routes.host_name}")
            rtnl.batch([rtnl_msg.add_address(index=index, address=a.ip, prefixlen=a.network.prefixlen)
                        for a in routes.addresses]
                       + _route_messages(routes.routes, index)
                       + [rtnl_msg.add_permanent_neighbour(index=index, address=n.address, mac=n.mac)
                          for n in routes.neighbours])

    # ------------------------------------------------------------ reading back
    def read_pod_interface(self, netns: PodNetns, ifname: str) -> PodInterface | None:
        with _kernel_errors(), netns_mod.netlink_in(netns.fd) as pod_ipr:
            index = _lookup(pod_ipr, ifname)
            if index is None:
                return None
            link = pod_ipr.get_links(index)[0]
            addresses = frozenset(ip_interface(f"{a.get_attr('IFA_ADDRESS')}/{a['prefixlen']}")
                                  for a in pod_ipr.get_addr(index=index))
            routes = set()
            for af, family in ((AF_INET, IpFamily.V4), (AF_INET6, IpFamily.V6)):
                for r in pod_ipr.get_routes(family=af, oif=index, table=MAIN_TABLE):
                    dst = r.get_attr("RTA_DST")
                    gateway = r.get_attr("RTA_GATEWAY")
                    routes.add(Route(dst=ip_network(f"{dst}/{r['dst_len']}", strict=False) if dst
                                     else DEFAULT_DST[family],
                                     gateway=ip_address(gateway) if gateway else None))
        return PodInterface(ifname=ifname, mac=link.get_attr("IFLA_ADDRESS"), up=bool(link["flags"] & 1),
                            addresses=addresses, routes=frozenset(routes))

    def read_host_veth(self, name: str) -> HostVeth | None:
        ipr = netns_mod.host_netlink()
        with _kernel_errors():
            index = _lookup(ipr, name)
            if index is None:
                return None
            link = ipr.get_links(index)[0]
            master_index = link.get_attr("IFLA_MASTER")
            master = None
            if master_index:
                with contextlib.suppress(NetlinkError):
                    master = ipr.get_links(master_index)[0].get_attr("IFLA_IFNAME")
            routes = set()
            for family in (AF_INET, AF_INET6):
                for r in ipr.get_routes(family=family, oif=index, table=MAIN_TABLE):
                    dst = r.get_attr("RTA_DST")
                    if dst:
                        routes.add(ip_network(f"{dst}/{r['dst_len']}", strict=False))
            addresses = frozenset(ip_interface(f"{a.get_attr('IFA_ADDRESS')}/{a['prefixlen']}")
                                  for a in ipr.get_addr(index=index))
        return HostVeth(name=name, up=bool(link["flags"] & 1), master=master, routes=frozenset(routes),
                        addresses=addresses)
