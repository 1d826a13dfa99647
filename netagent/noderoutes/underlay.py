"""Which interface and address this node uses to reach its peers (the underlay).

The choice matters more than anything else the agent makes: a wrong one routes every pod
packet into the void. So every rule here either picks exactly one interface or fails with
a message that lists what it saw and how to choose:

- `--iface NAME`: that interface; it must exist and hold an IPv4 address.
- `--iface-regex PATTERN`: the one interface whose name matches; several matches holding
  addresses is an error naming them all (no silent first pick).
- neither: the interface of the IPv4 default route (lowest metric); no default route is
  an error telling the user to pass `--iface`.
- the Node annotation `netagent.io/public-ip-overwrite` replaces the announced address
  (for nodes behind NAT or with several addresses); the interface is then the one that
  holds that address, or the one chosen above when none does.

The netlink reading is done once into an `UnderlaySnapshot` (`read_underlay_snapshot`, which
`RoutingKernel.underlay_snapshot` runs over `NetlinkKernel`'s socket; `FakeKernel` builds one
from its links), so the selection itself is pure and unit-tested.
"""
from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from netagent.errors import NetagentError


class UnderlayError(NetagentError):
    """No interface or address can be chosen without guessing."""


@dataclass(frozen=True)
class InterfaceInfo:
    name: str
    index: int
    mtu: int
    addresses: tuple[ipaddress.IPv4Interface, ...]  # primary first


@dataclass(frozen=True)
class UnderlaySnapshot:
    interfaces: tuple[InterfaceInfo, ...]
    default_route_ifindexes: tuple[int, ...]  # ordered by metric, best first


@dataclass(frozen=True)
class Underlay:
    ifname: str
    mtu: int
    public_ip: ipaddress.IPv4Address
    network: ipaddress.IPv4Network  # the connected prefix: peers inside it share our L2
    reason: str                     # how it was chosen, for the log
    behind_nat: bool = False        # the announced address is not on this node


def read_underlay_snapshot(ipr) -> UnderlaySnapshot:
    """Links, IPv4 addresses and default routes of the current namespace, via pyroute2."""
    addresses: dict[int, list] = {}
    for msg in ipr.get_addr(family=2):
        iface = ipaddress.IPv4Interface(f"{msg.get_attr('IFA_ADDRESS')}/{msg['prefixlen']}")
        secondary = bool(msg["flags"] & 0x01)  # IFA_F_SECONDARY
        addresses.setdefault(msg["index"], []).append((secondary, iface))
    interfaces = []
    for link in ipr.get_links():
        found = sorted(addresses.get(link["index"], []), key=lambda pair: pair[0])
        interfaces.append(InterfaceInfo(name=link.get_attr("IFLA_IFNAME"), index=link["index"],
                                        mtu=link.get_attr("IFLA_MTU") or 1500,
                                        addresses=tuple(iface for _, iface in found)))
    defaults = []
    for route in ipr.get_routes(family=2, table=254):
        if route["dst_len"] != 0:
            continue
        oif = route.get_attr("RTA_OIF")
        if oif is None:
            multipath = route.get_attr("RTA_MULTIPATH") or []
            oif = multipath[0]["oif"] if multipath else None
        if oif is not None:
            defaults.append((route.get_attr("RTA_PRIORITY") or 0, oif))
    return UnderlaySnapshot(interfaces=tuple(interfaces),
                            default_route_ifindexes=tuple(oif for _, oif in sorted(defaults)))


def _usable(info: InterfaceInfo) -> bool:
    return bool(info.addresses) and info.name != "lo"


def _from_interface(info: InterfaceInfo, reason: str) -> Underlay:
    if not info.addresses:
        raise UnderlayError(f"interface {info.name} ({reason}) has no IPv4 address")
    primary = info.addresses[0]
    return Underlay(ifname=info.name, mtu=info.mtu, public_ip=primary.ip, network=primary.network,
                    reason=reason)


def choose_underlay(snapshot: UnderlaySnapshot, *, iface: str | None = None,
                    iface_regex: str | None = None, public_ip_override: str | None = None) -> Underlay:
    """Pick the underlay by the rules in the module docstring; raise UnderlayError otherwise."""
    if iface and iface_regex:
        raise UnderlayError("give --iface or --iface-regex, not both")
    by_name = {info.name: info for info in snapshot.interfaces}
    chosen = _choose_interface(snapshot, by_name, iface=iface, iface_regex=iface_regex)
    if not public_ip_override:
        return chosen
    try:
        address = ipaddress.IPv4Address(public_ip_override)
    except ValueError as exc:
        raise UnderlayError(f"public-ip-overwrite annotation: {exc}") from None
    for info in snapshot.interfaces:
        for iface_address in info.addresses:
            if iface_address.ip == address:
                return Underlay(ifname=info.name, mtu=info.mtu, public_ip=address,
                                network=iface_address.network,
                                reason=f"{address} from the public-ip-overwrite annotation, held by {info.name}")
    return Underlay(ifname=chosen.ifname, mtu=chosen.mtu, public_ip=address,
                    network=ipaddress.IPv4Network(f"{address}/32"), behind_nat=True,
                    reason=f"{address} from the public-ip-overwrite annotation (not local: NAT), "
                           f"sent out of {chosen.ifname}")


def _choose_interface(snapshot: UnderlaySnapshot, by_name: dict, *, iface: str | None,
                      iface_regex: str | None) -> Underlay:
    if iface:
        if iface not in by_name:
            raise UnderlayError(f"--iface {iface}: no such interface (have: {', '.join(sorted(by_name))})")
        return _from_interface(by_name[iface], f"--iface {iface}")
    if iface_regex:
        try:
            pattern = re.compile(iface_regex)
        except re.error as exc:
            raise UnderlayError(f"--iface-regex {iface_regex!r}: {exc}") from None
        matches = [info for info in snapshot.interfaces if pattern.fullmatch(info.name) and _usable(info)]
        if not matches:
            raise UnderlayError(f"--iface-regex {iface_regex!r} matches no interface with an IPv4 address "
                                f"(have: {', '.join(sorted(by_name))})")
        if len(matches) > 1:
            raise UnderlayError(f"--iface-regex {iface_regex!r} matches {len(matches)} interfaces with "
                                f"addresses ({', '.join(i.name for i in matches)}); narrow it or use --iface")
        return _from_interface(matches[0], f"--iface-regex {iface_regex!r}")
    by_index = {info.index: info for info in snapshot.interfaces}
    for ifindex in snapshot.default_route_ifindexes:
        if ifindex in by_index:
            return _from_interface(by_index[ifindex], "the interface of the default route")
    raise UnderlayError("no IPv4 default route to pick the node's interface from; pass --iface or --iface-regex")
