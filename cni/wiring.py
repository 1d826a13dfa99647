"""Pod wiring: the veth pair, the pod side, and the node side in bridge or routed mode.

Shape of an attachment:
- A veth pair created in one netlink request, its pod end born inside the pod's namespace
  already named `CNI_IFNAME`, both MACs chosen by us (so no read-back is needed).
- The host end's name is derived from (network, container ID, ifname): `na` + 12 hex
  digits. DEL therefore needs neither the netns nor any saved state, and GC can tell which
  host veths belong to still-valid attachments. The alias `netagent:<network>` scopes GC to
  one network.
- bridge mode: the host end joins a Linux bridge holding the gateway address (as the
  reference `bridge` plugin with `isGateway`); the pod's default route goes via it.
- routed mode (as Calico): no bridge; the pod address is a /32 (/128); the host end has
  the fixed MAC ee:ee:ee:ee:ee:ee and proxy ARP; the pod routes via the link-local
  gateway 169.254.1.1 (fe80::ecee:eeff:feee:eeee), pinned by a permanent neighbour entry
  so the first packet needs no ARP round trip; the node routes the pod address to the veth.

Every function here is a kernel write or read; the linear ADD with rollback lives in
`cni.handlers`. The per-pod writes go through `cni.rtnl` (batched, no asyncio); bridge
set-up and inspection use pyroute2.
"""
from __future__ import annotations

import errno
import hashlib
import ipaddress
import os
import threading

from pyroute2 import NetlinkError

from cni import rtnl as rtnl_msg
from cni.errors import CniError, ErrorCode
from cni.netns import host_netlink as netns_host_netlink
from netagent.kernel import owned, sysctl
from netagent.kernel.sysctl import ProcSysctls, ensure_sysctls

HOST_VETH_PREFIX = owned.HOST_VETH_PREFIX
ALIAS_PREFIX = owned.VETH_ALIAS_PREFIX
BRIDGE_ALIAS = owned.BRIDGE_ALIAS
ROUTED_HOST_MAC = "ee:ee:ee:ee:ee:ee"
ROUTED_GATEWAY_V4 = ipaddress.ip_address("169.254.1.1")
ROUTED_GATEWAY_V6 = ipaddress.ip_address("fe80::ecee:eeff:feee:eeee")
LOOPBACK_INDEX = 1  # the kernel registers lo first in every namespace
_DEFAULT_DST = {4: "0.0.0.0/0", 6: "::/0"}

# Bridges already ensured by this process: (name, gateways) -> (index, mac). A stale entry
# is dropped when a later request finds the bridge gone.
_bridges: dict = {}
_bridges_lock = threading.Lock()
_forwarding_enabled: set = set()


def host_veth_name(network: str, container_id: str, ifname: str) -> str:
    digest = hashlib.sha256(f"{network}\0{container_id}\0{ifname}".encode()).hexdigest()
    return HOST_VETH_PREFIX + digest[:12]


def network_alias(network: str) -> str:
    return ALIAS_PREFIX + network


def random_mac() -> str:
    raw = bytearray(os.urandom(6))
    raw[0] = (raw[0] & 0xFE) | 0x02  # unicast, locally administered
    return ":".join(f"{b:02x}" for b in raw)


def _lookup(ipr, name: str) -> int | None:
    found = ipr.link_lookup(ifname=name)
    return found[0] if found else None


def _ignore_exists(call, *args, **kwargs) -> None:
    try:
        call(*args, **kwargs)
    except NetlinkError as exc:
        if exc.code != errno.EEXIST:
            raise


def enable_forwarding(family: int) -> None:
    """Turn on IP forwarding in the namespace this process runs in (the node's), once."""
    if family in _forwarding_enabled:
        return
    ensure_sysctls(ProcSysctls(), [sysctl.forwarding(family)])
    _forwarding_enabled.add(family)


def write_interface_sysctl(family: int, ifname: str, key: str, value: str) -> None:
    base = "/proc/sys/net/ipv4/conf" if family == 4 else "/proc/sys/net/ipv6/conf"
    with open(f"{base}/{ifname}/{key}", "w") as f:
        f.write(value)


# ---------------------------------------------------------------- bridge

def ensure_bridge(ipr, *, name: str, mtu: int, gateways: list) -> tuple[int, str]:
    """Create or repair the bridge with the gateway addresses; return (index, mac)."""
    key = (name, tuple(str(g) for g in gateways))
    with _bridges_lock:
        cached = _bridges.get(key)
    if cached is not None:
        return cached
    index = _lookup(ipr, name)
    if index is None:
        _ignore_exists(ipr.link, "add", ifname=name, kind="bridge", mtu=mtu, address=random_mac())
        index = _lookup(ipr, name)
        if index is None:
            raise CniError(ErrorCode.INTERNAL, f"bridge {name} vanished right after creation")
    link = ipr.get_links(index)[0]
    if link.get_nested("IFLA_LINKINFO", "IFLA_INFO_KIND") != "bridge":
        raise CniError(ErrorCode.INVALID_CONFIG, f"{name} exists and is not a bridge")
    ipr.link("set", index=index, state="up",
             **({"ifalias": BRIDGE_ALIAS} if link.get_attr("IFLA_IFALIAS") is None else {}))
    for gateway in gateways:
        _ignore_exists(ipr.addr, "add", index=index, address=str(gateway.ip),
                       prefixlen=gateway.network.prefixlen,
                       **({"flags": rtnl_msg.IFA_F_NODAD} if gateway.version == 6 else {}))
        enable_forwarding(gateway.version)
    mac = link.get_attr("IFLA_ADDRESS")
    with _bridges_lock:
        _bridges[key] = (index, mac)
    return index, mac


def known_bridge_index(name: str) -> int | None:
    """The bridge's index if this process has ensured it already (no kernel call)."""
    with _bridges_lock:
        for key, (index, _) in _bridges.items():
            if key[0] == name:
                return index
    return None


def forget_bridge(name: str) -> None:
    with _bridges_lock:
        for key in [k for k in _bridges if k[0] == name]:
            del _bridges[key]


# ---------------------------------------------------------------- veth

def create_veth(rtnl, *, host_name: str, pod_ifname: str, netns_fd: int, mtu: int,
                host_mac: str, pod_mac: str, alias: str, master: int | None = None) -> bool:
    """Create the pair with the pod end inside the pod; return True if enslaved to `master`.

    One write: the creation (host end enslaved to an already-known bridge) and the alias,
    which the kernel ignores at creation and so takes as a second message. A stale bridge
    index (the bridge was replaced) costs one retry without it.
    """
    def create(with_master):
        rtnl.batch([rtnl_msg.new_veth(name=host_name, peer_name=pod_ifname, peer_netns_fd=netns_fd,
                                      mtu=mtu, mac=host_mac, peer_mac=pod_mac, master=with_master),
                    rtnl_msg.set_link(name=host_name, alias=alias)])

    try:
        try:
            create(master)
            return master is not None
        except NetlinkError as exc:
            if master is None or exc.code not in (errno.ENODEV, errno.EINVAL, errno.EOPNOTSUPP):
                raise
            delete_link(rtnl, host_name)
            create(None)
            return False
    except NetlinkError as exc:
        if exc.code != errno.EEXIST:
            raise
        if rtnl.link_index(host_name) is not None:
            raise CniError(ErrorCode.INTERFACE_EXISTS, f"host interface {host_name} already exists",
                           "an earlier ADD for this container and interface was not cleaned up "
                           "with DEL") from None
        raise CniError(ErrorCode.INTERFACE_EXISTS,
                       f"interface {pod_ifname} already exists in the container") from None


def delete_link(sock, name: str) -> bool:
    """Delete an interface by name (with an Rtnl or a pyroute2 socket); False if already gone."""
    try:
        if isinstance(sock, rtnl_msg.Rtnl):
            sock.batch([rtnl_msg.delete_link(name)])
        else:
            sock.link("del", ifname=name)
        return True
    except NetlinkError as exc:
        if exc.code in (errno.ENODEV, errno.ENOENT):
            return False
        raise


# ---------------------------------------------------------------- pod side

def pod_gateway(mode, family: int, ipam_gateway):
    if mode.value == "routed":
        return ROUTED_GATEWAY_V4 if family == 4 else ROUTED_GATEWAY_V6
    return ipam_gateway


def pod_prefixlen(mode, interface) -> int:
    if mode.value == "routed":
        return interface.max_prefixlen
    return interface.network.prefixlen


def configure_pod(pod_rtnl, *, ifname: str, mode, addresses: list, gateways: dict,
                  routes: list, host_mac: str) -> list:
    """Address the pod interface, bring it and lo up, add routes; return result routes.

    One lookup and one batched write. `addresses` are ip_interface values as IPAM returned
    them; `gateways` maps family to the IPAM gateway (or None); `routes` are the IPAM
    config's extra routes.
    """
    index = pod_rtnl.link_index(ifname)
    if index is None:
        raise CniError(ErrorCode.INTERNAL, f"{ifname} is missing in the pod right after creation")
    batch = [rtnl_msg.set_link(index=LOOPBACK_INDEX)]
    batch += [rtnl_msg.add_address(index=index, address=a.ip, prefixlen=pod_prefixlen(mode, a))
              for a in addresses]
    batch.append(rtnl_msg.set_link(index=index))

    result_routes = []
    for family in sorted({a.version for a in addresses}):
        gateway = pod_gateway(mode, family, gateways.get(family))
        if gateway is None:
            continue
        if mode.value == "routed":
            batch.append(rtnl_msg.add_route(dst=f"{gateway}/{gateway.max_prefixlen}", oif=index))
            batch.append(rtnl_msg.add_permanent_neighbour(index=index, address=gateway, mac=host_mac))
        batch.append(rtnl_msg.add_route(dst=_DEFAULT_DST[family], gateway=gateway, oif=index))
        result_routes.append({"dst": _DEFAULT_DST[family], "gw": str(gateway)})
    for route in routes:
        dst = ipaddress.ip_network(route["dst"], strict=False)
        if str(dst) == _DEFAULT_DST[dst.version]:
            continue  # already added above
        gw = route.get("gw") or pod_gateway(mode, dst.version, gateways.get(dst.version))
        batch.append(rtnl_msg.add_route(dst=dst, gateway=gw, oif=index))
        result_routes.append({"dst": str(dst), **({"gw": str(gw)} if gw else {})})
    pod_rtnl.batch(batch)
    return result_routes


# ---------------------------------------------------------------- host side

def attach_to_bridge(rtnl, *, host_name: str, bridge_index: int) -> None:
    rtnl.batch([rtnl_msg.set_link(name=host_name, master=bridge_index)])


def set_hairpin(host_name: str) -> None:
    ipr = netns_host_netlink()
    ipr.brport("set", index=ipr.link_lookup(ifname=host_name)[0], mode=1)


def route_to_pod(rtnl, *, host_name: str, addresses: list, pod_mac: str) -> None:
    """Routed mode: bring the host end up, answer ARP for the gateway, route the pod's /32.

    The pod's addresses are pinned to its MAC on the host end, as the gateway is pinned
    inside the pod: no ARP or neighbour discovery is needed in either direction.
    """
    for family in sorted({a.version for a in addresses}):
        enable_forwarding(family)
        if family == 4:
            write_interface_sysctl(4, host_name, "proxy_arp", "1")
    index = rtnl.link_index(host_name)
    batch = []
    for addr in addresses:
        batch.append(rtnl_msg.add_route(dst=f"{addr.ip}/{addr.max_prefixlen}", oif=index))
        batch.append(rtnl_msg.add_permanent_neighbour(index=index, address=addr.ip, mac=pod_mac))
    rtnl.batch(batch)


# ---------------------------------------------------------------- inspection (CHECK, GC)

def pod_state(pod_ipr, ifname: str) -> dict | None:
    """What the pod's interface looks like now: mac, addresses, routes; None if absent."""
    index = _lookup(pod_ipr, ifname)
    if index is None:
        return None
    link = pod_ipr.get_links(index)[0]
    addresses = {f"{a.get_attr('IFA_ADDRESS')}/{a['prefixlen']}" for a in pod_ipr.get_addr(index=index)}
    routes = set()
    for family in (2, 10):
        for r in pod_ipr.get_routes(family=family, oif=index, table=254):
            dst = r.get_attr("RTA_DST")
            dst = f"{dst}/{r['dst_len']}" if dst else _DEFAULT_DST[4 if family == 2 else 6]
            routes.add((str(ipaddress.ip_network(dst, strict=False)), r.get_attr("RTA_GATEWAY")))
    return {"index": index, "mac": link.get_attr("IFLA_ADDRESS"),
            "up": bool(link["flags"] & 1), "addresses": addresses, "routes": routes}


def host_state(ipr, host_name: str) -> dict | None:
    index = _lookup(ipr, host_name)
    if index is None:
        return None
    link = ipr.get_links(index)[0]
    routes = set()
    for family in (2, 10):
        for r in ipr.get_routes(family=family, oif=index, table=254):
            dst = r.get_attr("RTA_DST")
            if dst:
                routes.add(f"{dst}/{r['dst_len']}")
    return {"index": index, "master": link.get_attr("IFLA_MASTER"),
            "up": bool(link["flags"] & 1), "routes": routes}


def network_host_veths(ipr, network: str) -> list[str]:
    """Names of the host veths that carry this network's alias."""
    alias = network_alias(network)
    names = []
    for link in ipr.get_links():
        name = link.get_attr("IFLA_IFNAME") or ""
        if (name.startswith(HOST_VETH_PREFIX) and link.get_attr("IFLA_IFALIAS") == alias
                and link.get_nested("IFLA_LINKINFO", "IFLA_INFO_KIND") == "veth"):
            names.append(name)
    return names
