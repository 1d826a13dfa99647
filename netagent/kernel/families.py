"""The IP family: the one vocabulary every layer uses to say IPv4 or IPv6.

Dual-stack is two independent dataplanes side by side, as kube-proxy runs one proxier per
family: each component is built once per family of the cluster and handed its `IpFamily`.
This enum is the only place the per-family spellings live (iptables' binary, nft's table
family, ipset's family, the address width), so no module compares `version == 4` on its own:
`IpFamily.of(x)` names the family of an address or network (text included: never guessed from
a `":"`), `family.holds(x)` says whether `x` is of this family.
"""
from __future__ import annotations

import enum
import functools
import ipaddress
import socket


class IpFamily(enum.Enum):
    V4 = 4
    V6 = 6

    @property
    def command(self) -> str:
        """The iptables binary of this family."""
        return "iptables" if self is IpFamily.V4 else "ip6tables"

    @property
    def nft(self) -> str:
        """nft's table family (`ip`, `ip6`)."""
        return "ip" if self is IpFamily.V4 else "ip6"

    @property
    def nft_address_type(self) -> str:
        """nft's address datatype (`ipv4_addr`, `ipv6_addr`)."""
        return "ipv4_addr" if self is IpFamily.V4 else "ipv6_addr"

    @property
    def ipset(self) -> str:
        """ipset's `family` option (`inet`, `inet6`)."""
        return "inet" if self is IpFamily.V4 else "inet6"

    @property
    def label(self) -> str:
        """The Kubernetes spelling (`ipFamilies`, EndpointSlice `addressType`)."""
        return "IPv4" if self is IpFamily.V4 else "IPv6"

    @property
    def max_prefix(self) -> int:
        return 32 if self is IpFamily.V4 else 128

    @classmethod
    def of(cls, value: str | ipaddress.IPv4Address | ipaddress.IPv6Address
           | ipaddress.IPv4Network | ipaddress.IPv6Network) -> IpFamily:
        """The family of an address or network (text: an address, else a network; ValueError
        when it is neither)."""
        if isinstance(value, str):
            return _of_text(value)
        return cls(value.version)

    def holds(self, value: str | ipaddress.IPv4Address | ipaddress.IPv6Address
              | ipaddress.IPv4Network | ipaddress.IPv6Network | ipaddress.IPv4Interface
              | ipaddress.IPv6Interface) -> bool:
        """Whether the address or network `value` is of this family (text as for `of`)."""
        if isinstance(value, str):
            return IpFamily.of(value) is self
        return value.version == self.value

    @classmethod
    def from_label(cls, label: str) -> IpFamily:
        """`IPv4` / `IPv6` (ValueError otherwise)."""
        for family in cls:
            if family.label == label:
                return family
        raise ValueError(f"unknown IP family {label!r} (IPv4 or IPv6)")


@functools.lru_cache(maxsize=1 << 16)
def _of_text(text: str) -> IpFamily:
    """`IpFamily.of` for text, parsed once per spelling (set members and pod IPs recur every
    sync). The common forms (`address`, `address/prefix`) are parsed by `inet_pton`, many times
    faster than `ipaddress` at 10^5 values a sync; anything else (a netmask, a scope id, an
    error) is left to `ipaddress`, so the answer and the ValueError are `ipaddress`'s."""
    address, slash, prefix = text.partition("/")
    for family, af in ((IpFamily.V4, socket.AF_INET), (IpFamily.V6, socket.AF_INET6)):
        try:
            socket.inet_pton(af, address)
        except (OSError, ValueError):
            continue
        if not slash or (prefix.isascii() and prefix.isdigit() and int(prefix) <= family.max_prefix):
            return family
        break
    try:
        value: ipaddress.IPv4Address | ipaddress.IPv6Address | ipaddress.IPv4Network | ipaddress.IPv6Network = \
            ipaddress.ip_address(text)
    except ValueError:
        value = ipaddress.ip_network(text, strict=False)
    return IpFamily(value.version)
