"""`NetlinkKernel`: the routing kernel seam over one reused pyroute2 `IPRoute` instance.

The object belongs to the network namespace of the thread that built it, whatever thread
calls it later. That needs care: pyroute2 0.9 keeps its netlink socket per thread and
opens a new one, in the calling thread's current namespace, on a thread's first call. So
the constructor remembers its namespace, and every public method runs with the calling
thread inside it (a `setns` there and back, skipped when the thread is already there,
which is always the case in the agent). The ethtool ioctl socket is opened in the
constructor and is bound to the namespace from then on.

Interface indexes are cached by name and the cache is dropped whenever this class creates
or deletes a link, or a call reports the device gone (the reconciler then re-runs a full
sync, which re-ensures devices). pyroute2's `NetlinkError` is translated to `KernelError`
(`netagent/kernel/errors.py`, worded by `model.kernel_error`) so the reconciler never depends
on pyroute2. Deletes of objects already gone succeed.

The per-peer writes (replace and delete of a route, neighbour or FDB entry) go through
`rtnl.py`'s hand-packed requests on a plain netlink socket, not pyroute2: they are the Node
change's hot path. `addresses_changed` reads `rtnl.AddressEvents`.

The VXLAN checksum workaround uses pyroute2's ethtool ioctl support (`IoctlEthtool`,
`ETHTOOL_SFEATURES`) to set `tx-checksum-ip-generic` (off or on, `ChecksumOffload`): no `ethtool` binary is needed
(none is installed on the build machine).

IPv6 ipip's routes (`encap ip6 dst <peer>` on `na-ipip6`, routing/ipip.py) are one message built
here (`_EncapRouteMsg`), since pyroute2's request layer knows only the mpls, seg6 and bpf
encapsulations; a dump hands their RTA_ENCAP over as hex, read back by `_ip6_encap_dst`.
"""
from __future__ import annotations

import contextlib
import enum
import errno
import logging
import os
import socket
import struct
from ipaddress import IPv6Address, ip_address, ip_interface, ip_network

from pyroute2 import IPRoute, NetlinkError
from pyroute2.ethtool.ioctl import IoctlEthtool
from pyroute2.netlink import NLM_F_ACK, NLM_F_CREATE, NLM_F_REPLACE, NLM_F_REQUEST, nla
from pyroute2.netlink.rtnl import RTM_NEWROUTE
from pyroute2.netlink.rtnl.rtmsg import LWTUNNEL_ENCAP_IP6, rtmsg

from netagent.kernel import namespaces
from netagent.kernel.families import IpFamily
from netagent.kernel.errors import KernelError
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
from netagent.noderoutes.routing.rtnl import AddressEvents, RtnlSocket
from netagent.noderoutes.underlay import UnderlaySnapshot, read_underlay_snapshot

log = logging.getLogger("netagent.noderoutes.routing")

MAIN_TABLE = 254
RTN_UNICAST = 1
RTNH_F_ONLINK = 0x4
NUD_PERMANENT = 0x80
NTF_SELF = 0x02
IFF_UP = 0x1
IFA_F_NODAD = 0x02
LWTUNNEL_IP6_DST = 2  # linux/lwtunnel.h: the outer destination inside RTA_ENCAP (type LWTUNNEL_ENCAP_IP6)
TX_CHECKSUM_FEATURE = "tx-checksum-ip-generic"
_GONE = (errno.ENOENT, errno.ESRCH, errno.ENODEV)
_AF = {IpFamily.V4: socket.AF_INET, IpFamily.V6: socket.AF_INET6}


class _Ip6EncapInfo(nla):
    """RTA_ENCAP of type LWTUNNEL_ENCAP_IP6 (linux/lwtunnel.h, `lwtunnel_ip6_t`)."""
    nla_map = (("LWTUNNEL_IP6_UNSPEC", "none"), ("LWTUNNEL_IP6_ID", "be64"), ("LWTUNNEL_IP6_DST", "ip6addr"),
               ("LWTUNNEL_IP6_SRC", "ip6addr"), ("LWTUNNEL_IP6_HOPLIMIT", "uint8"), ("LWTUNNEL_IP6_TC", "uint8"),
               ("LWTUNNEL_IP6_FLAGS", "be16"))


class _EncapRouteMsg(rtmsg):
    """A route message that can encode `encap ip6` (rtmsg's `encap_info` looks encodings up here)."""
    encaps = {**rtmsg.encaps, LWTUNNEL_ENCAP_IP6: _Ip6EncapInfo}


def _ip6_encap_dst(encap) -> IPv6Address | None:
    """LWTUNNEL_IP6_DST of a dumped `encap ip6` (pyroute2 hands it over as colon-separated hex)."""
    data = bytes.fromhex(encap.replace(":", "")) if isinstance(encap, str) else b""
    offset = 0
    while offset + 4 <= len(data):
        length, kind = struct.unpack_from("=HH", data, offset)
        if length < 4:
            break
        if kind & 0x3FFF == LWTUNNEL_IP6_DST and length >= 20:
            return IPv6Address(data[offset + 4:offset + 20])
        offset += (length + 3) & ~3
    return None


class IfGone(enum.Enum):
    RAISE = "raise"
    SUCCEED = "succeed"  # deletes: the object being absent already is the goal


class NetlinkKernel(RoutingKernel):
    def __init__(self, *, protocol: int = ROUTE_PROTOCOL) -> None:
        self.protocol = protocol
        self._netns_fd = os.open(namespaces.THREAD_NETNS, os.O_RDONLY | os.O_CLOEXEC)
        self._netns_identity = namespaces.identity(self._netns_fd)
        self._ipr = IPRoute()
        self._ethtool = IoctlEthtool()
        self._rtnl = RtnlSocket()  # the per-peer writes (rtnl.py)
        self._address_events = AddressEvents()
        self._indexes: dict[str, int] = {}

    @classmethod
    def in_namespace(cls, name: str, *, protocol: int = ROUTE_PROTOCOL) -> "NetlinkKernel":
        """A kernel object of the named network namespace (built inside it, so bound to it)."""
        fd = os.open(namespaces.netns_path(name), os.O_RDONLY | os.O_CLOEXEC)
        try:
            with namespaces.entered(fd):
                return cls(protocol=protocol)
        finally:
            os.close(fd)

    def close(self) -> None:
        self._ipr.close()
        self._ethtool.close()
        self._rtnl.close()
        self._address_events.close()
        os.close(self._netns_fd)

    def __enter__(self) -> "NetlinkKernel":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ------------------------------------------------------------ plumbing
    @contextlib.contextmanager
    def _call(self, what: str, *, ifname: str | None = None, if_gone: IfGone = IfGone.RAISE):
        """Translate netlink errors; forget a vanished device's index; maybe accept "already gone"."""
        try:
            yield
        except (NetlinkError, KernelError) as exc:
            if exc.code == errno.ENODEV and ifname is not None:
                self._indexes.pop(ifname, None)
            if if_gone is IfGone.SUCCEED and exc.code in _GONE:
                return
            if isinstance(exc, KernelError):
                raise
            raise kernel_error(exc.code, f"{what}: {exc.args[1] if len(exc.args) > 1 else exc}") from None

    def _index(self, ifname: str) -> int:
        index = self._indexes.get(ifname)
        if index is None:
            found = self._ipr.link_lookup(ifname=ifname)
            if not found:
                raise kernel_error(errno.ENODEV, f"no device {ifname}")
            index = self._indexes[ifname] = found[0]
        return index

    def _names_by_index(self) -> dict[int, str]:
        names = {link["index"]: link.get_attr("IFLA_IFNAME") for link in self._ipr.get_links()}
        self._indexes = {name: index for index, name in names.items()}
        return names

    # ------------------------------------------------------------ links
    @namespaces.in_own_netns
    def underlay_snapshot(self) -> UnderlaySnapshot:
        return read_underlay_snapshot(self._ipr)

    def addresses_changed(self) -> bool:
        """The kernel announced a link or address change since the last call (`rtnl.AddressEvents`)."""
        return self._address_events.changed()

    @namespaces.in_own_netns
    def links_with_prefix(self, prefix: str) -> dict[str, str]:
        found = {}
        for link in self._ipr.get_links():
            name = link.get_attr("IFLA_IFNAME")
            if name.startswith(prefix):
                found[name] = link.get_nested("IFLA_LINKINFO", "IFLA_INFO_KIND") or ""
        return found

    @namespaces.in_own_netns
    def delete_link(self, ifname: str) -> None:
        self._indexes.pop(ifname, None)
        with self._call(f"delete link {ifname}", if_gone=IfGone.SUCCEED):
            self._ipr.link("del", ifname=ifname)

    @namespaces.in_own_netns
    def observe(self, ifname: str) -> ObservedDevice | None:
        """The device as the kernel reports it, or None when there is none."""
        try:
            link = self._ipr.link("get", ifname=ifname)[0]
        except NetlinkError as exc:
            if exc.code == errno.ENODEV:
                return None
            raise kernel_error(exc.code, f"get link {ifname}") from None
        index = link["index"]
        self._indexes[ifname] = index
        kind = link.get_nested("IFLA_LINKINFO", "IFLA_INFO_KIND") or ""
        data = link.get_nested("IFLA_LINKINFO", "IFLA_INFO_DATA")
        addresses = frozenset(
            ip_interface(f"{a.get_attr('IFA_LOCAL') or a.get_attr('IFA_ADDRESS')}/{a['prefixlen']}")
            for family in (socket.AF_INET, socket.AF_INET6) for a in self._ipr.get_addr(family=family, index=index)
            if family == socket.AF_INET or a["scope"] == 0)  # IPv6 link-local: the kernel's, not ours
        common = dict(ifname=ifname, kind=kind, mtu=link.get_attr("IFLA_MTU"), up=bool(link["flags"] & IFF_UP),
                      addresses=addresses)
        if kind == "vxlan" and data is not None:
            underlay = data.get_attr("IFLA_VXLAN_LINK")
            local = data.get_attr("IFLA_VXLAN_LOCAL") or data.get_attr("IFLA_VXLAN_LOCAL6")
            return ObservedDevice(
                **common, mac=link.get_attr("IFLA_ADDRESS"), vni=data.get_attr("IFLA_VXLAN_ID"),
                port=data.get_attr("IFLA_VXLAN_PORT"), local=ip_address(local) if local else None,
                underlay_ifname=self._names_by_index().get(underlay) if underlay else None,
                learning=bool(data.get_attr("IFLA_VXLAN_LEARNING")), tx_checksum=self._tx_checksum(ifname))
        if kind == "ipip" and data is not None:
            local, remote = data.get_attr("IFLA_IPIP_LOCAL"), data.get_attr("IFLA_IPIP_REMOTE")
            return ObservedDevice(**common, local=ip_address(local) if local else None,
                                  remote=ip_address(remote) if remote else None)
        if kind == "ip6tnl" and data is not None:  # the kernel sends the flag only when it is set
            return ObservedDevice(**common, proto=data.get_attr("IFLA_IP6TNL_PROTO"),
                                  external=any(name == "IFLA_IP6TNL_COLLECT_METADATA" for name, _ in data["attrs"]))
        return ObservedDevice(**common)

    @namespaces.in_own_netns
    def ensure_vxlan(self, device: VxlanDevice) -> DeviceChange:
        local = {"vxlan_local6" if IpFamily.V6.holds(device.local) else "vxlan_local": str(device.local)}

        def create() -> None:
            self._ipr.link("add", ifname=device.ifname, kind="vxlan", vxlan_id=device.vni,
                           vxlan_link=self._index(device.underlay_ifname),
                           vxlan_port=device.port, vxlan_learning=0, address=device.mac, mtu=device.mtu, **local)
        return self._ensure(device, create)

    @namespaces.in_own_netns
    def ensure_ipip(self, device: IpipDevice) -> DeviceChange:
        def create() -> None:
            # NBMA: a local address and no remote; each route's gateway is the outer destination
            if device.kind == "ipip":
                self._ipr.link("add", ifname=device.ifname, kind="ipip", ipip_local=str(device.local),
                               mtu=device.mtu)
            else:  # ip6tnl external mode ip6ip6: each route carries its outer destination (routing/ipip.py)
                try:
                    self._ipr.link("add", ifname=device.ifname, kind="ip6tnl", ip6tnl_collect_metadata=True,
                                   ip6tnl_proto=IPPROTO_IPV6, mtu=device.mtu)
                except NetlinkError as exc:
                    if exc.code != errno.EEXIST:
                        raise
                    raise kernel_error(errno.EEXIST, (
                        f"another external ip6tnl device already exists in this network namespace (the "
                        f"kernel allows one): ipip for IPv6 needs {device.ifname} to be it; remove the "
                        f"other device or route IPv6 pods with vxlan or host-gw")) from None
        return self._ensure(device, create)

    def _ensure(self, device, create) -> DeviceChange:
        observed = self.observe(device.ifname)
        drift = device_drift(device, observed)
        if not drift:
            return DeviceChange.UNCHANGED
        emptied = drift.empties_device
        if drift.recreate:
            if observed is not None:
                log.warning("recreating %s: %s", device.ifname, drift.recreate)
                self.delete_link(device.ifname)
            with self._call(f"create {describe(device)}"):
                create()
            drift = device_drift(device, self.observe(device.ifname))
        else:
            log.info("repairing %s: %s", device.ifname, drift)
        if drift:
            self._repair(device.ifname, drift)
        return DeviceChange.EMPTIED if emptied else DeviceChange.REPAIRED

    def _repair(self, ifname: str, drift) -> None:
        index = self._index(ifname)
        changes = {}
        if drift.mtu is not None:
            changes["mtu"] = drift.mtu
        if drift.mac is not None:
            changes["address"] = drift.mac
        if drift.bring_up:
            changes["state"] = "up"
        with self._call(f"set link {ifname}", ifname=ifname):
            if changes:
                self._ipr.link("set", index=index, **changes)
            for address in drift.remove_addresses:
                self._ipr.addr("del", index=index, address=str(address.ip), prefixlen=address.network.prefixlen)
            for address in drift.add_addresses:  # IPv6: no duplicate address detection (usable at once)
                nodad = {"flags": IFA_F_NODAD} if IpFamily.V6.holds(address) else {}
                self._ipr.addr("add", index=index, address=str(address.ip), prefixlen=address.network.prefixlen,
                               **nodad)
        if drift.tx_checksum is not None:
            self._set_tx_checksum(ifname, on=drift.tx_checksum)

    def _tx_checksum(self, ifname: str) -> bool | None:
        """Whether tx-checksum-ip-generic is on; None when the device cannot change it."""
        try:
            self._ethtool.change_ifname(ifname)
            features = self._ethtool.get_features()
        except OSError as exc:
            raise kernel_error(exc.errno or errno.EIO, f"ethtool features of {ifname}") from None
        if TX_CHECKSUM_FEATURE not in features or not features.is_available(TX_CHECKSUM_FEATURE):
            return None
        return features[TX_CHECKSUM_FEATURE]

    def _set_tx_checksum(self, ifname: str, *, on: bool) -> None:
        try:
            self._ethtool.change_ifname(ifname)
            features = self._ethtool.get_features()
            features[TX_CHECKSUM_FEATURE] = on
            self._ethtool.set_features(features)
        except Exception as exc:  # pyroute2 raises its own NotSupportedError besides OSError
            raise kernel_error(getattr(exc, "errno", None) or errno.EOPNOTSUPP,
                               f"ethtool -K {ifname} {TX_CHECKSUM_FEATURE} {'on' if on else 'off'}: {exc!r}") from None

    # ------------------------------------------------------------ routes
    @namespaces.in_own_netns
    def dump_routes(self, family: IpFamily = IpFamily.V4) -> list[Route]:
        names = self._names_by_index()
        routes = []
        any_address = "0.0.0.0" if family is IpFamily.V4 else "::"
        for msg in self._ipr.route("dump", family=_AF[family], table=MAIN_TABLE, proto=self.protocol):
            table = msg.get_attr("RTA_TABLE") or msg["table"]
            if table != MAIN_TABLE or msg["proto"] != self.protocol or msg["type"] != RTN_UNICAST:
                continue
            gateway = msg.get_attr("RTA_GATEWAY")
            encap = msg.get_attr("RTA_ENCAP") if msg.get_attr("RTA_ENCAP_TYPE") == LWTUNNEL_ENCAP_IP6 else None
            routes.append(Route(dst=ip_network(f"{msg.get_attr('RTA_DST') or any_address}/{msg['dst_len']}"),
                                gateway=ip_address(gateway) if gateway else None,
                                ifname=names.get(msg.get_attr("RTA_OIF"), ""),
                                onlink=bool(msg["flags"] & RTNH_F_ONLINK),
                                encap_dst=_ip6_encap_dst(encap) if encap is not None else None))
        return routes

    @namespaces.in_own_netns
    def replace_route(self, route: Route) -> None:
        with self._call(f"replace {describe(route)}", ifname=route.ifname):
            if route.encap_dst is not None:
                self._replace_encap_route(route)
                return
            self._rtnl.replace_route(dst=route.dst, gateway=route.gateway, oif=self._index(route.ifname),
                                     onlink=route.onlink, protocol=self.protocol, table=MAIN_TABLE,
                                     what=f"replace {describe(route)}")

    def _replace_encap_route(self, route: Route) -> None:
        """`route replace <dst> encap ip6 dst <encap_dst> dev <ifname>`, built by hand: pyroute2's
        request layer knows the mpls, seg6 and bpf encapsulations only."""
        msg = _EncapRouteMsg()
        msg["family"], msg["dst_len"], msg["table"] = _AF[IpFamily.of(route.dst)], route.dst.prefixlen, MAIN_TABLE
        msg["proto"], msg["type"] = self.protocol, RTN_UNICAST
        msg["attrs"] = [("RTA_DST", str(route.dst.network_address)), ("RTA_OIF", self._index(route.ifname)),
                        ("RTA_TABLE", MAIN_TABLE), ("RTA_ENCAP_TYPE", LWTUNNEL_ENCAP_IP6),
                        ("RTA_ENCAP", {"attrs": [("LWTUNNEL_IP6_DST", str(route.encap_dst))]})]
        # put + get, not nlm_request: pyroute2 0.9.7's synchronous nlm_request fails (KeyError 'nlm_generator')
        request = self._ipr.put(msg, RTM_NEWROUTE, NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_REPLACE)
        try:
            self._ipr.get(msg_seq=request.msg_seq)  # the ACK; an error raises NetlinkError
        finally:
            request.cleanup()  # its sequence number back to the pool

    @namespaces.in_own_netns
    def delete_route(self, route: Route) -> None:
        """Delete our route to `route.dst` (the kernel matches dst, table and our protocol only)."""
        with self._call(f"delete {describe(route)}", if_gone=IfGone.SUCCEED):
            self._rtnl.delete_route(dst=route.dst, protocol=self.protocol, table=MAIN_TABLE,
                                    what=f"delete {describe(route)}")

    # ------------------------------------------------------------ neighbours
    @namespaces.in_own_netns
    def dump_neighbours(self, ifname: str, family: IpFamily = IpFamily.V4) -> list[Neighbour]:
        try:
            index = self._index(ifname)
        except KernelError:
            return []
        with self._call(f"dump neighbours on {ifname}", ifname=ifname):
            return [Neighbour(address=ip_address(msg.get_attr("NDA_DST")), mac=msg.get_attr("NDA_LLADDR"),
                              ifname=ifname)
                    for msg in self._ipr.neigh("dump", ifindex=index, family=_AF[family])
                    if msg["ifindex"] == index and msg["state"] & NUD_PERMANENT
                    and msg.get_attr("NDA_DST") and msg.get_attr("NDA_LLADDR")]

    @namespaces.in_own_netns
    def replace_neighbour(self, neighbour: Neighbour) -> None:
        with self._call(f"replace {describe(neighbour)}", ifname=neighbour.ifname):
            self._rtnl.replace_neighbour(ifindex=self._index(neighbour.ifname), address=neighbour.address,
                                         mac=neighbour.mac, what=f"replace {describe(neighbour)}")

    @namespaces.in_own_netns
    def delete_neighbour(self, neighbour: Neighbour) -> None:
        with self._call(f"delete {describe(neighbour)}", ifname=neighbour.ifname, if_gone=IfGone.SUCCEED):
            self._rtnl.delete_neighbour(ifindex=self._index(neighbour.ifname), address=neighbour.address,
                                        what=f"delete {describe(neighbour)}")

    # ------------------------------------------------------------ FDB
    @namespaces.in_own_netns
    def dump_fdb(self, ifname: str) -> list[FdbEntry]:
        try:
            index = self._index(ifname)
        except KernelError:
            return []
        with self._call(f"dump FDB on {ifname}", ifname=ifname):
            return [FdbEntry(mac=msg.get_attr("NDA_LLADDR"), dst=ip_address(msg.get_attr("NDA_DST")),
                             ifname=ifname)
                    for msg in self._ipr.fdb("dump", ifindex=index)
                    if msg["ifindex"] == index and msg["flags"] & NTF_SELF and msg.get_attr("NDA_DST")]

    @namespaces.in_own_netns
    def replace_fdb(self, entry: FdbEntry) -> None:
        with self._call(f"replace {describe(entry)}", ifname=entry.ifname):
            self._rtnl.replace_fdb(ifindex=self._index(entry.ifname), mac=entry.mac, dst=entry.dst,
                                   what=f"replace {describe(entry)}")

    @namespaces.in_own_netns
    def delete_fdb(self, entry: FdbEntry) -> None:
        """Delete the MAC's whole entry on the device (every destination it has)."""
        with self._call(f"delete {describe(entry)}", ifname=entry.ifname, if_gone=IfGone.SUCCEED):
            self._rtnl.delete_fdb(ifindex=self._index(entry.ifname), mac=entry.mac, what=f"delete {describe(entry)}")
