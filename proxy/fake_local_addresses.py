"""`FakeLocalAddresses`: the `LocalAddresses` seam in memory, links and their addresses (both families)
held as a test sets them (an address added or removed between syncs, a link that goes)."""
from __future__ import annotations

import ipaddress
from collections.abc import Mapping

from netagent.kernel.families import IpFamily
from proxy.local_addresses import LocalAddresses


class FakeLocalAddresses(LocalAddresses):
    def __init__(self, links: Mapping[str, tuple[str, ...]] | None = None) -> None:
        self.links: dict[str, list[str]] = {name: list(addresses) for name, addresses in (links or {}).items()}
        self.reads = 0

    def add(self, link: str, address: str) -> None:
        """Like `ip addr add`: the address must be an IP address and not yet on the link."""
        ipaddress.ip_address(address)
        held = self.links.setdefault(link, [])
        if address in held:
            raise FileExistsError(f"{address} is already on {link}")
        held.append(address)

    def remove(self, link: str, address: str) -> None:
        held = self.links.get(link, [])
        if address not in held:
            raise FileNotFoundError(f"{address} is not on {link}")
        held.remove(address)

    def by_link(self, family: IpFamily = IpFamily.V4) -> Mapping[str, tuple[str, ...]]:
        self.reads += 1
        return {name: tuple(a for a in addresses if IpFamily.of(a) is family)
                for name, addresses in self.links.items()}
