"""`Allocation`: what an IPAM ADD hands the main plugin, as values rather than result strings.

The builtin IPAM builds it from its leases (no text in between); a delegated plugin's result
is parsed into it once (`from_result`). The main plugin's handlers (cni/handlers.py) read the
addresses and gateways from it and render the CNI result's strings once; the IPAM-only plugin
(`netagent-ipam`) answers `to_result()`, the spec's `ips`/`routes`/`dns`.
"""
from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field

from netagent.kernel.families import IpFamily

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Interface = ipaddress.IPv4Interface | ipaddress.IPv6Interface


@dataclass(frozen=True)
class AllocatedIp:
    address: Interface          # the address with its subnet's prefix length
    gateway: Address | None


@dataclass(frozen=True)
class Allocation:
    ips: tuple[AllocatedIp, ...]
    routes: tuple[dict, ...] = ()
    dns: dict = field(default_factory=dict)

    def gateways(self) -> dict[IpFamily, Address]:
        """The first gateway of each IP family."""
        found: dict[IpFamily, Address] = {}
        for ip in self.ips:
            if ip.gateway is not None:
                found.setdefault(IpFamily.of(ip.address.ip), ip.gateway)
        return found

    def to_result(self) -> dict:
        ips = [{"address": str(ip.address), **({"gateway": str(ip.gateway)} if ip.gateway is not None else {})}
               for ip in self.ips]
        return {"ips": ips, "routes": [dict(route) for route in self.routes], "dns": self.dns}

    @classmethod
    def from_result(cls, result: dict) -> Allocation:
        """An IPAM result's `ips` (address, optional gateway), `routes` and `dns`; ValueError
        on an address that is not one."""
        ips = tuple(AllocatedIp(address=ipaddress.ip_interface(ip["address"]),
                                gateway=ipaddress.ip_address(ip["gateway"]) if ip.get("gateway") else None)
                    for ip in result.get("ips", []))
        return cls(ips=ips, routes=tuple(result.get("routes") or ()), dns=result.get("dns") or {})
