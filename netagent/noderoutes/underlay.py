"""Which interface and address this node uses to reach its peers (the underlay).

The choice matters more than anything else the agent makes: a wrong one routes every pod
packet into the void. So every rule here either picks exactly one interface or fails with
a message that lists what it saw and how to choose:

- `--iface NAME`: that interface; it must exist and hold an address of every family the
  node's pod CIDRs have (IPv4: its primary address; IPv6: its first global address, never a
  link-local one, which no peer could use as a tunnel endpoint or next hop off-link).
- `--iface-regex PATTERN`: the one interface whose name matches; several matches holding
  addresses is an error naming them all (no silent first pick).
- neither: the interface of the IPv4 default route (lowest metric; on an IPv6-only node, of
  the IPv6 default route); no default route is an error telling the user to pass `--iface`.
- dual-stack: one interface carries both families; its IPv4 and IPv6 addresses are the
  node's two underlay addresses (`Underlay.public_ip` and `public_ipv6`).
- the Node annotation `netagent.io/public-ip-overwrite` replaces the announced address
  (for nodes behind NAT or with several addresses); the interface is then the one that
  holds that address, or the one chosen above when none does (an IPv6 value replaces the
  IPv6 address).

The netlink reading is done once into an `UnderlaySnapshot` (`read_underlay_snapshot`, which
`RoutingKernel.underlay_snapshot` runs over `NetlinkKernel`'s socket; `FakeKernel` builds one
from its links), so the selection itself is pure and unit-tested.
"""
from __future__ import annotations

import dataclasses
import ipaddress
import re
from dataclasses import dataclass

from netagent.errors import NetagentError
from netagent.kernel.families import IpFamily

IFA_F_SECONDARY = 0x01


class UnderlayError(NetagentError):
    """No interface or address can be chosen without guessing."""


@dataclass(frozen=True)
class InterfaceInfo:
    name: str
    index: int
    mtu: int
    addresses: tuple  # IPv4Interface, ...: primary first
    addresses6: tuple = ()  # IPv6Interface, ...: global scope only (no link-local), kernel order


@dataclass(frozen=True)
class UnderlaySnapshot:
    interfaces: tuple[InterfaceInfo, ...]
    default_route_ifindexes: tuple[int, ...]  # ordered by metric, best first
    default_route6_ifindexes: tuple[int, ...] = ()  # the IPv6 default routes', likewise


@dataclass(frozen=True)
class Underlay:
    """`public_ip`/`network`: the IPv4 underlay address and prefix (the IPv6 ones on an
    IPv6-only node); `public_ipv6`/`network6`: the IPv6 ones on a dual-stack or IPv6 node."""
    ifname: str
    mtu: int
    public_ip: ipaddress.IPv4Address | ipaddress.IPv6Address
    network: ipaddress.IPv4Network | ipaddress.IPv6Network  # the connected prefix: peers inside it share our L2
    reason: str                     # how it was chosen, for the log
    behind_nat: bool = False        # the announced address is not on this node
    public_ipv6: ipaddress.IPv6Address | None = None
    network6: ipaddress.IPv6Network | None = None

    def address_of(self, family: IpFamily) -> tuple | None:
        """(address, connected prefix) of `family`, or None when the underlay has none."""
        if family is IpFamily.V6 and self.public_ipv6 is not None:
            return self.public_ipv6, self.network6
        if family.holds(self.public_ip):
            return self.public_ip, self.network
        return None


def read_underlay_snapshot(ipr) -> UnderlaySnapshot:
    """Links, IPv4 and global IPv6 addresses and default routes of the current namespace, via pyroute2."""
    addresses: dict[int, list] = {}
    for msg in ipr.get_addr(family=2):
        iface = ipaddress.IPv4Interface(f"{msg.get_attr('IFA_ADDRESS')}/{msg['prefixlen']}")
        secondary = bool(msg["flags"] & IFA_F_SECONDARY)
        addresses.setdefault(msg["index"], []).append((secondary, iface))
    addresses6: dict[int, list] = {}
    for msg in ipr.get_addr(family=10):
        if msg["scope"] != 0:  # link-local (and host) scope: no peer can use it across a router
            continue
        flags = msg.get_attr("IFA_FLAGS") or msg["flags"]
        iface6 = ipaddress.IPv6Interface(f"{msg.get_attr('IFA_ADDRESS')}/{msg['prefixlen']}")
        addresses6.setdefault(msg["index"], []).append((bool(flags & 0x20), iface6))  # deprecated last
    interfaces = []
    for link in ipr.get_links():
        found = sorted(addresses.get(link["index"], []), key=lambda pair: pair[0])
        found6 = sorted(addresses6.get(link["index"], []), key=lambda pair: pair[0])
        interfaces.append(InterfaceInfo(name=link.get_attr("IFLA_IFNAME"), index=link["index"],
                                        mtu=link.get_attr("IFLA_MTU") or 1500,
                                        addresses=tuple(iface for _, iface in found),
                                        addresses6=tuple(iface for _, iface in found6)))
    return UnderlaySnapshot(interfaces=tuple(interfaces), default_route_ifindexes=_defaults(ipr, 2),
                            default_route6_ifindexes=_defaults(ipr, 10))


def _defaults(ipr, family: int) -> tuple[int, ...]:
    defaults = []
    for route in ipr.get_routes(family=family, table=254):
        if route["dst_len"] != 0:
            continue
        oif = route.get_attr("RTA_OIF")
        if oif is None:
            multipath = route.get_attr("RTA_MULTIPATH") or []
            oif = multipath[0]["oif"] if multipath else None
        if oif is not None:
            defaults.append((route.get_attr("RTA_PRIORITY") or 0, oif))
    return tuple(oif for _, oif in sorted(defaults))


_V4_ONLY = (IpFamily.V4,)


def _held(info: InterfaceInfo, family: IpFamily) -> tuple:
    return info.addresses if family is IpFamily.V4 else info.addresses6


def _usable(info: InterfaceInfo, families: tuple) -> bool:
    return info.name != "lo" and all(_held(info, family) for family in families)


def _from_interface(info: InterfaceInfo, reason: str, families: tuple) -> Underlay:
    for family in families:
        if not _held(info, family):
            what = "IPv4 address" if family is IpFamily.V4 else "global IPv6 address (link-local ones cannot be used)"
            raise UnderlayError(f"interface {info.name} ({reason}) has no {what}, and this node has an "
                                f"{family.label} pod CIDR")
    first = _held(info, families[0])[0]
    second = info.addresses6[0] if IpFamily.V6 in families and families[0] is IpFamily.V4 else None
    return Underlay(ifname=info.name, mtu=info.mtu, public_ip=first.ip, network=first.network, reason=reason,
                    public_ipv6=second.ip if second is not None else None,
                    network6=second.network if second is not None else None)


def choose_underlay(snapshot: UnderlaySnapshot, *, iface: str | None = None,
                    iface_regex: str | None = None, public_ip_override: str | None = None,
                    families: tuple = _V4_ONLY) -> Underlay:
    """Pick the underlay by the rules in the module docstring, holding an address of each of
    `families` (IPv4 first when both); raise UnderlayError otherwise."""
    if iface and iface_regex:
        raise UnderlayError("give --iface or --iface-regex, not both")
    if not families:
        raise UnderlayError("no IP family to choose an underlay address for")
    families = tuple(sorted(set(families), key=lambda f: f.value))
    by_name = {info.name: info for info in snapshot.interfaces}
    chosen = _choose_interface(snapshot, by_name, iface=iface, iface_regex=iface_regex, families=families)
    if not public_ip_override:
        return chosen
    try:
        address = ipaddress.ip_address(public_ip_override)
    except ValueError as exc:
        raise UnderlayError(f"public-ip-overwrite annotation: {exc}") from None
    family = IpFamily.of(address)
    if family not in families:
        raise UnderlayError(f"public-ip-overwrite annotation: {address} is {family.label}, and this node has "
                            f"no {family.label} pod CIDR")
    for info in snapshot.interfaces:
        for iface_address in _held(info, family):
            if iface_address.ip == address:
                return _overridden(chosen, family, address, iface_address.network, mtu=info.mtu, ifname=info.name,
                                   reason=f"{address} from the public-ip-overwrite annotation, held by {info.name}")
    return dataclasses.replace(_overridden(chosen, family, address, ipaddress.ip_network(address),
                                           mtu=chosen.mtu, ifname=chosen.ifname,
                                           reason=f"{address} from the public-ip-overwrite annotation (not local: "
                                                  f"NAT), sent out of {chosen.ifname}"), behind_nat=True)


def _overridden(chosen: Underlay, family: IpFamily, address, network, *, mtu: int, ifname: str,
                reason: str) -> Underlay:
    if family is IpFamily.V6 and chosen.public_ipv6 is not None:
        return dataclasses.replace(chosen, ifname=ifname, mtu=mtu, public_ipv6=address, network6=network,
                                   reason=reason)
    return dataclasses.replace(chosen, ifname=ifname, mtu=mtu, public_ip=address, network=network, reason=reason)


def _choose_interface(snapshot: UnderlaySnapshot, by_name: dict, *, iface: str | None,
                      iface_regex: str | None, families: tuple) -> Underlay:
    if iface:
        if iface not in by_name:
            raise UnderlayError(f"--iface {iface}: no such interface (have: {', '.join(sorted(by_name))})")
        return _from_interface(by_name[iface], f"--iface {iface}", families)
    if iface_regex:
        try:
            pattern = re.compile(iface_regex)
        except re.error as exc:
            raise UnderlayError(f"--iface-regex {iface_regex!r}: {exc}") from None
        matches = [info for info in snapshot.interfaces if pattern.fullmatch(info.name) and _usable(info, families)]
        if not matches:
            raise UnderlayError(f"--iface-regex {iface_regex!r} matches no interface with an "
                                f"{' and '.join(f.label for f in families)} address "
                                f"(have: {', '.join(sorted(by_name))})")
        if len(matches) > 1:
            raise UnderlayError(f"--iface-regex {iface_regex!r} matches {len(matches)} interfaces with "
                                f"addresses ({', '.join(i.name for i in matches)}); narrow it or use --iface")
        return _from_interface(matches[0], f"--iface-regex {iface_regex!r}", families)
    by_index = {info.index: info for info in snapshot.interfaces}
    defaults = snapshot.default_route_ifindexes if families[0] is IpFamily.V4 else snapshot.default_route6_ifindexes
    for ifindex in defaults:
        if ifindex in by_index:
            return _from_interface(by_index[ifindex], "the interface of the default route", families)
    raise UnderlayError(f"no {families[0].label} default route to pick the node's interface from; pass --iface "
                        f"or --iface-regex")
