"""The per-family spelling of the nftables service proxy's table (`ip netagent`, `ip6 netagent`).

Dual-stack runs one `NftablesProxy` per family, as kube-proxy runs one proxier per family; both
tables have the same maps, sets and chains under the same names (names.py), and differ only in
what this module spells: the table family and header keyword (`ip` / `ip6`: `ip6 daddr`,
`dnat ip6 to`), the address datatype (`ipv4_addr` / `ipv6_addr`), the loopback range NodePorts
never answer on, how an endpoint is written in a single DNAT (`[addr]:port` for IPv6), and so
the fixed maps and sets (`holders`: `model.Map` and `model.Set` declarations, which the table
read back is compared with).
Everything else (`fib daddr type local`, `masquerade`, `reject`: ICMPv6 port unreachable in the
ip6 table, TCP reset for TCP in both) is the same text in both tables.

`address()` is the one gate an address passes to reach the table's text: canonical, of this
family (an IPv6 address in the ip table, an IPv4 one or an IPv4-mapped IPv6 one in the ip6 table
is refused: `UnsafeNftText`, so the port is reported, never half-written; so is a scoped one).
"""
from __future__ import annotations

import functools
import ipaddress
import socket
from dataclasses import dataclass

from netagent.kernel.families import IpFamily
from netagent.kernel.nftables import text
from netagent.kernel.nftables.model import Map, Set
from proxy.large_sync import CANONICAL_IPV4
from proxy.nftables import names as N
from proxy.nftables.names import KeySpace, Role


@dataclass(frozen=True)
class Spelling:
    family: IpFamily

    @property
    def ip(self) -> str:
        """The table family and the network header keyword: `ip` or `ip6`."""
        return self.family.nft

    @property
    def addr_type(self) -> str:
        return self.family.nft_address_type

    @property
    def loopback(self) -> str:
        return "127.0.0.0/8" if self.family is IpFamily.V4 else "::1"

    @property
    def address_key(self) -> str:
        """The key of the address-keyed verdict maps, as a rule looks it up."""
        return f"{self.ip} daddr . meta l4proto . th dport"

    def address(self, value: str) -> str:
        """`value` as nft text if it is an address of this family (see the module docstring).
        A canonical dotted-decimal IPv4 address is taken as is, an IPv6 one goes through
        inet_pton/inet_ntop (parsing 200,000 addresses through `ipaddress` cost seconds of a
        10k-service sync); inet_ntop's form is the one libnftables lists, so a full sync
        compares equal strings. IPv6 text with a scope (`%eth0`) or an embedded IPv4 address
        (mapped, compatible) is refused: neither is a Service's or a pod's address."""
        if self.family is IpFamily.V4 and CANONICAL_IPV4.fullmatch(value):
            return value
        if self.family is IpFamily.V6:
            try:
                canonical = socket.inet_ntop(socket.AF_INET6, socket.inet_pton(socket.AF_INET6, value))
            except (OSError, TypeError, ValueError):
                canonical = ""
            if "." in canonical:
                raise text.UnsafeNftText(f"{canonical} embeds an IPv4 address: IPv4 traffic is the ip table's, "
                                         f"not the ip6 table's")
            if canonical:
                return canonical
        canonical = text.address(value)
        found = IpFamily.of(canonical)
        if found is not self.family:
            raise text.UnsafeNftText(f"{canonical} is {found.label}: the {self.ip} table holds "
                                     f"{self.family.label} only")
        if self.family is IpFamily.V6:   # valid to `ipaddress` only: a scope
            raise text.UnsafeNftText(f"{str(value)[:60]!r} is not an IPv6 address nft can hold (a scope?)")
        return canonical

    def network(self, value: str) -> str:
        """A CIDR of this family, canonical (host bits cleared)."""
        network = ipaddress.ip_network(value, strict=False)
        if network.version != self.family.value:
            raise text.UnsafeNftText(f"{network} is not {self.family.label}")
        return text.network(str(network))

    def of_family(self, value: str) -> bool:
        try:
            return IpFamily.of(value) is self.family
        except ValueError:
            return False

    def host_port(self, address: str, port: int | str) -> str:
        """`10.0.0.1:80`, `[fd00::1]:80`: a DNAT target, and the spelling of status."""
        return f"{address}:{port}" if self.family is IpFamily.V4 else f"[{address}]:{port}"

    def sort_key(self, address: str) -> bytes:
        """The address's bytes: endpoints in address order, in either family."""
        try:
            return socket.inet_pton(socket.AF_INET if self.family is IpFamily.V4 else socket.AF_INET6, address)
        except (OSError, TypeError, ValueError) as error:
            raise text.UnsafeNftText(f"{str(address)[:60]!r} is not an {self.family.label} address") from error

    # ---- the fixed maps and sets ---------------------------------------------------------------

    def endpoint_typeof(self, space: KeySpace, proto: str) -> str:
        """The endpoint maps: one per protocol, the data `typeof ip daddr . <proto> dport`. Measured
        with nft 1.0.6: a map whose data is `ip daddr . th dport` cannot be used by a rule added once
        the map is in the kernel ("conflicting protocols specified: ip vs. th"), and a protocol's
        `dport` there makes nft add `meta l4proto <proto>` to every rule using the map: so one map
        per protocol, and a balancing chain holds one dnat rule per protocol."""
        key = f"{self.ip} daddr . th dport" if space is KeySpace.ADDRESS else "th dport"
        return f"{key} . numgen random mod 1 : {self.ip} daddr . {proto} dport"

    @functools.cached_property
    def holders(self) -> tuple[Set | Map, ...]:
        """The fixed maps and sets, declared (no elements): what libnftables lists for each is its
        `key_type` and `value_type` (an endpoint map's `typeof` lists as
        `ipv4_addr . inet_service . integer : ipv4_addr . inet_service`)."""
        addr = self.addr_type
        entry, port = (addr, "inet_proto", "inet_service"), ("inet_proto", "inet_service")
        return (
            *(Map(holder, entry if holder in N.ADDRESS_KEYED else port, "verdict") for holder in N.VERDICT_MAPS),
            *(Map(N.endpoint_map(space, role, proto),
                  (addr, "inet_service", "integer") if space is KeySpace.ADDRESS else ("inet_service", "integer"),
                  f"{addr} . inet_service", typeof=self.endpoint_typeof(space, proto))
              for space in KeySpace for role in (Role.CLUSTER, Role.LOCAL) for proto in N.PROTOCOLS),
            Set(N.FIREWALL_IPS, entry),
            Set(N.FIREWALL_ALLOW, (*entry, addr), ("interval",)),
            Set(N.HAIRPIN, (addr, addr)),
            Set(N.IP_NAMES, entry),
            Set(N.NODEPORT_NAMES, port),
        )


@functools.cache
def spelling(family: IpFamily) -> Spelling:
    return Spelling(family)
